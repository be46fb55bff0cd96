"""A job as `launch status` shows it (a ``JobStatus``, which ``run.status`` makes): its ``--json`` object, the jobs
table, one job in detail with its hang verdict; any stored row renders, and every stored value is shown as plain
text. The metric summaries, the store and rich are imported inside the functions that use them: `launch status`
stays light.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from launcher.node.nccl import Transport
from launcher.node.progress import HolderPace
from launcher.store.states import JobState, Supervision, SupervisorState
from launcher.views.nccl import node_transports
from launcher.views.render import PROGRAMS_PRECISION, batch_text, shown_env, steps_text
from launcher.views.terminal import safe_lines, safe_text

if TYPE_CHECKING:
    from launcher.metrics.summary import JobSummary
    from launcher.store.rows import JobRow, NodeRow
    from launcher.views.stacks import StackReport


@dataclass(frozen=True)
class AgentsLeft:
    """What the nodes of a job whose supervisor is gone said of their agents (node indices)."""

    running: tuple[int, ...] = ()
    ended: tuple[int, ...] = ()
    unknown: tuple[int, ...] = ()

    def as_json(self) -> dict[str, list[int]]:
        return {"running": list(self.running), "ended": list(self.ended), "unknown": list(self.unknown)}


@dataclass(frozen=True)
class JobStatus:
    """One job as `launch status` shows it: its row and metric summary; not ended, what is known of its supervisor;
    in detail (``nodes`` not None) its nodes, events, kept stacks and, its supervisor gone, its nodes' agents."""

    job: JobRow
    summary: JobSummary
    supervision: Supervision | None = None
    agents: AgentsLeft | None = None
    nodes: tuple[NodeRow, ...] | None = None
    events: tuple[dict[str, Any], ...] = ()
    stacks: StackReport | None = None
    #: a QUEUED job: how far each job holding what it waits for is (any user's: ``job X of alice: step 120/1000, ETA
    #: 14:32``), as their node agents recorded it
    holders: tuple[HolderPace, ...] | None = None

    @property
    def lost(self) -> bool:
        """Whether the job's supervisor is proven gone: the job is unattended."""
        return self.supervision is not None and self.supervision.state == SupervisorState.LOST


def job_summary(store: Any, job: JobRow) -> JobSummary:
    """A job's metric summary: the stored one of a finished job, else live from its running summary (the same
    figures, a row a rank), or from its records and process samples where that does not cover them all."""
    from launcher.metrics.aggregate import summarize
    from launcher.metrics.summary import JobSummary
    if job.terminal and job.summary:
        return JobSummary.from_stored(job.summary)
    running = store.running_summary(job.id)
    return running if running is not None else summarize(store.metrics(job.id), store.samples(job.id))


NETWORK_ENV = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA")


