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
from launcher.views.render import console

EXIT_CANCELLED = 130


def _echo_line(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _echo_reason(job_id: str) -> None:
    """Say on stderr why a foreground job did not succeed, so nobody has to ask ``launch status``."""
    from launcher.store.db import Store

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
  launch status JOB --watch                            live progress of a detached job
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
@click.option("--skip-check", is_flag=True,
              help="Skip the checks beyond preflight: the nodes' versions compared (SSH) and the DeepSpeed config validated by DeepSpeed.")
def submit(job_file, cluster_file, overrides, dry_run, detach, as_json, skip_check):
    """Validate, plan, preflight and run JOB_FILE.

    In the foreground, logs stream with [node/rank] prefixes and the exit code
    is 0 only if the job succeeded; Ctrl-C cancels the job on every node. On a
    terminal a live view shows each node's stages (preflight, sync, setup, start)
    and then a progress bar (step, samples/s, slowest rank, peak memory, ETA) under
    the scrolling logs; on a pipe or in CI the output is plain lines.

    \b
    Examples:
      launch submit jobs/cifar10_convnet.yaml
      launch submit jobs/cifar10_convnet.yaml --set max_steps=20 --set batch.micro_batch=16
      launch submit jobs/bert_large_zero3.yaml --cluster examples/clusters/a800.yaml --dry-run --json
    """
    from launcher.run import orchestrate
    from launcher.views import render

    prepared = orchestrate.prepare(job_file, cluster_file, tuple(overrides))
    if dry_run:
        if as_json:
            click.echo(json.dumps(render.plan_json(prepared.plan), indent=2))
        else:
            click.echo(render.plan_text(prepared.plan))
        return
    quiet = as_json or detach
    view = None
    if not quiet and sys.stdout.isatty():
        from launcher.views.progress import open_progress

        view = open_progress(sys.stdout, max_steps=prepared.plan.max_steps, nnodes=prepared.plan.nnodes, plain=False)

    def recorded(job_id: str) -> None:
        if not quiet:
            click.echo(f"job {job_id}: {prepared.plan.nnodes} node(s) x {prepared.plan.nproc_per_node} on {prepared.cluster.name}", err=True)
        if view is not None:
            from launcher.store.db import Store

            view.attach(Store(), job_id)

    try:
        job_id, state = orchestrate.submit(
            prepared, detach=detach, echo=None if quiet else (view.log if view else _echo_line), on_recorded=recorded,
            run_check=not skip_check, warn=lambda text: click.echo(text, err=True),
            **({"stage": view.stage} if view else {}),
        )
    finally:
        if view is not None:
            view.close()
    if as_json:
        click.echo(json.dumps({"id": job_id, "state": state}))
    elif detach:
        click.echo(job_id)
        if state in ("FAILED", "CANCELLED"):  # a scheduler refused the job before --detach returned
            _echo_reason(job_id)
    else:
        click.echo(f"job {job_id}: {state}  (launch status {job_id})", err=True)
        if state != "SUCCEEDED":
            _echo_reason(job_id)
    if (not detach and state != "SUCCEEDED") or state in ("FAILED", "CANCELLED"):
        sys.exit(EXIT_CANCELLED if state == "CANCELLED" else 1)


@cli.command()
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="JSON: an object for JOB, else a list of objects.")
@click.option("--last", is_flag=True, help="The newest job, in detail.")
@click.option("--limit", type=int, default=50, show_default=True, help="Jobs listed, newest first (0: all).")
@click.option("--watch", "-w", is_flag=True,
              help="Follow JOB live until it ends: stages, log lines, a progress bar; exit code as submit's.")
def status(job, as_json, last, limit, watch):
    """Show jobs, or one JOB in detail (nodes, exit codes, metrics, first failure).

    JOB is a job id or a unique prefix of one. With --watch, JOB (a detached one, or one
    running in another terminal) is shown as a foreground submit shows it: stages while its
    nodes are prepared, its last log lines and then new ones, a progress bar with step,
    samples/s, the slowest rank, peak memory and ETA; plain lines on a pipe. It exits when
    the job ends: 0 SUCCEEDED, 1 FAILED, 130 CANCELLED. Ctrl-C stops watching, not the job.

    \b
    Examples:
      launch status
      launch status cifar10-convnet-3f2a1c9e
      launch status --last --watch
      launch status cifar10 --json | jq .metrics.samples_per_sec
    """
    from launcher.store.db import Store
    from launcher.views import render

    store = Store()
    if watch:
        _watch(store, job, last, as_json)
        return
    if last:
        newest = store.jobs(limit=1)
        if not newest:
            raise LaunchError("no jobs yet: try `launch submit jobs/cifar10_convnet.yaml`")
        job = newest[0]["id"]
    if job is not None:
        from launcher.run import stacks

        row = store.job(job)
        summary = render.job_summary(store, row)
        obj = render.job_object(row, summary, store.nodes(row["id"]))
        events = store.events(row["id"])
        kept = stacks.latest(store.run_dir(row["id"]))
        if as_json:
            click.echo(render.json_text({**obj, "events": events, "stacks": stacks.json_entries(kept) if kept else []}))
        else:
            out = console()
            for part in render.job_detail(obj, summary, events):
                out.print(part)
            if kept:
                from rich.text import Text

                for line in stacks.report_lines(kept):
                    out.print(Text(line))
        return
    jobs = [(r, render.job_summary(store, r)) for r in store.jobs(limit=limit or None)]
    if as_json:
        click.echo(render.json_text([render.job_object(r, summary) for r, summary in jobs]))
    elif not jobs:
        click.echo("no jobs yet: try `launch submit jobs/cifar10_convnet.yaml`")
    else:
        console().print(render.jobs_table(jobs))


