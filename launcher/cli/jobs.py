"""The commands about jobs in the store: `launch status`, `logs`, `cancel`, `stacks`.

Only click is imported at module level (`launch status` must stay light); the store, the views
and rich inside the commands. Everything stored that a rank could have written is shown through
``safe_text``.
"""

from __future__ import annotations

import sys

import click

from launcher.cli.output import EXIT_CANCELLED, echo_line, echo_reason, exit_for
from launcher.store.states import JobState
from launcher.views.render import console
from launcher.views.terminal import safe_text


@click.command()
@click.argument("job", required=False)
@click.option("--json", "as_json", is_flag=True, help="JSON: an object for JOB, else a list of objects.")
@click.option("--last", is_flag=True, help="The newest job, in detail.")
@click.option("--limit", type=int, default=50, show_default=True, help="Jobs listed, newest first (0: all).")
@click.option("--checks", is_flag=True, help="List the jobs `launch check` ran too (its all-reduce test, launch-check-*).")
@click.option("--events", "events", default="12", show_default=True, metavar="N|all",
              help="Events shown of one JOB: the last N, or all.")
@click.option("--watch", "-w", is_flag=True,
              help="Follow JOB live until it ends (through a keeper's restart of its supervisor; or until no supervisor "
                   "can come back: `launch attach`): stages, log lines, a progress bar; exit code as submit's.")
def status(job, as_json, last, limit, checks, events, watch):
    """Show jobs, or one JOB in detail (when it was queued, started and ended, nodes, exit codes, metrics,
    first failure, its last events). The list leaves out the jobs `launch check` ran (--checks lists them).
    A QUEUED job says what it waits for and how far each holding job is, whoever's it is
    (`now job X of alice: step 120/1000, ETA 14:32`; --json: holders_progress).

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
      launch status cifar10 --events all
    """
    from launcher.run import status as status_of
    from launcher.store.db import Store
    from launcher.views import jobstatus, render

    store = Store()
    if watch:
        _watch(store, job, last, as_json)
        return
    if last:
        job = status_of.newest(store)
    if job is not None:
        shown = status_of.one(store, job)
        if as_json:
            click.echo(render.json_text(jobstatus.detail_json(shown)))
        else:
            out = console()
            for part in jobstatus.job_detail(shown, _events_shown(events)):
                out.print(part)
        return
    statuses = status_of.listed(store, limit or None, checks=checks)
    if as_json:
        click.echo(render.json_text([jobstatus.job_object(s) for s in statuses]))
    elif not statuses:
        click.echo("no jobs yet: try `launch submit jobs/cifar10_convnet.yaml`")
    else:
        console().print(jobstatus.jobs_table(statuses))


def _events_shown(value: str) -> int | None:
    """``--events``: how many of the newest events to show (None: all)."""
    if value == "all":
        return None
    if not value.isdigit():
        raise click.BadParameter(f"{value!r}: a number of events, or 'all'", param_hint="--events")
    return int(value)


def _watch(store, job: str | None, last: bool, as_json: bool) -> None:
    """`status --watch`: the live view until the job ends, then exit as submit does."""
    from launcher.run.cancel import SupervisorWatch
    from launcher.views.watch import watch

    if as_json or not (job or last):
        raise click.UsageError("--watch follows one job: give JOB (or --last), without --json")
    if last:
        from launcher.run.status import newest

        job = newest(store)
    try:
        row = watch(store, str(job), stream=sys.stdout, supervisor_gone=SupervisorWatch(store, _say))
    except KeyboardInterrupt:
        click.echo("stopped watching; the job goes on (`launch cancel` ends it)", err=True)
        sys.exit(EXIT_CANCELLED)
    click.echo(f"job {row.id}: {row.state}", err=True)
    if row.state != JobState.SUCCEEDED:
        echo_reason(row.reason)
    exit_for(row.state)


def _say(text: str) -> None:
    """A note of launch's own beside the job's lines (on stderr): the supervisor restarting, or gone."""
    click.echo(safe_text(text, colour=False), err=True)



MAX_TAIL = 10**9  # --tail past this is every line (a larger N once ended in an OverflowError)


def _check_node_and_rank(store, job: str, node: int | None, rank: int | None) -> None:
    """A --node or --rank the job never had is an error naming what it has, not an empty listing and exit 0."""
    row = store.job(job)
    nodes = {n.node for n in store.nodes(row.id) if n.node is not None} | set(range(row.nnodes or 0))
    if node is not None and nodes and node not in nodes:
        raise click.BadParameter(f"job {row.id} has nodes {min(nodes)}-{max(nodes)}; no node {node}", param_hint="--node")
    if rank is not None and row.world_size and rank >= row.world_size and not (row.plan or {}).get("elastic"):
        raise click.BadParameter(f"job {row.id} has ranks 0-{row.world_size - 1}; no rank {rank}", param_hint="--rank")

@click.command()
@click.argument("job")
@click.option("--node", type=click.IntRange(min=0), help="Only this node.")
@click.option("--rank", type=click.IntRange(min=0), help="Only this global rank.")
@click.option("--attempt", type=int, help="Attempt (default: the latest).")
@click.option("--since", metavar="WHEN", help="Only lines written since: a duration back (30s, 10m, 2h, 1d) or an ISO time.")
@click.option("--tail", type=click.IntRange(min=0, max=MAX_TAIL, clamp=True), metavar="N",
              help="Only the last N lines (after the other filters).")
@click.option("--grep", "pattern", metavar="REGEX", help="Only lines matching this regular expression (Python syntax), across all nodes.")
@click.option("--timestamps", "-t", is_flag=True, help="Show when each line was written (local time).")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing new lines until the job ends, through a keeper's restart of its supervisor (or until "
                   "no supervisor can come back: exit 1, `launch attach` resumes it).")
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
    from launcher.run.cancel import SupervisorWatch

    store = Store()
    _check_node_and_rank(store, job, node, rank)
    print_logs(store, job, query, follow=follow, fmt=fmt, out=echo_line, supervisor_gone=SupervisorWatch(store, _say),
               say=_say)
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

    from launcher.run.stacks import for_job
    from launcher.store.db import Store
    from launcher.views.stacks import report_lines

    report = for_job(Store(), job)
    out = console()
    for line in report_lines(report):
        out.print(Text(safe_text(line, colour=False)))