def node_network(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Per node of a stored plan: its address and the network values it ran with, and where each came from.

    A stored plan of another shape (an older launch, a damaged row) gives what it has: nodes without
    the expected keys are left out.
    """
    rendezvous = plan.get("rendezvous")
    master = rendezvous.get("host") if isinstance(rendezvous, dict) else None
    nodes = plan.get("nodes")
    out = []
    for n in nodes if isinstance(nodes, list) else []:
        if not isinstance(n, dict) or not isinstance(n.get("env"), dict):
            continue
        given = n.get("env_sources")
        env, sources = shown_env(n), given if isinstance(given, dict) else {}
        out.append({
            "node": n.get("index"), "host": n.get("host"), "address": n.get("address"), "master_addr": master,
            "env": {k: env[k] for k in NETWORK_ENV if k in env},
            "sources": {k: sources.get(k) for k in NETWORK_ENV if k in env},
        })
    return out


def unattended(status: JobStatus) -> str | None:
    """``RUNNING, unattended since HH:MM (no supervisor): launch attach JOB`` for a job whose supervisor is gone.

    Only a RUNNING job can be attached to; one that had not started (QUEUED, PENDING) is cleared with
    ``launch cancel`` and submitted again."""
    if status.supervision is None or not status.lost:
        return None
    since, state = status.supervision.since, status.job.state
    when = time.strftime("%H:%M", time.localtime(since)) if since is not None else "?"
    remedy = "launch attach" if state == JobState.RUNNING else "launch cancel"
    return f"{state}, unattended since {when} (no supervisor){_agents_said(status.agents)}: {remedy} {status.job.id}"


def supervisor_said(status: JobStatus) -> str | None:
    """The job's state as its supervision qualifies it: unattended (``unattended``), taken over by a newer supervisor
    (``RUNNING, taken over by generation 2 (process 4242 on lab-02)``: this store no longer follows it), or
    supervised in the background since its terminal closed (``launch attach JOB`` brings it back to a terminal)."""
    said, job = status.supervision, status.job
    if said is None:
        return None
    if said.state == SupervisorState.TAKEN_OVER and said.successor is not None:
        return f"{job.state}, taken over by {said.successor}"
    if said.state == SupervisorState.ATTACHED and said.terminal_closed is not None:
        when = time.strftime("%H:%M", time.localtime(said.terminal_closed))
        return f"{job.state}, in the background since {when} (its terminal closed): launch attach {job.id}"
    return unattended(status)


def short_supervision(status: JobStatus) -> str | None:
    """``supervisor_said`` in at most 20 characters, for the jobs table (``status JOB`` says it in full):
    ``RUNNING unattended``, ``RUNNING taken over``, ``RUNNING background``."""
    said, state = status.supervision, status.job.state
    if said is None:
        return None
    if said.state == SupervisorState.TAKEN_OVER and said.successor is not None:
        return f"{state} taken over"
    if said.state == SupervisorState.ATTACHED and said.terminal_closed is not None:
        return f"{state} background"
    return f"{state} unattended" if status.lost else None


def _agents_said(agents: AgentsLeft | None) -> str:
    """What the nodes said of their agents (``status JOB`` asks them), as a clause."""
    if agents is None:
        return ""
    said = {"ended": agents.ended, "running": agents.running, "unknown": agents.unknown}
    nodes = sum(len(indices) for indices in said.values())
    if not nodes:
        return ""
    if len(said["ended"]) == nodes:
        return "; its agents have ended the job on every node (watch.unattended_timeout: their journals say why)"
    if len(said["running"]) == nodes:
        return "; its agents still run the job on every node"
    how = {"ended": "agents ended on", "running": "running on", "unknown": "not answering on"}
    return "; " + ", ".join(f"{how[word]} node{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}"
                            for word, indices in said.items() if indices)


def job_object(status: JobStatus) -> dict[str, Any]:
    """The ``status --json`` object of one job; ``supervisor`` (a job not ended): {"state": "attached" | "lost" |
    "unknown", "host", "pid", "since", "generation"} (since: when it took the job, or when it was last alive once
    lost), with ``agents`` (their nodes asked) once lost, in detail."""
    job, summary = status.job, status.summary
    supervisor = None if status.supervision is None else status.supervision.as_json()
    if supervisor is not None and status.lost and status.nodes is not None:
        supervisor["agents"] = None if status.agents is None else status.agents.as_json()
    obj: dict[str, Any] = {
        "id": job.id,
        "name": job.name,
        "user": job.user,
        "state": job.state,
        "backend": job.backend,
        "cluster": job.cluster,
        "launcher": job.launcher,
        "strategy": job.strategy,
        "precision": job.precision,
        "nnodes": job.nnodes,
        "nproc_per_node": job.nproc_per_node,
        "world_size": job.world_size,
        "micro_batch": job.micro_batch,
        "grad_accum": job.grad_accum,
        "global_batch": job.global_batch,
        "max_steps": job.max_steps,
        "attempt": job.attempt,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "duration_s": timeline(job, list(status.events))["duration_s"],
        "reason": job.reason,
        "queue_reason": job.queue_reason,
        "scheduler_id": job.scheduler_id,
        "first_failure": job.first_failure,
        "metrics": summary.as_json(records=False),
        "supervisor": supervisor,
    }
    if status.nodes is not None:
        obj["nodes"] = [node.as_json() for node in status.nodes]
    if job.plan:
        obj["network"] = node_network(job.plan)
        obj["procs"] = _procs(job.plan)
        if status.events:
            obj["nccl"] = [t.as_json() for t in node_transports(job.plan, status.events)]
    return obj


def _procs(plan: Any) -> list[int] | None:
    """The processes of each node of a stored plan (None when it does not say: an old or damaged record)."""
    nodes = plan.get("nodes") if isinstance(plan, dict) else None
    procs = [n.get("nproc") for n in nodes if isinstance(n, dict)] if isinstance(nodes, list) else []
    counts = [p for p in procs if isinstance(p, int) and not isinstance(p, bool)]
    return counts if counts and len(counts) == len(procs) else None


def _each(obj: dict[str, Any]) -> Any:
    """Processes a node: the one number, or each node's where they differ (``2+1``)."""
    procs = obj.get("procs")
    return "+".join(map(str, procs)) if procs and len(set(procs)) > 1 else obj["nproc_per_node"]


def _fmt(value: Any, spec: str = ".1f", unit: str = "") -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    return f"{value:{spec}}{unit}"


def _age(t: float | None) -> str:
    if not isinstance(t, (int, float)):
        return "-"
    seconds = time.time() - t
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def detail_json(status: JobStatus) -> dict[str, Any]:
    """``status JOB --json``: the job's object with its events, kept stacks and their verdict."""
    from launcher.views.stacks import json_entries
    from launcher.views.verdict import verdict_json

    kept, events = status.stacks, list(status.events)
    return {**job_object(status), **submitted_as(status.job), "holders_progress": (
        {p.job: p.as_json() for p in status.holders} if status.holders is not None else None),
            "attempts": attempts_told(status.job, status.nodes or (), events), "events": events,
            "stacks": json_entries(kept) if kept else [], "verdict": verdict_json(kept, status.job, events) if kept else None}


_RESTARTING = re.compile(r"^attempt (\d+) failed \((.*)\); restart \d+ of \d+")
_REPLANNED = re.compile(r"^attempt (\d+): ")
REPLAN_KINDS = ("elastic_restart", "node_left_out")


def attempts_told(job: JobRow, nodes: tuple[NodeRow, ...], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each attempt of a job: its hosts, how it ended (its failure, or the job's end for the last one) and what the
    next attempt changed (a re-plan: the node lost, the new grad_accum), from its node rows and events."""
    ended: dict[int, str] = {}
    changed: dict[int, str] = {}
    for event in events:
        message = str(event.get("message") or "")
        if event.get("kind") == "restarting" and (match := _RESTARTING.match(message)):
            ended[int(match[1])] = match[2]
        elif event.get("kind") in REPLAN_KINDS and (match := _REPLANNED.match(message)):
            changed[int(match[1]) - 1] = message
    last = job.attempt or 0
    told = []
    for attempt in range(last + 1):
        hosts = [n.host or "?" for n in nodes if n.attempt == attempt]
        end = ended.get(attempt) or (str(job.reason or job.state) if attempt == last and job.terminal else
                                     "running" if attempt == last else "?")
        told.append({"attempt": attempt, "hosts": hosts, "ended": end, "next": changed.get(attempt)})
    return told


def submitted_as(job: JobRow) -> dict[str, Any]:
    """What a job was submitted as: ``spec``, its effective job spec (the file with its overrides applied; secrets are
    names), ``overrides`` (its ``--set`` items, secret values masked) and ``resubmit_of`` (the job it runs again)."""
    stored = job.spec or {}
    spec = stored.get("submitted") or stored.get("job")
    overrides = stored.get("overrides")
    return {"spec": spec if isinstance(spec, dict) else None,
            "overrides": [item for item in overrides if isinstance(item, str)] if isinstance(overrides, list) else [],
            "resubmit_of": stored.get("resubmit_of") if isinstance(stored.get("resubmit_of"), str) else None}


def jobs_table(statuses: list[JobStatus]):
    """A rich table of jobs (stored text shown through ``safe_text``); a job whose supervisor is gone says so in its
    state, in a few words (`launch status JOB` says what to do)."""
    from rich.table import Table

    Text = _safe_text_class()

    table = Table(box=None, header_style="bold")
    table.add_column("ID", no_wrap=True)
    for column in ("STATE", "NODES", "STEPS", "SAMPLES/S", "STEP P50", "PEAK MEM", "CREATED"):
        table.add_column(column, no_wrap=True)
    for status in statuses:
        job, m = status.job, status.summary
        table.add_row(
            Text(_fmt(job.id, "")), _state(job.state, short_supervision(status)),
            Text(f"{_fmt(job.nnodes, 'd')}x{_fmt(job.nproc_per_node, 'd')}"),
            Text(steps_text(m.steps, job.max_steps)), _fmt(m.samples_per_sec),
            _fmt(m.step_time_ms_p50, ".0f", " ms"), _fmt(m.peak_mem_mb, ".0f", " MB"), _age(job.created_at),
        )
    return table


class _PlainTable:
    """A borderless table as ``rich.table.Table(box=None, header_style="bold", title_justify="left")`` draws it,
    laid out here when every cell is one line and the table fits the console: the same characters, without rich's
    measuring of every cell, which took seconds for the 1,000 ranks of a large job (docs/BENCHMARKS.md). Anything
    else is drawn by rich's Table itself."""

    def __init__(self, title: str, columns: tuple[str, ...]) -> None:
        self.title, self.columns = title, columns
        self.rows: list[tuple[Any, ...]] = []

    def add_row(self, *cells: Any) -> None:
        self.rows.append(cells)

    def rich_table(self) -> Any:
        from rich.table import Table

        table = Table(title=self.title, box=None, header_style="bold", title_justify="left")
        for column in self.columns:
            table.add_column(column)
        for row in self.rows:
            table.add_row(*row)
        return table

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.cells import cell_len
        from rich.segment import Segment
        from rich.text import Text

        # rich reads a str cell as markup (and :emoji: codes): only plain ones are laid out here
        plain = all(isinstance(cell, Text) or (isinstance(cell, str) and not any(c in cell for c in "[:"))
                    for row in self.rows for cell in row)
        texts = [[cell.plain if isinstance(cell, Text) else cell for cell in row] for row in self.rows] if plain else []
        plain = plain and not any("\n" in text or "\t" in text for row in texts for text in row)
        widths = [max([cell_len(name)] + [cell_len(row[i]) for row in texts]) for i, name in enumerate(self.columns)]
        if not plain or sum(width + 2 for width in widths) > options.max_width:
            yield self.rich_table()
            return
        yield Text(self.title, style="table.title")
        for cells, shown, style in [(self.columns, self.columns, "bold"), *((row, t, "") for row, t in zip(self.rows, texts))]:
            parts = [f" {text}{' ' * (width - cell_len(text))} " for text, width in zip(shown, widths)]
            styled, at = [], 1
            for cell, part in zip(cells, parts):
                if isinstance(cell, Text) and (cell.style or cell.spans):
                    styled.append((at, cell))
                at += len(part)
            if not style and not styled:  # the segments rich makes of an unstyled line, without its wrapping
                yield Segment("".join(parts))
                yield Segment("\n")
                continue
            line = Text("".join(parts), style=style, no_wrap=True)
            for start, cell in styled:
                if cell.style:
                    line.stylize(cell.style, start, start + len(cell.plain))
                for span in cell.spans:
                    line.stylize(span.style, start + span.start, start + span.end)
            yield from Text("\n").join([line]).render(console, end="\n")  # what rich renders a line that fits as


@functools.lru_cache(maxsize=1)
def _safe_text_class() -> Any:
    """rich's Text whose text goes through ``safe_text``: a stored reason, host or log line cannot move the
    cursor, set the title or the clipboard, or make a link (rich writes control codes in Text as they are)."""
    from rich.text import Text

    class SafeText(Text):
        def __init__(self, text: str = "", *args: Any, **kwargs: Any) -> None:
            super().__init__(safe_lines(text, colour=False), *args, **kwargs)

    return SafeText


STATE_COLOURS = {JobState.SUCCEEDED: "green", JobState.FAILED: "red", JobState.CANCELLED: "yellow",
                 JobState.RUNNING: "cyan"}


def _state(state: Any, said: str | None = None):
    Text = _safe_text_class()

    color = STATE_COLOURS.get(state, "white")
    return Text(said or _fmt(state, ""), style="magenta" if said else color)


def _failure(failure: dict[str, Any]):
    """The stored failure record, or a stand-in saying it cannot be read (another version's record)."""
    from launcher.backends.failures import Failure

    try:
        return Failure.model_validate(failure)
    except ValueError:
        reason = failure.get("reason")
        return Failure(kind="internal", reason=f"first failure: {reason if isinstance(reason, str) else 'a stored record this launch cannot read'}")


def _submitted_lines(job: JobRow) -> list[Any]:
    """``  submitted: again as JOB was, --set a=1 --set b=2`` when it was resubmitted or given overrides."""
    import shlex

    Text = _safe_text_class()
    said = submitted_as(job)
    parts = ([f"again as {said['resubmit_of']} was (launch resubmit)"] if said["resubmit_of"] else []) + \
        [" ".join(f"--set {shlex.quote(item)}" for item in said["overrides"])] * bool(said["overrides"])
    return [Text(f"  as submitted: {', '.join(parts)}")] if parts else []


def _clock(t: float, since: float | None = None) -> str:
    """``HH:MM:SS``, with the date when it is not the day of ``since`` (or of now)."""
    day = time.strftime("%Y-%m-%d", time.localtime(since if since is not None else time.time()))
    shown = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    return shown[11:] if shown.startswith(day) else shown


def duration_text(seconds: float) -> str:
    """``2h03m``, ``4m10s``, ``12.3 s``."""
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.1f} s"


def timeline(job: JobRow, events: list[dict[str, Any]]) -> dict[str, float | None]:
    """When the job was queued (its first ``queued`` event), how long it waited to start (so far, while it waits),
    and how long it ran, once it ended: ``queued_at``, ``queued_s``, ``duration_s``."""
    queued = next((e["t"] for e in events if e.get("kind") == "queued" and isinstance(e.get("t"), (int, float))), None)
    started, ended = job.started_at, job.ended_at
    waited = (started if started is not None else ended if ended is not None else time.time()) - queued \
        if queued is not None else None
    ran = ended - started if started is not None and ended is not None else None  # a running job: its start says it
    return {"queued_at": queued, "queued_s": waited, "duration_s": ran}


def _times_line(job: JobRow, events: list[dict[str, Any]]) -> str:
    """``  submitted 10:02:03, queued 10:02:04 (waited 3m10s), started 10:05:14, ended 10:09:00: ran 3m46s``."""
    told = timeline(job, events)
    first = job.created_at
    parts = [f"submitted {_clock(first)}"] if first is not None else []
    if told["queued_at"] is not None:
        parts.append(f"queued {_clock(told['queued_at'], first)} (waited {duration_text(told['queued_s'] or 0)})")
    if job.started_at is not None:
        parts.append(f"started {_clock(job.started_at, first)}")
    if job.ended_at is not None:
        parts.append(f"ended {_clock(job.ended_at, first)}")
    if told["duration_s"] is not None:
        parts.append(f"ran {duration_text(told['duration_s'])}")
    elif job.ended_at is not None:
        parts.append("never started")
    return "  " + ", ".join(parts)


def job_detail(status: JobStatus, events_shown: int | None = 12) -> list[Any]:
    """Renderables for one job: header, nodes, metrics per rank, first failure, events, the verdict of its kept stacks.

    Every value from the store is shown as plain text (never as rich markup): a host name,
    reason or failure record cannot change how the page renders. ``events_shown``: the newest events shown (None:
    all), with a line saying how many earlier ones there are.
    """
    Text = _safe_text_class()
    obj, m, events = job_object(status), status.summary, list(status.events)
    waiting = f"  waiting: {obj['queue_reason']}" if obj["state"] == JobState.QUEUED and obj.get("queue_reason") else ""
    if waiting and status.holders:
        waiting += "; now " + "; ".join(p.text() for p in status.holders)
    scheduler = f"  (scheduler job {obj['scheduler_id']})" if obj.get("scheduler_id") else ""
    header = Text.assemble(Text(_fmt(obj["id"], ""), style="bold"), "  ", _state(obj["state"], supervisor_said(status)),
                           Text(f"  {obj['reason'] or ''}{waiting}{scheduler}"))
    out: list[Any] = [
        header,
        Text(f"  {obj['backend']} cluster '{obj['cluster']}', {obj['launcher']}, strategy {obj['strategy'] or '(entrypoint)'}, "
             f"{obj['precision'] or PROGRAMS_PRECISION}, {obj['nnodes']} node(s) x {_each(obj)} = {obj['world_size']} ranks, "
             f"attempt {obj['attempt']}"),
        Text(_times_line(status.job, events)),
        Text(f"  batch: {batch_text(obj['global_batch'], obj['micro_batch'], obj['grad_accum'], obj['world_size'])}"),
        *_submitted_lines(status.job),
        *(Text(f"  attempt {a['attempt']}: {', '.join(a['hosts']) or '(no nodes)'}: {a['ended']}"
               + (f"; next {a['next']}" if a["next"] else "")) for a in attempts_told(status.job, status.nodes or (), events)
          if (status.job.attempt or 0) > 0),
        *(Text(f"  elastic: {e['message']}") for e in events if e["kind"] == "elastic_restart"),
        Text(f"  metrics: {steps_text(m.steps, obj['max_steps'])} steps, {_fmt(m.steps_per_sec, '.2f')} steps/s, "
             f"{_fmt(m.samples_per_sec)} samples/s{'' if m.samples_per_sec is not None or not m.steps else ' (batch not seen)'}, "
             f"{_fmt(m.tokens_per_sec, '.0f')} tokens/s, step p50 {_fmt(m.step_time_ms_p50, '.1f', ' ms')}"
             f" p95 {_fmt(m.step_time_ms_p95, '.1f', ' ms')}, peak memory {_fmt(m.peak_mem_mb, '.0f', ' MB')}"
             f", GPU util {_fmt(m.gpu_util, '.0%')}, loss {_fmt(m.loss, '.4f')}"),
    ]
    nodes = _PlainTable("nodes", ("ATTEMPT", "NODE", "HOST", "ADDRESS", "STATE", "PID", "EXIT"))
    for n in obj.get("nodes", []):
        nodes.add_row(*(Text(_fmt(n.get(k), "")) for k in ("attempt", "node", "host", "address", "state", "pid", "exit_code")))
    out.append(nodes)
    for net in obj.get("network", []):
        values = ", ".join(f"{k}={v} ({net['sources'][k]})" for k, v in net["env"].items())
        out.append(Text(f"  node {net['node']} {net['host']} {net['address']} -> MASTER_ADDR {net['master_addr']}: {values}"))
    for t in obj.get("nccl", []):
        shown = Transport.from_json(t)
        out.append(Text(f"  nccl: node {t['node']} {t['host']}: {shown.describe() if shown else '?'}"))
        if t.get("warning"):
            out.append(Text(f"  warning: {t['warning']}", style="yellow"))
    if m.per_rank:
        ranks = _PlainTable("ranks", ("RANK", "NODE", "HOST", "SAMPLES/S", "STEP P50", "PEAK MEM", "STEPS"))
        for r in m.per_rank:
            ranks.add_row(
                str(r.rank), _fmt(r.node, ""), Text(_fmt(r.host, "")), _fmt(r.samples_per_sec),
                _fmt(r.step_time_ms_p50, ".1f", " ms"), _fmt(r.peak_mem_mb, ".0f", " MB"), str(r.steps),
            )
        out.append(ranks)
    failure = obj.get("first_failure")
    if isinstance(failure, dict):
        shown = _failure(failure)
        out.append(Text(shown.describe(), style="red"))
        for line in shown.last_lines[-10:]:
            out.append(Text("    " + line))
    newest = events if events_shown is None else events[-events_shown:] if events_shown else []
    earlier = len(events) - len(newest)
    out.append(Text(f"events: ({earlier} earlier event{'s' * (earlier != 1)}: --events all)" if earlier else "events:"))
    for e in newest:
        out.append(Text(f"  {time.strftime('%H:%M:%S', time.localtime(e['t']))}  {e['kind']:<16} {e['message']}"))
    if status.stacks is not None:
        from rich.text import Text as PlainText

        from launcher.views.verdict import verdict_lines

        out += [PlainText(safe_text(line, colour=False)) for line in verdict_lines(status.stacks, status.job, events)]
    return out