def _watch(store, job: str | None, last: bool, as_json: bool) -> None:
    """`status --watch`: the live view until the job ends, then exit as submit does."""
    from launcher.views.watch import watch

    if as_json or not (job or last):
        raise click.UsageError("--watch follows one job: give JOB (or --last), without --json")
    if last:
        newest = store.jobs(limit=1)
        if not newest:
            raise LaunchError("no jobs yet: try `launch submit jobs/cifar10_convnet.yaml`")
        job = newest[0]["id"]
    try:
        row = watch(store, job, stream=sys.stdout)
    except KeyboardInterrupt:
        click.echo("stopped watching; the job goes on (`launch cancel` ends it)", err=True)
        sys.exit(EXIT_CANCELLED)
    click.echo(f"job {row['id']}: {row['state']}", err=True)
    if row["state"] != "SUCCEEDED":
        if row.get("reason"):
            click.echo(f"  reason: {row['reason']}", err=True)
        sys.exit(EXIT_CANCELLED if row["state"] == "CANCELLED" else 1)


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
    from launcher.plan import fit
    from launcher.run import orchestrate
    from launcher.views import render

    prepared = orchestrate.prepare(job_file, cluster_file, tuple(overrides), check_fit=False)
    job, plan = prepared.job, prepared.plan
    if job.recipe is None:
        raise LaunchError("`launch plan` estimates memory for built-in recipes; an entrypoint job's model is unknown")
    chosen = plan.memory
    gpu_gb = chosen.gpu_memory_gib
    rows = fit.strategy_estimates(job, plan.batch.micro_batch, plan.nnodes, plan.nproc_per_node, gpu_gb)
    if as_json:
        click.echo(json.dumps({"plan": chosen.model_dump(mode="json"), "strategies": [r.__dict__ for r in rows]}, indent=2))
        return
    out = console()
    out.print(f"{job.name}: {job.recipe} on {plan.nnodes} node(s) x {plan.nproc_per_node}, {job.precision}, "
                  f"micro batch {plan.batch.micro_batch} (global {plan.batch.global_batch})")
    out.print(render.fit_table(rows, job.strategy, gpu_gb))
    out.print("  " + render.memory_line(chosen))
    if chosen.reason:
        out.print(f"  recommendation: {chosen.recommended or 'none fits'}: {chosen.reason}")


@cli.command()
@click.argument("job")
@click.option("--node", type=int, help="Only this node.")
@click.option("--rank", type=int, help="Only this global rank.")
@click.option("--attempt", type=int, help="Attempt (default: the latest).")
@click.option("--since", metavar="WHEN", help="Only lines written since: a duration back (30s, 10m, 2h, 1d) or an ISO time.")
@click.option("--tail", type=click.IntRange(min=0), metavar="N", help="Only the last N lines (after the other filters).")
@click.option("--grep", "pattern", metavar="REGEX", help="Only lines matching this regular expression (Python syntax), across all nodes.")
@click.option("--timestamps", "-t", is_flag=True, help="Show when each line was written (local time).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new lines until the job ends.")
def logs(job, node, rank, attempt, since, tail, pattern, timestamps, follow):
    """Print a job's logs, each line prefixed [node/rank], all nodes merged in time order.

    On a terminal the prefixes are coloured per rank (not on a pipe, nor with NO_COLOR set).
    Filters combine: --node, --rank, --since and --grep choose lines, then --tail keeps
    the last N of them; --follow then prints new matching lines until the job ends.

    \b
    Examples:
      launch logs cifar10-convnet-3f2a1c9e
      launch logs cifar10 --node 1 --rank 3 --follow
      launch logs cifar10 --grep 'NCCL|Traceback' --since 10m --timestamps
      launch logs cifar10 --tail 50 -f
    """
    import os
    import re

    from launcher.store.db import Store
    from launcher.views.logs import LogFormat, LogQuery, parse_since, print_logs

    try:
        compiled = re.compile(pattern) if pattern is not None else None
    except re.error as exc:
        raise click.BadParameter(f"{pattern!r} is not a regular expression: {exc}", param_hint="--grep") from None
    try:
        since_t = parse_since(since) if since is not None else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    query = LogQuery(node=node, rank=rank, attempt=attempt, since=since_t, pattern=compiled, tail=tail)
    fmt = LogFormat(colour=sys.stdout.isatty() and not os.environ.get("NO_COLOR"), timestamps=timestamps)
    print_logs(Store(), job, query, follow=follow, fmt=fmt, out=_echo_line)


