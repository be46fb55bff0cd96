"""The commands about specs and clusters, not jobs: `launch check`, `validate`, `schema`.

Only click is imported at module level.
"""

from __future__ import annotations

import json
import sys

import click

from launcher.cli.output import CLUSTER_HELP
from launcher.errors import LaunchError
from launcher.views.render import console


@click.command()
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), help=CLUSTER_HELP)
@click.option("--port", type=int, help="Rendezvous port to check (default: the cluster's, else a free one).")
@click.option("--no-bandwidth", is_flag=True, help="Skip the all-reduce bandwidth job.")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
def check(cluster_file, port, no_bandwidth, as_json):
    """Is the cluster ready? Every node checked at once; exit 0 only if nothing blocks training.

    Reachability, python/torch/deepspeed/NCCL versions (differences between nodes flagged),
    driver and GPUs (count, free memory, processes already there), free disk in the workdir,
    clock skew (on short round trips of its own, the latency compensated: a warning only
    beyond 2 s plus their uncertainty), the rendezvous port free on node 0 and reachable from every node, and a
    short all-reduce across the nodes with its bus bandwidth.

    \b
    Examples:
      launch check --cluster examples/clusters/a800.yaml
      launch check --no-bandwidth --json
    """
    from launcher.run import check as checks
    from launcher.run.orchestrate import load_cluster_spec
    from launcher.run.ports import free_port

    cluster = load_cluster_spec(cluster_file)
    report = checks.run_check(cluster, port or cluster.rendezvous.port or free_port(), bandwidth=not no_bandwidth)
    if as_json:
        click.echo(json.dumps(checks.report_json(report), indent=2))
    else:
        out = console()
        out.print(checks.report_table(report))
        if report.bandwidth_gbps is not None:
            out.print(f"all-reduce bus bandwidth: {report.bandwidth_gbps:.2f} GB/s (job {report.bandwidth_job})")
        for warning in report.warnings:
            out.print(f"[yellow]warning:[/] {warning}")
        for problem in report.problems:
            out.print(f"[red]problem:[/] {problem}")
        out.print("[green]ready[/]" if report.ok else f"[red]not ready: {len(report.problems)} problem(s)[/]")
    if not report.ok:
        sys.exit(3)


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def validate(files):
    """Check job and cluster specs (kind told by a 'backend:' key) without running anything.

    \b
    Examples:
      launch validate jobs/*.yaml cluster.yaml examples/clusters/*.yaml
      launch validate my_job.yaml        # each problem as file:line: field; exit 2
    """
    from launcher.backends import load_cluster
    from launcher.spec.load import load_job

    failed = []
    for path in files:
        try:
            loader = load_cluster if _looks_like_cluster(path) else load_job
            loader(path)
            click.echo(f"ok    {path}")
        except LaunchError as exc:
            failed.append(exc)
            click.echo(f"error {exc}", err=True)
    if failed:
        sys.exit(failed[0].exit_code)


def _looks_like_cluster(path: str) -> bool:
    """A spec with a top-level 'backend:' key is a cluster; one that cannot be read is left to the job loader to report."""
    from launcher.spec.load import read_mapping

    try:
        return "backend" in read_mapping(path)
    except LaunchError:
        return False


@click.command()
@click.argument("kind", type=click.Choice(["job", "cluster"]))
def schema(kind):
    """Print the JSON Schema of a job or cluster spec (for editors' YAML support).

    \b
    Examples:
      launch schema job > job.schema.json
      launch schema cluster > cluster.schema.json
      # then, as the first line of a job file: # yaml-language-server: $schema=job.schema.json
    """
    if kind == "job":
        from launcher.spec.job import JobSpec

        found = JobSpec.model_json_schema()
    else:
        from launcher.backends import cluster_models

        found = cluster_models().json_schema()
    click.echo(json.dumps(found, indent=2))
