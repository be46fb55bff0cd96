"""`launch submit` and `launch plan`: a job file validated, planned, then run (or its memory estimated).

Only click is imported at module level; the orchestration, the store and rich inside the commands.
"""

from __future__ import annotations

import json
import shlex
import sys

import click

from launcher.cli.output import CLUSTER_HELP, cancel_question, echo_reason, echo_safe_line, exit_for
from launcher.errors import LaunchError, PreflightError, SpecError
from launcher.store.states import FailureKind, JobState
from launcher.views.render import console


@click.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), help=CLUSTER_HELP)
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE", help="Override a job spec value; repeatable.")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop; contacts nothing.")
@click.option("--detach", is_flag=True, help="Print the job id and return; a supervisor runs the job to its end.")
@click.option("--wait", "wait", is_flag=True,
              help="When another job holds the GPUs or slots, wait for them (QUEUED) instead of exiting 3 (queue: wait).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the plan with --dry-run).")
@click.option("--skip-check", is_flag=True,
              help="Skip the checks beyond preflight: the nodes' versions compared (SSH) and the DeepSpeed config validated by DeepSpeed.")
def submit(job_file, cluster_file, overrides, dry_run, detach, wait, as_json, skip_check):
    """Validate, plan, preflight and run JOB_FILE.

    In the foreground, logs stream with [node/rank] prefixes and the exit code
    is 0 only if the job succeeded. Only an explicit cancel ends the job: Ctrl-C
    asks "cancel the job? [y/N]" when stdin is a terminal (a second Ctrl-C is a
    yes) and cancels at once on a pipe or in CI; `launch cancel JOB` always. A
    closed terminal or SSH session (SIGHUP) never ends it: the supervisor goes on
    in the background and `launch attach JOB` brings the job back to a terminal. On a
    terminal a live view shows each node's stages (preflight, sync, setup, start)
    and then a progress bar (step, samples/s, slowest rank, peak memory, ETA) under
    the scrolling logs; on a pipe or in CI the output is plain lines.

    On local and SSH clusters every GPU (or CPU slot) is leased to one job at a
    time: if another job holds them, submit exits 3 naming the holder, or with
    --wait the job is QUEUED until they are free (docs/LEASES.md; `launch queue`).

    \b
    Examples:
      launch submit jobs/cifar10_convnet.yaml
      launch submit jobs/cifar10_convnet.yaml --set max_steps=20 --set batch.micro_batch=16
      launch submit jobs/bert_large_zero3.yaml --cluster examples/clusters/a800.yaml --dry-run --json
    """
    from launcher.run import orchestrate

    prepared = orchestrate.prepare(job_file, cluster_file, (*overrides, *(["queue=wait"] if wait else [])))
    _run(prepared, dry_run=dry_run, detach=detach, as_json=as_json, skip_check=skip_check)


@click.command()
@click.argument("job")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Override a value of the job's spec; repeatable.")
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False),
              help="Cluster spec to run it on (default: the cluster the job ran on, as stored).")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop; contacts nothing.")
@click.option("--detach", is_flag=True, help="Print the new job's id and return; a supervisor runs it to its end.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (the plan with --dry-run).")
@click.option("--skip-check", is_flag=True, help="Skip the checks beyond preflight (as submit's --skip-check).")
def resubmit(job, overrides, cluster_file, dry_run, detach, as_json, skip_check):
    """Run JOB again as a new job: the spec it was submitted with (its --set overrides applied), new --set on top.

    The store keeps every job's effective spec and its overrides (`launch status JOB --json`: `spec`,
    `overrides`; secrets are kept as names, their values read from your environment again). The new
    job is submitted as `launch submit` does and records which job it runs again (`resubmit_of`).

    \b
    Examples:
      launch resubmit cifar10-convnet-3f2a1c9e
      launch resubmit cifar10 --set batch.micro_batch=16 --set max_steps=200
      launch resubmit bert-large --cluster examples/clusters/a800.yaml --detach
    """
    from launcher.run.resubmit import prepare_again
    from launcher.store.db import Store

    prepared = prepare_again(Store(), job, tuple(overrides), cluster_file)
    _run(prepared, dry_run=dry_run, detach=detach, as_json=as_json, skip_check=skip_check)


def _run(prepared, *, dry_run: bool, detach: bool, as_json: bool, skip_check: bool) -> None:
    """A prepared job printed (dry run) or submitted, in the foreground or detached; exit as its end says."""
    from launcher.run import orchestrate
    from launcher.store.db import Store

    if dry_run:
        _print_plan(prepared, as_json)
        return
    found = _checkpoint_found(prepared)
    if found is not None and found[1] and not prepared.job.checkpoint.resume:
        raise SpecError(f"checkpoint.dir: {found[1]}")
    if found is not None:
        click.echo(f"checkpoint: {found[0]}", err=True)
    for text in prepared.plan.warnings:
        click.echo(f"warning: {text}", err=True)
    quiet, store = as_json or detach, Store()
    view = None if quiet else _open_view(prepared.plan)
    try:
        job_id, state = orchestrate.submit(
            prepared, detach=detach, echo=None if quiet else (view.log if view else echo_safe_line),
            on_recorded=_on_recorded(prepared, store, view, quiet), run_check=not skip_check, store=store,
            warn=lambda text: click.echo(text, err=True), **({"stage": view.stage} if view else {}),
            ask=None if detach else cancel_question(view.log if view else None),
        )
    finally:
        if view is not None:
            view.close()
    row = store.job(job_id)
    _tell_outcome(row, state, as_json=as_json, detach=detach)
    if state == JobState.FAILED and _lost_the_leases(row):
        sys.exit(PreflightError.exit_code)  # as when preflight finds them held: another job was quicker
    if detach:
        if state in (JobState.FAILED, JobState.CANCELLED):  # a scheduler refused the job before --detach returned
            exit_for(state)
    else:
        exit_for(state)