@cli.command()
@click.argument("job")
def cancel(job):
    """Cancel JOB: end exactly its processes on every node; it ends CANCELLED.

    \b
    Examples:
      launch cancel cifar10-convnet-3f2a1c9e
      launch cancel cifar10                                         # a unique prefix of an id
      launch cancel "$(launch status --last --json | jq -r .id)"    # the newest job
    """
    from launcher.run.orchestrate import cancel as cancel_job
    from launcher.store.db import Store

    row = cancel_job(Store(), job)
    click.echo(f"job {row['id']}: {row['state']}")
    if row["state"] != "CANCELLED":
        sys.exit(1)


@cli.command("stacks")
@click.argument("job")
def stacks_command(job):
    """Every rank's Python stack on every node, now (py-spy on the nodes), grouped so the odd rank stands out.

    For a running job the stacks are taken now and kept with the job; for a finished one, the
    stacks taken before it was torn down (a hung or stalled job) are shown. py-spy must be
    installed beside the nodes' Python (the launch[train] extra has it).

    \b
    Examples:
      launch stacks cifar10-convnet-3f2a1c9e
      launch stacks cifar10                       (a unique prefix of the id is enough)
      launch status cifar10-convnet-3f2a1c9e --json | jq '.stacks[] | select(.rank == 3) | .stack'
    """
    from rich.text import Text

    from launcher.backends import get_backend
    from launcher.plan.planner import Plan
    from launcher.run import stacks
    from launcher.spec.cluster import ClusterSpec
    from launcher.store.db import Store
    from launcher.store.states import is_terminal

    store = Store()
    row = store.job(job)
    if is_terminal(row["state"]):
        report = stacks.latest(store.run_dir(row["id"]))
        if report is None:
            raise LaunchError(f"job {row['id']} ended {row['state']} and no stacks were taken; stacks are taken from "
                              "running jobs, and from hung or stalled ones before they are torn down")
    else:
        backend = get_backend(ClusterSpec.model_validate(row["spec"]["cluster"]))
        try:
            report = stacks.collect(backend, Plan.model_validate(row["plan"]), store, row["attempt"])
        finally:
            backend.close()
    out = console()
    for line in stacks.report_lines(report):
        out.print(Text(line))


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


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
def validate(files):
    """Check job and cluster specs (kind told by a 'backend:' key) without running anything.

    \b
    Examples:
      launch validate jobs/*.yaml cluster.yaml examples/clusters/*.yaml
      launch validate my_job.yaml        # each problem as file:line: field; exit 2
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
    Examples:
      launch schema job > job.schema.json
      launch schema cluster > cluster.schema.json
      # then, as the first line of a job file: # yaml-language-server: $schema=job.schema.json
    """
    from launcher.spec import ClusterSpec, JobSpec

    model = JobSpec if kind == "job" else ClusterSpec
    click.echo(json.dumps(model.model_json_schema(), indent=2))


# Commands defined in their own modules (each imports only click at module level).
# One import and one add_command line per command, in this block.
from launcher.cli.trust import trust  # noqa: E402

cli.add_command(trust)
from launcher.cli.init import init  # noqa: E402

cli.add_command(init)
from launcher.cli.metrics import bench as bench_command  # noqa: E402
from launcher.cli.metrics import compare as compare_command  # noqa: E402
from launcher.cli.metrics import metrics as metrics_command  # noqa: E402
from launcher.cli.metrics import report as report_command  # noqa: E402

cli.add_command(metrics_command)
cli.add_command(compare_command)
cli.add_command(bench_command)
cli.add_command(report_command)


def quiet_libraries() -> None:
    """Keep paramiko's own log records (its transport thread logs a whole traceback for a host that
    answers with something else than SSH) off the console: launch reports the problem in one line."""
    import logging

    paramiko_log = logging.getLogger("paramiko")
    paramiko_log.addHandler(logging.NullHandler())
    paramiko_log.propagate = False


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI, print LaunchErrors as one paragraph, exit with their code."""
    quiet_libraries()
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


# Shell completion: `launch completion SHELL`; every JOB argument completes job ids (keep this last).
from launcher.cli.completion import complete_job_arguments, completion  # noqa: E402

cli.add_command(completion)
complete_job_arguments(cli)
