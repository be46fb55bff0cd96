"""The `launch` command line: parse, call, render. The one place errors become exit codes.

Heavy modules (torch, deepspeed, ray, and even pydantic for `status`) are
imported inside the commands that need them, so `launch --help` and
`launch status` stay fast.
"""

from __future__ import annotations

import json
import sys

import click

from launcher.errors import LaunchError
from launcher.render import console

EXIT_CANCELLED = 130


def _echo_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _echo_reason(job_id: str) -> None:
    """Say on stderr why a foreground job did not succeed, so nobody has to ask ``launch status``."""
    from launcher.store import Store

    reason = Store().job(job_id).get("reason")
    if reason:
        click.echo(f"  reason: {reason}", err=True)


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  launch submit jobs/cifar10_convnet.yaml            run on the local cluster, stream logs
  launch submit jobs/bert_large_zero3.yaml --cluster examples/clusters/a800.yaml --dry-run
  launch submit jobs/cifar10_convnet.yaml --set resources.nproc_per_node=4 --detach
  launch status                                        all jobs; `launch status JOB` for one
  launch logs JOB --node 1 --rank 3 --follow
  launch cancel JOB""",
)
@click.version_option(package_name="launch")
def cli() -> None:
    """Launch, watch and compare multi-node PyTorch training.

    A job spec (YAML) says what to train and how; a cluster spec (cluster.yaml,
    default: this machine) says where. `launch` validates both, plans the run
    (per-node torchrun/deepspeed command, rendezvous, batch arithmetic), checks
    every host, starts every node, streams logs, and keeps state, logs and
    metrics in a job store (~/.launch, or $LAUNCH_HOME).
    """


@cli.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), help="Cluster spec (default: ./cluster.yaml, else this machine).")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a job spec value; repeatable.")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop; contacts nothing.")
@click.option("--detach", is_flag=True, help="Print the job id and return; a supervisor runs the job to its end.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the plan with --dry-run).")
@click.option("--skip-check", is_flag=True, help="Skip the checks beyond preflight: the nodes' versions compared (SSH) and the DeepSpeed config validated by DeepSpeed.")
def submit(job_file, cluster_file, overrides, dry_run, detach, as_json, skip_check):
    """Validate, plan, preflight and run JOB_FILE.

    In the foreground, logs stream with [node/rank] prefixes and the exit code
    is 0 only if the job succeeded; Ctrl-C cancels the job on every node.

    \b
    Examples:
      launch submit jobs/cifar10_convnet.yaml
      launch submit jobs/cifar10_convnet.yaml --set max_steps=20 --set batch.micro_batch=16
      launch submit jobs/bert_large_zero3.yaml --cluster examples/clusters/a800.yaml --dry-run --json
    """
    from launcher import orchestrate, render

    prepared = orchestrate.prepare(job_file, cluster_file, tuple(overrides))
    if dry_run:
        if as_json:
            click.echo(json.dumps(render.plan_json(prepared.plan), indent=2))
        else:
            click.echo(render.plan_text(prepared.plan))
        return
    quiet = as_json or detach

    def recorded(job_id: str) -> None:
        if not quiet:
            click.echo(f"job {job_id}: {prepared.plan.nnodes} node(s) x {prepared.plan.nproc_per_node} on {prepared.cluster.name}", err=True)

    job_id, state = orchestrate.submit(
        prepared, detach=detach, echo=None if quiet else _echo_line, on_recorded=recorded,
        run_check=not skip_check, warn=lambda text: click.echo(text, err=True),
    )
    if as_json:
        click.echo(json.dumps({"id": job_id, "state": state}))
    elif detach:
        click.echo(job_id)
    else:
        click.echo(f"job {job_id}: {state}  (launch status {job_id})", err=True)
        if state != "SUCCEEDED":
            _echo_reason(job_id)
    if not detach and state != "SUCCEEDED":
        sys.exit(EXIT_CANCELLED if state == "CANCELLED" else 1)


@cli.command()
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="JSON: an object for JOB, else a list of objects.")
@click.option("--last", is_flag=True, help="The newest job, in detail.")
@click.option("--limit", type=int, default=50, show_default=True, help="Jobs listed, newest first (0: all).")
def status(job, as_json, last, limit):
    """Show jobs, or one JOB in detail (nodes, exit codes, metrics, first failure).

    JOB is a job id or a unique prefix of one.

    \b
    Examples:
      launch status
      launch status cifar10-convnet-3f2a1c9e
      launch status --last
      launch status cifar10 --json | jq .metrics.samples_per_sec
    """
    from launcher import render
    from launcher.store import TERMINAL, Store

    store = Store()
    if last:
        newest = store.jobs(limit=1)
        if not newest:
            raise LaunchError("no jobs yet: try `launch submit jobs/cifar10_convnet.yaml`")
        job = newest[0]["id"]
    if job:
        row = store.job(job)
        live = store.metrics(row["id"]) if row["state"] not in TERMINAL or not row.get("summary") else None
        obj = render.job_object(row, render.job_summary(row, live), store.nodes(row["id"]))
        events = store.events(row["id"])
        if as_json:
            click.echo(json.dumps({**obj, "events": events}, indent=2))
        else:
            out = console()
            for part in render.job_detail(obj, events):
                out.print(part)
        return
    rows = store.jobs(limit=limit or None)
    objects = [
        render.job_object(r, render.job_summary(r, store.metrics(r["id"]) if r["state"] not in TERMINAL else None))
        for r in rows
    ]
    if as_json:
        click.echo(json.dumps(objects, indent=2))
    elif not objects:
        click.echo("no jobs yet: try `launch submit jobs/cifar10_convnet.yaml`")
    else:
        console().print(render.jobs_table(objects))


@cli.command("plan")
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), help="Cluster spec (default: ./cluster.yaml, else this machine).")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a job spec value; repeatable.")
@click.option("--json", "as_json", is_flag=True, help="The estimates as JSON.")
def plan_command(job_file, cluster_file, overrides, as_json):
    """Will it fit? Per-GPU memory of a recipe job under every strategy, and the cheapest that fits.

    Model states follow DeepSpeed's estimator formulas (mixed-precision Adam: DDP 16 bytes a
    parameter, ZeRO-2 2 + 14/N, ZeRO-3 16/N, offload variants); activations are estimated
    for the recipe's micro batch and sequence length; the cluster's gpu.memory_gb is the limit.

    \b
    Examples:
      launch plan jobs/bert_large_zero3.yaml --cluster examples/clusters/a800.yaml
      launch plan jobs/gpt2_small_zero2.yaml --cluster examples/clusters/a800.yaml --set batch.micro_batch=32
    """
    from launcher import fit, orchestrate, render

    prepared = orchestrate.prepare(job_file, cluster_file, tuple(overrides), check_fit=False)
    job, plan = prepared.job, prepared.plan
    if job.recipe is None:
        raise LaunchError("`launch plan` estimates memory for built-in recipes; an entrypoint job's model is unknown")
    gpu_gb = plan.memory["gpu_memory_gib"]
    rows = fit.strategy_estimates(job, plan.batch.micro_batch, plan.nnodes, plan.nproc_per_node, gpu_gb)
    chosen = plan.memory
    if as_json:
        click.echo(json.dumps({"plan": chosen, "strategies": [r.__dict__ for r in rows]}, indent=2))
        return
    out = console()
    out.print(f"{job.name}: {job.recipe} on {plan.nnodes} node(s) x {plan.nproc_per_node}, {job.precision}, "
                  f"micro batch {plan.batch.micro_batch} (global {plan.batch.global_batch})")
    out.print(render.fit_table(rows, job.strategy, gpu_gb))
    out.print("  " + render.memory_line(chosen))
    if chosen.get("reason"):
        out.print(f"  recommendation: {chosen['recommended'] or 'none fits'}: {chosen['reason']}")


@cli.command()
@click.argument("job")
@click.option("--node", type=int, help="Only this node.")
@click.option("--rank", type=int, help="Only this global rank.")
@click.option("--attempt", type=int, help="Attempt (default: the latest).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the job ends.")
def logs(job, node, rank, attempt, follow):
    """Print a job's logs, each line prefixed [node/rank].

    \b
    Examples:
      launch logs cifar10-convnet-3f2a1c9e
      launch logs cifar10 --node 1 --rank 3 --follow
    """
    from launcher.logs import print_logs
    from launcher.store import Store

    print_logs(Store(), job, node=node, rank=rank, attempt=attempt, follow=follow, out=_echo_line)


@cli.command()
@click.argument("job")
def cancel(job):
    """Cancel JOB: end exactly its processes on every node; it ends CANCELLED.

    \b
    Example:
      launch cancel cifar10-convnet-3f2a1c9e
    """
    from launcher.orchestrate import cancel as cancel_job
    from launcher.store import Store

    row = cancel_job(Store(), job)
    click.echo(f"job {row['id']}: {row['state']}")
    if row["state"] != "CANCELLED":
        sys.exit(1)


@cli.command()
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), help="Cluster spec (default: ./cluster.yaml, else this machine).")
@click.option("--port", type=int, help="Rendezvous port to check (default: the cluster's, else a free one).")
@click.option("--no-bandwidth", is_flag=True, help="Skip the all-reduce bandwidth job.")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
def check(cluster_file, port, no_bandwidth, as_json):
    """Is the cluster ready? Every node checked at once; exit 0 only if nothing blocks training.

    Reachability, python/torch/deepspeed/NCCL versions (differences between nodes flagged),
    driver and GPUs (count, free memory, processes already there), free disk in the workdir,
    clock skew, the rendezvous port free on node 0 and reachable from every node, and a
    short all-reduce across the nodes with its bus bandwidth.

    \b
    Examples:
      launch check --cluster examples/clusters/a800.yaml
      launch check --no-bandwidth --json
    """
    from launcher import check as checks
    from launcher.backends.local import free_port
    from launcher.orchestrate import load_cluster_spec

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


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def validate(files):
    """Check job and cluster specs (kind told by a 'backend:' key) without running anything.

    \b
    Example:
      launch validate jobs/*.yaml cluster.yaml examples/clusters/*.yaml
    """
    from launcher.spec.load import load_cluster, load_job

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


@cli.command()
@click.argument("kind", type=click.Choice(["job", "cluster"]))
def schema(kind):
    """Print the JSON Schema of a job or cluster spec (for editors' YAML support).

    \b
    Example:
      launch schema job > job.schema.json
    """
    from launcher.spec import ClusterSpec, JobSpec

    model = JobSpec if kind == "job" else ClusterSpec
    click.echo(json.dumps(model.model_json_schema(), indent=2))


# Commands defined in their own modules (each imports only click at module level).
# One import and one add_command line per command, in this block.
from launcher.trust import trust  # noqa: E402
cli.add_command(trust)
from launcher.cli_metrics import bench as bench_command  # noqa: E402
from launcher.cli_metrics import compare as compare_command  # noqa: E402
from launcher.cli_metrics import metrics as metrics_command  # noqa: E402
from launcher.cli_metrics import report as report_command  # noqa: E402

cli.add_command(metrics_command)
cli.add_command(compare_command)
cli.add_command(bench_command)
cli.add_command(report_command)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI, print LaunchErrors as one paragraph, exit with their code."""
    try:
        cli.main(args=argv, prog_name="launch", standalone_mode=False)
    except LaunchError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_CANCELLED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(0)
