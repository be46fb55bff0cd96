"""What the dashboard's pages show, composed by the functions `launch status` and `launch compare` use."""

from __future__ import annotations

from typing import Any

from launcher.run import status
from launcher.store.db import Store
from launcher.store.records import FIGURE_COLUMNS
from launcher.store.rows import JobRow
from launcher.store.states import JobState
from launcher.views import jobstatus
from launcher.views.compare import comparison, job_metrics, row_cells, table_headers
from launcher.views.jobstatus import JobStatus
from launcher.views.render import masked_env, shown_env
from launcher.views.stacks import latest
from launcher.views.verdict import verdict_lines

#: The figures of a rank plotted on a job's page, by their metric record's name: those the store keeps in columns.
SERIES = FIGURE_COLUMNS
#: Above this many ranks, the plots show the min, mean and max over the ranks instead of a line a rank.
RANKS_PLOTTED = 32


def jobs(store: Store, limit: int | None = None, owner: str = "") -> list[dict[str, Any]]:
    """Every job newest first, as `launch status --json` gives each, with the ETA of a running one; ``user`` is
    ``owner`` (the store's) for a job stored before launch recorded who submitted it."""
    out = []
    for shown in status.listed(store, limit):
        obj = jobstatus.job_object(shown)
        obj["user"] = submitter(shown.job, owner)
        obj["eta_s"] = eta_s(obj) if shown.job.state == JobState.RUNNING else None
        out.append(obj)
    return out


def submitter(row: JobRow, owner: str) -> str:
    """Who submitted the job: as the store recorded it, else the store's owner (a store is one user's)."""
    return row.user or owner


def eta_s(obj: dict[str, Any]) -> float | None:
    """Seconds left at the job's step rate, None where either is unknown."""
    metrics, total = obj.get("metrics") or {}, obj.get("max_steps")
    rate, steps = metrics.get("steps_per_sec"), metrics.get("steps") or 0
    return (total - steps) / rate if isinstance(total, int) and rate and total > steps else None


def shown_plan(plan: Any) -> list[dict[str, Any]]:
    """Each node of a stored plan: host, argv, and its environment with where each value came from, secrets masked."""
    if not isinstance(plan, dict) or not isinstance(plan.get("nodes"), list):
        return []
    secrets = tuple(s for s in plan.get("secrets") or () if isinstance(s, str))
    out = []
    for node in plan["nodes"]:
        if not isinstance(node, dict) or not isinstance(node.get("env"), dict):
            continue
        given = node.get("env_sources")
        sources = given if isinstance(given, dict) else {}
        env = masked_env(shown_env(node), secrets)
        out.append({"node": node.get("index"), "host": node.get("host"), "nproc": node.get("nproc"),
                    "argv": [str(a) for a in node.get("argv") or ()],
                    "env": [(k, v, sources.get(k) or "") for k, v in env.items()]})
    return out


def job(store: Store, ref: str) -> dict[str, Any]:
    """One job as `launch status JOB --json` shows it, with its verdict's lines and its plan per node. Unlike the
    CLI it does not ask the nodes of an unattended job about their agents (a page load never reaches a node)."""
    row = store.job(ref)
    shown = JobStatus(row, jobstatus.job_summary(store, row), status.supervision(store, row), nodes=tuple(store.nodes(row.id)),
                      events=tuple(store.events(row.id)), stacks=latest(store.run_dir(row.id)))
    obj = jobstatus.detail_json(shown)
    obj["verdict_lines"] = verdict_lines(shown.stacks, row, list(shown.events)) if shown.stacks else []
    obj["plan_nodes"] = shown_plan(row.plan)
    return obj


def series(store: Store, ref: str) -> dict[str, Any]:
    """The plotted figures of a job's latest attempt: {"ranks": {rank: {"step": [...], name: [...]}}}; a job of more
    than ``RANKS_PLOTTED`` ranks is plotted as the min, mean and max over its ranks at each step (keys "min", "mean",
    "max", computed by the store), which a browser draws at once for 1,000 ranks."""
    row = store.job(ref)
    attempt = row.attempt or 0
    if store.metric_ranks(row.id, attempt) > RANKS_PLOTTED:
        spread = store.metric_spread(row.id, attempt, SERIES)
        steps = [step for step, _ in spread]
        shown = {label: {"step": steps, **{name: [values[3 * i + at] for _, values in spread]
                                           for i, name in enumerate(SERIES)}}
                 for at, label in enumerate(("min", "mean", "max"))}
        return {"job": row.id, "state": row.state, "ranks": shown}
    ranks: dict[int, dict[str, list[Any]]] = {}
    for rank, step, values in store.metric_points(row.id, attempt, SERIES):
        line = ranks.setdefault(rank, {"step": [], **{name: [] for name in SERIES}})
        line["step"].append(step)
        for name, value in zip(SERIES, values):
            line[name].append(value)
    return {"job": row.id, "state": row.state, "ranks": {str(rank): ranks[rank] for rank in sorted(ranks)}}


def compare(store: Store, refs: list[str]) -> dict[str, Any]:
    """The `launch compare` table of these jobs (the first the baseline): headers and the cells of each row."""
    entries = [(row, job_metrics(row, store.metrics(row.id), usage=store.samples(row.id)))
               for row in (store.job(ref) for ref in refs)]
    return {"headers": table_headers(), "rows": [row_cells(r) for r in comparison(entries)]}
