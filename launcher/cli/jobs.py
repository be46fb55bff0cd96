"""The commands about jobs in the store: `launch status`, `logs`, `cancel`, `stacks`.

Only click is imported at module level (`launch status` must stay light); the store, the views
and rich inside the commands. Everything stored that a rank could have written is shown through
``safe_text``.
"""

from __future__ import annotations

import sys

import click

from launcher.cli.output import EXIT_CANCELLED, echo_line, echo_reason, exit_for
from launcher.errors import LaunchError
from launcher.store.states import JobState, SupervisorState
from launcher.views.render import console
from launcher.views.terminal import safe_text


@click.command()
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="JSON: an object for JOB, else a list of objects.")
@click.option("--last", is_flag=True, help="The newest job, in detail.")
@click.option("--limit", type=int, default=50, show_default=True, help="Jobs listed, newest first (0: all).")
@click.option("--watch", "-w", is_flag=True,
              help="Follow JOB live until it ends (or its supervisor is found gone: `launch attach`): stages, log "
                   "lines, a progress bar; exit code as submit's.")
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
    from launcher.views import jobstatus, render

    store = Store()
    if watch:
        _watch(store, job, last, as_json)
        return
    if last:
        newest = store.jobs(limit=1)
        if not newest:
            raise LaunchError("no jobs yet: try `launch submit jobs/cifar10_convnet.yaml`")
        job = newest[0].id
    if job is not None:
        from launcher.run import stacks

        row = store.job(job)
        summary = jobstatus.job_summary(store, row)
        supervision = _supervision(store, row)
        if supervision is not None and supervision["state"] == SupervisorState.LOST:
            supervision["agents"] = _agents_left(store, row)
        obj = jobstatus.job_object(row, summary, store.nodes(row.id), supervision)
        events = store.events(row.id)
        kept = stacks.latest(store.run_dir(row.id))
        if as_json:
            verdict = _verdict_json(kept, row, events)
            click.echo(render.json_text({**obj, "events": events, "stacks": stacks.json_entries(kept) if kept else [],
                                         "verdict": verdict}))
        else:
            out = console()
            for part in jobstatus.job_detail(obj, summary, events):
                out.print(part)
            if kept:
                from rich.text import Text

                from launcher.run.verdict import verdict_lines

                for line in verdict_lines(kept, row, events):
                    out.print(Text(safe_text(line, colour=False)))
        return
    jobs = [(r, jobstatus.job_summary(store, r)) for r in store.jobs(limit=limit or None)]
    supervisors = {r.id: said for r, _ in jobs if (said := _supervision(store, r)) is not None}
    if as_json:
        click.echo(render.json_text([jobstatus.job_object(r, summary, supervisor=supervisors.get(r.id))
                                     for r, summary in jobs]))
    elif not jobs:
        click.echo("no jobs yet: try `launch submit jobs/cifar10_convnet.yaml`")
    else:
        console().print(jobstatus.jobs_table(jobs, supervisors))


def _verdict_json(kept, row, events) -> dict | None:
    """``status --json``'s ``verdict``: the stack classes, suspects and evidence of the kept stack report (None
    without one)."""
    if kept is None:
        return None
    from launcher.run.verdict import verdict_json

    return verdict_json(kept, row, events)


def _supervision(store, row) -> dict | None:
    """The ``supervisor`` of a job not ended (see ``identity.described``); None once it has ended."""
    from launcher.run import identity
    from launcher.store.states import is_terminal

    if is_terminal(row.state):
        return None
    said = identity.described(store.runs / row.id, row.id, row.supervisor_pid, row.supervisor_at)
    return said.as_json()


AGENTS_ASKED_S = 8  # how long `status JOB` waits for each node's answer about a job whose supervisor is gone


def _agents_left(store, row) -> dict | None:
    """For a job whose supervisor is gone (`status JOB` only): each node's agent still running or not, asked of
    the nodes (``{"running": [...], "ended": [...], "unknown": [...]}`` by node index); None where the backend
    keeps no generation record to ask (Slurm, Ray) or the job cannot be read back."""
    from launcher.backends import get_backend
    from launcher.run.recorded import RecordedJob

    try:
        job = RecordedJob.read(store, row.id)
        backend = get_backend(job.cluster)
    except Exception:  # noqa: BLE001 - status shows what the store says when the nodes cannot be asked
        return None
    try:
        if not backend.capabilities.fences:
            return None
        answers = backend.on_nodes(job.plan, lambda index: backend.fence(job.plan, index, job.id,
                                                                         timeout=AGENTS_ASKED_S)[0])
    finally:
        backend.close()
    said: dict[str, list[int]] = {"running": [], "ended": [], "unknown": []}
    for index, answer in enumerate(answers):
        gone = answer.get("agent_gone") if isinstance(answer, dict) else None
        said["unknown" if answer is None else "ended" if gone else "running"].append(index)
    return said