def _lost_the_leases(row) -> bool:
    """Whether the job found its GPUs or slots taken by another job between preflight and start (its stored
    failure kind, never its reason's words, which may quote a rank)."""
    return row.failure_kind == FailureKind.LEASES


def _checkpoint_found(prepared) -> tuple[str, str | None] | None:
    """A recipe job's ``checkpoint.dir`` that already holds a checkpoint (as this machine sees it): what the job would
    do with it, and why it is refused without ``checkpoint.resume`` (None: its own, or unrecorded)."""
    from launcher.catalog import checkpoints

    job = prepared.job
    directory = job.checkpoint.dir
    found = checkpoints.saved(directory) if job.recipe and directory else None
    if found is None:
        return None
    refused = checkpoints.refusal(directory, found, prepared.plan.job_id)
    if refused and not job.checkpoint.resume:
        return f"{found.describe(directory)}: refused unless checkpoint.resume: true", refused
    return f"{found.describe(directory)}: this job resumes from step {found.step}", refused


def _print_plan(prepared, as_json: bool) -> None:
    """`--dry-run`: the plan as text (with where its cluster came from and who is notified), or as JSON."""
    from launcher.views import render

    if as_json:
        click.echo(json.dumps(render.plan_json(prepared.plan), indent=2))
        return
    notes = [f"  {label:<11} {text}" for label, text in _plan_notes(prepared)]
    click.echo(render.plan_text(prepared.plan, notes))


def _plan_notes(prepared) -> list[tuple[str, str]]:
    """(label, text) about a prepared job beyond its plan: a cluster that is this machine because no file was
    found, and its notifiers (webhooks as written: a token is a ``${NAME}`` reference, never its value)."""
    from launcher.run.orchestrate import CLUSTER_LOOKUP

    notes = []
    if prepared.cluster_file is None:
        notes.append(("cluster", f"this machine: no --cluster, and none of {CLUSTER_LOOKUP} exists"))
    found = _checkpoint_found(prepared)
    if found is not None:
        notes.append(("checkpoint", found[0]))
    notify = prepared.job.notify
    if notify is not None:
        told = [f"webhook {url}" for url in notify.webhooks] + [f"command {shlex.join(argv)}" for argv in notify.commands]
        notes.append(("notify", f"on {', '.join(notify.on)}: {'; '.join(told) or 'nobody (no webhooks or commands)'}"))
    return notes


def _open_view(plan):
    """The live view on a terminal (stages, then a progress bar under the logs); on a pipe, plain lines: a line a
    stage change, the log lines, a ``[progress]`` summary now and then."""
    from launcher.views.progress import open_progress

    return open_progress(sys.stdout, max_steps=plan.max_steps, nnodes=plan.nnodes)


def _on_recorded(prepared, store, view, quiet: bool):
    """What to do once the job is in the store: say its id and shape, and point the live view at it."""

    def recorded(job_id: str) -> None:
        if not quiet:
            plan = prepared.plan
            from launcher.views.render import world_text

            local = ("" if prepared.cluster_file is not None
                     else " (this machine: no --cluster, and no cluster file in $LAUNCH_CLUSTER, $LAUNCH_HOME or here)")
            again = f", again as {prepared.origin.resubmit_of} was" if prepared.origin.resubmit_of else ""
            click.echo(f"job {job_id}: {world_text(plan)} on {prepared.cluster.name}{local}{again}", err=True)
        if view is not None:
            view.attach(store, job_id)

    return recorded


def _tell_outcome(row, state: JobState, *, as_json: bool, detach: bool) -> None:
    """The id and end state (JSON, the bare id for --detach, or a line on stderr), and why it failed (``row``: the
    job as stored now)."""
    job_id = row.id
    if as_json:
        click.echo(json.dumps({"id": job_id, "state": state}))
        return
    if detach:
        click.echo(job_id)
        if state not in (JobState.FAILED, JobState.CANCELLED):
            click.echo(f"watch it: launch status {job_id} --watch  (its logs: launch logs {job_id} --follow; "
                       f"stop it: launch cancel {job_id})", err=True)
            return
    else:
        click.echo(f"job {job_id}: {state}  (launch status {job_id})", err=True)
        if state == JobState.SUCCEEDED:
            return
    echo_reason(row.reason)


@click.command("plan")
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), help=CLUSTER_HELP)
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
    chosen, batch = plan.memory, plan.batch
    assert chosen is not None and batch is not None, "a recipe job's plan has its batch and memory estimate"
    gpu_gb = chosen.gpu_memory_gib
    rows = fit.strategy_estimates(job, batch.micro_batch, plan.nnodes, plan.nproc_per_node, gpu_gb)
    if as_json:
        click.echo(json.dumps({"plan": chosen.model_dump(mode="json"), "strategies": [r.__dict__ for r in rows]}, indent=2))
        return
    out = console()
    out.print(f"{job.name}: {job.recipe} on {render.world_text(plan)}, {job.precision}, "
                  f"micro batch {batch.micro_batch} (global {batch.global_batch})")
    if plan.elastic:
        out.print(f"  elastic: min_nodes {plan.elastic.min_nodes}: {plan.elastic.describe()}")
    for text in plan.warnings:
        out.print(f"  warning: {text}")
    out.print(render.fit_table(rows, job.strategy, gpu_gb))
    out.print("  " + render.memory_line(chosen))
    if chosen.reason:
        out.print(f"  recommendation: {chosen.recommended or 'none fits'}: {chosen.reason}")