def _watch(store, job: str | None, last: bool, as_json: bool) -> None:
    """`status --watch`: the live view until the job ends, then exit as submit does."""
    from launcher.run.cancel import supervisor_gone
    from launcher.views.watch import watch

    if as_json or not (job or last):
        raise click.UsageError("--watch follows one job: give JOB (or --last), without --json")
    if last:
        newest = store.jobs(limit=1)
        if not newest:
            raise LaunchError("no jobs yet: try `launch submit jobs/cifar10_convnet.yaml`")
        job = newest[0].id
    try:
        row = watch(store, str(job), stream=sys.stdout, supervisor_gone=lambda job_id: supervisor_gone(store, job_id))
    except KeyboardInterrupt:
        click.echo("stopped watching; the job goes on (`launch cancel` ends it)", err=True)
        sys.exit(EXIT_CANCELLED)
    click.echo(f"job {row.id}: {row.state}", err=True)
    if row.state != JobState.SUCCEEDED:
        echo_reason(row.reason)
    exit_for(row.state)


@click.command()
@click.argument("job")
@click.option("--node", type=int, help="Only this node.")
@click.option("--rank", type=int, help="Only this global rank.")
@click.option("--attempt", type=int, help="Attempt (default: the latest).")
@click.option("--since", metavar="WHEN", help="Only lines written since: a duration back (30s, 10m, 2h, 1d) or an ISO time.")
@click.option("--tail", type=click.IntRange(min=0), metavar="N", help="Only the last N lines (after the other filters).")
@click.option("--grep", "pattern", metavar="REGEX", help="Only lines matching this regular expression (Python syntax), across all nodes.")
@click.option("--timestamps", "-t", is_flag=True, help="Show when each line was written (local time).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new lines until the job ends (or its supervisor is found gone: exit 1, `launch attach` resumes it).")
@click.option("--raw", is_flag=True,
              help="Lines as the ranks wrote them: no colour, control sequences not made visible (for files and tools).")
def logs(job, node, rank, attempt, since, tail, pattern, timestamps, follow, raw):
    """Print a job's logs, each line prefixed [node/rank], all nodes merged in time order.

    On a terminal the prefixes are coloured per rank (not on a pipe, nor with NO_COLOR set).
    A rank's own colours are kept; any other control sequence it wrote (titles, links, cursor
    moves) is shown as text, e.g. \\x1b]0;; --raw prints the lines as written.
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
    fmt = LogFormat(colour=sys.stdout.isatty() and not os.environ.get("NO_COLOR") and not raw, timestamps=timestamps,
                    raw=raw)
    from launcher.run.cancel import supervisor_gone

    store = Store()
    print_logs(store, job, query, follow=follow, fmt=fmt, out=echo_line,
               supervisor_gone=lambda job_id: supervisor_gone(store, job_id),
               say=lambda text: click.echo(safe_text(text, colour=False), err=True))
    if follow and not store.job(job).terminal:
        sys.exit(1)


@click.command()
@click.argument("job")
def cancel(job):
    """Cancel JOB: end exactly its processes on every node; it ends CANCELLED.

    \b
    Examples:
      launch cancel cifar10-convnet-3f2a1c9e
      launch cancel cifar10                                         # a unique prefix of an id
      launch cancel "$(launch status --last --json | jq -r .id)"    # the newest job
    """
    from launcher.run.cancel import cancel as cancel_job
    from launcher.store.db import Store

    row = cancel_job(Store(), job)
    click.echo(f"job {row.id}: {row.state}")
    if row.state != JobState.CANCELLED:
        sys.exit(1)


@click.command("stacks")
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

    from launcher.run import stacks
    from launcher.store.db import Store

    report = stacks.for_job(Store(), job)
    out = console()
    for line in stacks.report_lines(report):
        out.print(Text(safe_text(line, colour=False)))
