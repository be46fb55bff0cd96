"""What `launch metrics` and `launch compare` show: per-job figures, stragglers, the comparison table.

The figures come from the raw records (``aggregate.summarize``), enriched with
MFU (``mfu.py``) and a straggler check per rank: a rank whose median step
time is more than 10% above the median over the job's ranks is flagged.
The comparison puts jobs side by side with the speed-up (samples/s) and the
memory ratio (peak memory of the largest rank: a GPU's on GPU nodes) against the first job that has metrics.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from launcher.metrics import columns as registry
from launcher.metrics import mfu as mfu_mod
from launcher.metrics.aggregate import as_records, summarize
from launcher.metrics.columns import fmt, fmt_mem, fmt_pct
from launcher.metrics.record import MetricRecord, RankUsage
from launcher.store.rows import JobRow
from launcher.store.states import JobState
from launcher.views.render import PROGRAMS_PRECISION, batch_text, steps_text

STRAGGLER_SLOWDOWN = 1.10

# The comparison table: the job's own columns, then every figure of ``columns.table_columns()``
# (step time, steps/s, samples/s, tokens/s, memory, GPU util, and any figure registered there),
# then the figures computed here.
HEAD_COLUMNS: tuple[tuple[str, str], ...] = (("job", "JOB"), ("strategy", "STRATEGY"), ("precision", "PRECISION"),
                                             ("world_size", "WORLD"), ("global_batch", "GLOBAL BATCH"))
TAIL_COLUMNS: tuple[tuple[str, str], ...] = (("mfu", "MFU"), ("speedup", "SPEED-UP"), ("mem_ratio", "MEM RATIO"),
                                             ("wall_s", "WALL"), ("first_step_s", "1ST STEP"),
                                             ("timed_steps", "TIMED STEPS"), ("attempts", "ATTEMPTS"),
                                             ("goodput", "GOODPUT"))
#: what must be alike for a speed-up to mean anything: (row key, how a warning names it)
ALIKE = (("global_batch", "global batch"), ("world_size", "world size"), ("precision", "precision"), ("recipe", "recipe"))
TEXT_HEADERS = ("JOB", "STRATEGY", "PRECISION")


def table_headers() -> list[str]:
    """The comparison table's headers, in the order users read them."""
    return [h for _, h in HEAD_COLUMNS] + [c.header or c.name for c in registry.table_columns()] + [h for _, h in TAIL_COLUMNS]


def rank_slowdowns(per_rank: list[dict[str, Any]]) -> dict[int, float]:
    """Each rank's median step time over the median across ranks (1.25 = 25% slower).

    Ranks without a step time are compared by samples/s instead (median / theirs).
    """
    times = {r["rank"]: r["step_time_ms_p50"] for r in per_rank if r.get("step_time_ms_p50")}
    if len(times) == len(per_rank) and len(times) >= 2:
        median = statistics.median(times.values())
        return {rank: t / median for rank, t in times.items()}
    rates = {r["rank"]: r["samples_per_sec"] for r in per_rank if r.get("samples_per_sec")}
    if len(rates) == len(per_rank) and len(rates) >= 2:
        median = statistics.median(rates.values())
        return {rank: median / rate for rank, rate in rates.items()}
    return {}


def stragglers(per_rank: list[dict[str, Any]], threshold: float = STRAGGLER_SLOWDOWN) -> list[int]:
    """Ranks more than ``threshold - 1`` (default 10%) slower than the median rank."""
    return sorted(rank for rank, slow in rank_slowdowns(per_rank).items() if slow > threshold)


def job_metrics(job: JobRow, records: Iterable[MetricRecord | Mapping[str, Any]], attempt: int | None = None,
                usage: Iterable[RankUsage] = ()) -> dict[str, Any]:
    """The `launch metrics --json` object of a job (without id and state).

    The summary's figures (``JobSummary.as_json``) plus MFU, the GPU's name and peak,
    and per-rank MFU, slowdown and straggler flags.
    """
    records = as_records(records)
    summary = summarize(records, usage, attempt)
    peak = mfu_mod.peak_tflops(job.spec, records)
    data = summary.as_json()
    slowdowns = rank_slowdowns(data["per_rank"])
    flagged = {rank for rank, slow in slowdowns.items() if slow > STRAGGLER_SLOWDOWN}
    data["per_rank"] = [
        {
            **entry,
            "mfu": mfu_mod.rank_mfu(rank.samples_per_sec, summary.flops_per_sample, peak),
            "slowdown": slowdowns.get(rank.rank),
            "straggler": rank.rank in flagged,
        }
        for rank, entry in zip(summary.per_rank, data["per_rank"])
    ]
    times, run = run_times(job, records), whole_run(records)
    run["run"]["goodput"] = goodput(run["run"]["lost_s"], times["wall_s"])
    return {
        **data,
        **times,
        **run,
        "mfu": mfu_mod.job_mfu(job.world_size, job.spec, summary, records),
        "gpu_name": mfu_mod.gpu_name(job.spec, records),
        "peak_tflops": peak,
        "stragglers": sorted(flagged),
    }


def whole_run(records: list[MetricRecord]) -> dict[str, Any]:
    """The run across its attempts (the summary's figures are the last attempt's): ``attempts``, each with its ranks,
    hosts, the step it resumed from and the last it reported, and the samples consumed by then (the recipes' count);
    ``run``: attempts, the last step, ``samples_consumed``, and ``steps_redone`` (steps an attempt did again because
    the one before had got past its last checkpoint)."""
    by_attempt: dict[int, list[MetricRecord]] = {}
    for r in records:
        by_attempt.setdefault(r.attempt, []).append(r)
    attempts: list[dict[str, Any]] = []
    redone, before, last_steps, consumed_all = 0, None, [], []
    lost, ended_at = 0.0, None
    step_times = sorted(r.step_time_s for r in records if r.step_time_s and not r.warmup) or \
        sorted(r.step_time_s for r in records if r.step_time_s)
    step_s = step_times[len(step_times) // 2] if step_times else 0.0
    for attempt in sorted(by_attempt):
        rows = by_attempt[attempt]
        first = min(rows, key=lambda r: r.step)
        resumed, last = max(first.step - max(first.steps, 1), 0), max(r.step for r in rows)
        consumed = [v for v in (r.number("samples_consumed") for r in rows) if v is not None]
        began = min((r.t - r.interval_s for r in rows if r.t is not None), default=None)
        if before is not None:
            redone += max(before - resumed, 0)
            lost += max(before - resumed, 0) * step_s  # steps done again
            if began is not None and ended_at is not None:
                lost += max(began - ended_at, 0.0)  # the failure noticed, the nodes stopped, re-planned, started again
        ended_at = max((r.t for r in rows if r.t is not None), default=ended_at)
        attempts.append({"attempt": attempt, "ranks": len({r.rank for r in rows}),
                         "hosts": sorted({r.host for r in rows if r.host}), "resumed_at_step": resumed, "last_step": last,
                         "samples_consumed": int(max(consumed)) if consumed else None})
        before = last
        last_steps.append(last)
        consumed_all += [int(max(consumed))] if consumed else []
    return {"attempts": attempts, "run": {
        "attempts": len(attempts), "last_step": max(last_steps, default=0),
        "samples_consumed": max(consumed_all) if consumed_all else None, "steps_redone": redone,
        "lost_s": round(lost, 1)}}


def goodput(lost_s: float, wall_s: float | None) -> float | None:
    """The share of the wall time that went into steps kept: 1 - (time lost to failures and restarts) / wall time."""
    return max(0.0, 1.0 - lost_s / wall_s) if wall_s else None


def run_times(job: JobRow, records: list[MetricRecord]) -> dict[str, Any]:
    """How long the job ran (``wall_s``: start to end, or to its last record while it runs), how long it took to
    its first optimizer step (``first_step_s``: from the start, the end of the first step of the first record's
    interval), and how many steps the throughput figures time (``timed_steps``: past warm-up unless there is nothing
    else, as ``summarize`` times them; the most of any rank)."""
    timed: dict[int, int] = {}
    steady = [r for r in records if not r.warmup] or records  # as the summary times them (warm-up only: all)
    for r in steady:
        timed[r.rank] = timed.get(r.rank, 0) + r.steps
    first = min((r for r in records if r.t is not None), key=lambda r: r.t or 0.0, default=None)
    start, end = job.started_at, job.ended_at
    first_step = None
    if first is not None and first.t is not None and start is not None:
        first_step = max(0.0, first.t - (first.step_time_s or 0.0) * max(first.steps - 1, 0) - start)
    last = max((r.t for r in records if r.t is not None), default=None)
    until = end if end is not None else last
    wall = until - start if start is not None and until is not None else None
    return {"wall_s": wall, "first_step_s": first_step, "timed_steps": max(timed.values(), default=0)}


def compare_row(job: JobRow, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """One job's row of the comparison (before the ratios against the baseline); ``metrics`` from ``job_metrics``:
    the whole run's attempts and goodput beside the last attempt's figures."""
    run = metrics.get("run") or {}
    row = {
        "job": job.id,
        "name": job.name,
        "state": job.state,
        "reason": job.reason,
        "strategy": job.strategy,
        "precision": job.precision,
        "world_size": job.world_size,
        "grad_accum": job.grad_accum,
        "global_batch": job.global_batch,
        "recipe": _recipe(job),
        "wall_s": metrics.get("wall_s"),
        "first_step_s": metrics.get("first_step_s"),
        "timed_steps": metrics.get("timed_steps"),
        "attempts": run.get("attempts"),
        "goodput": run.get("goodput"),
        "steps_redone": run.get("steps_redone"),
    }
    row.update({column.row_key: metrics.get(column.name) for column in registry.columns() if column.row_key})
    row["mfu"] = metrics.get("mfu")
    row["stragglers"] = metrics.get("stragglers", [])
    return row


def _recipe(job: JobRow) -> str | None:
    """The job's recipe, ``entrypoint`` for the user's program (None: a record that does not say)."""
    spec = (job.spec or {}).get("job")
    if not isinstance(spec, dict):
        return None
    recipe = spec.get("recipe")
    return recipe if isinstance(recipe, str) else "entrypoint" if spec.get("entrypoint") else None


def unlike(rows: list[dict[str, Any]]) -> list[str]:
    """Warnings for runs that differ in what a speed-up takes as given (global batch, world size, precision,
    recipe): one line a difference, each job's value (failed runs without a job left out)."""
    jobs = [row for row in rows if row.get("job")]
    warnings = []
    for key, name in ALIKE:
        values = [row.get(key) for row in jobs]
        if len({str(value) for value in values if value is not None}) > 1:
            each = ", ".join(f"{row['job']} {fmt(row.get(key), '')}" for row in jobs)
            warnings.append(f"the jobs differ in {name} ({each}): their speed-up and memory ratio compare unlike runs")
    return warnings


def failed_row(strategy: str, reason: str, state: JobState = JobState.FAILED) -> dict[str, Any]:
    """A comparison row for a run that never got a job (its spec was refused, preflight failed...)."""
    return {**compare_row(JobRow(id="", name=None, state=state, reason=reason, strategy=strategy), {}), "job": None}


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with ``speedup`` and ``mem_ratio`` against the first row that has metrics (the baseline)."""
    base = next((r for r in rows if r.get("samples_per_sec") or r.get("steps_per_sec")), None)
    out = []
    for row in rows:
        row = dict(row, baseline=row is base, speedup=None, mem_ratio=None)
        if base is not None:
            row["speedup"] = _ratio(row.get("samples_per_sec"), base.get("samples_per_sec")) or _ratio(
                row.get("steps_per_sec"), base.get("steps_per_sec")
            )
            row["mem_ratio"] = _ratio(row.get("peak_mem_mb"), base.get("peak_mem_mb"))
        out.append(row)
    return out


def comparison(entries: list[tuple[JobRow, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The comparison rows for (job row, ``job_metrics``) pairs, first job = baseline."""
    return with_ratios([compare_row(job, metrics) for job, metrics in entries])


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value and base else None


# text rendering


def row_cells(row: Mapping[str, Any]) -> list[str]:
    """The text of one comparison row, in ``table_headers()`` order."""
    figures = registry.table_columns()
    if row["state"] == JobState.FAILED and row.get("samples_per_sec") is None:
        run_cells = _run_cells(row)
        metrics = ["failed"] + ["-"] * (len(figures) + len(TAIL_COLUMNS) - 1 - len(run_cells)) + run_cells
    else:
        metrics = [column.cell(row.get(column.row_key) if column.row_key else None) for column in figures] + [
            fmt_pct(row["mfu"]), fmt(row["speedup"], ".2f", "x"), fmt(row["mem_ratio"], ".2f", "x"), *_run_cells(row),
        ]
    head = [row["job"] or "-", row["strategy"] or "(entrypoint)", row["precision"] or "-", fmt(row["world_size"], "d"),
            fmt(row.get("global_batch"), "d")]
    return [str(cell) for cell in head] + metrics


def _run_cells(row: Mapping[str, Any]) -> list[str]:
    """WALL, 1ST STEP, TIMED STEPS, ATTEMPTS and GOODPUT of a row."""
    return [fmt(row.get("wall_s"), ".1f", " s"), fmt(row.get("first_step_s"), ".1f", " s"), fmt(row.get("timed_steps"), "d"),
            fmt(row.get("attempts"), "d"), fmt_pct(row.get("goodput"))]


def comparison_table(rows: list[dict[str, Any]]):
    """A rich table of the comparison, failures and stragglers noted under it."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold")
    for header in table_headers():
        table.add_column(header, no_wrap=header == "JOB", justify="left" if header in TEXT_HEADERS else "right")
    for row in rows:
        table.add_row(*map(Text, row_cells(row)), style="red" if row["state"] == JobState.FAILED else None)
    base = next((row for row in rows if row.get("baseline")), None)
    notes = [Text(f"warning: {text}", style="yellow") for text in unlike(rows)]
    if base is not None:
        notes.append(Text(f"speed-up (samples/s) and memory ratio (peak memory of the largest rank: a GPU's on GPU "
                          f"nodes) are against {base['job']}", style="dim"))
    notes += [
        Text(f"{row['strategy'] or row['job']}: {str(row['state']).lower()}: {row['reason'] or 'no reason recorded'}", style="red")
        for row in rows if row["state"] in (JobState.FAILED, JobState.CANCELLED)
    ]
    notes += [Text(f"{row['job']}: straggler rank(s) {', '.join(map(str, row['stragglers']))}", style="yellow")
              for row in rows if row.get("stragglers")]
    notes += [Text(f"{row['job']}: {row['attempts']} attempts, goodput {fmt_pct(row.get('goodput'))} "
                   f"({row.get('steps_redone') or 0} step(s) redone); its figures are its last attempt's", style="dim")
              for row in rows if (row.get("attempts") or 0) > 1]
    return Group(table, *notes)


# figures that metrics_renderables writes on lines of their own; any other registered figure gets a line
_SHOWN = {"step_time_ms_p50", "step_time_ms_p95", "steps_per_sec", "samples_per_sec", "tokens_per_sec", "peak_mem_mb",
          "gpu_util", "flops_per_sample", "loss"}


def metrics_renderables(job: JobRow, metrics: Mapping[str, Any]) -> list[Any]:
    """What `launch metrics JOB` prints: the summary, the per-rank table and straggler warnings."""
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    m = metrics
    on_gpus = runs_on_gpus(job)
    out: list[Any] = [
        f"[bold]{escape(str(job.id))}[/]  {escape(str(job.state or '?'))}  "
        + escape(f"{job.strategy or '(entrypoint)'}, {job.precision or PROGRAMS_PRECISION}, "
                 f"{job.nnodes} node(s) x {job.nproc_per_node} = {job.world_size} ranks"),
        Text(f"  batch       {batch_text(job.global_batch, job.micro_batch, job.grad_accum, job.world_size)}"),
        f"  steps       {escape(steps_text(m['steps'], job.max_steps))}  ({m['records']} records, warm-up excluded)",
        f"  throughput  {fmt(m['samples_per_sec'])} samples/s, {fmt(m['tokens_per_sec'], '.0f')} tokens/s, "
        f"{fmt(m['steps_per_sec'], '.2f')} steps/s",
        f"  step time   p50 {fmt(m['step_time_ms_p50'], '.1f', ' ms')}, p95 {fmt(m['step_time_ms_p95'], '.1f', ' ms')}",
        f"  memory      peak {fmt_mem(m['peak_mem_mb'])} {'per GPU' if on_gpus else 'per rank'} (max over ranks)",
        f"  GPU util    {fmt(m['gpu_util'], '.0%')}",
        f"  MFU         {escape(_mfu_line(m, on_gpus))}",
        f"  loss        {fmt(m['loss'], '.4g')}",
    ]
    out += [Text(f"  {column.name:<11} {column.cell(m.get(column.name))}") for column in registry.columns()
            if column.name not in _SHOWN]
    out += _run_lines(m)
    if job.reason:
        out.insert(1, Text(f"  reason      {job.reason}"))
    if not m["per_rank"]:
        out.append("no metric records" + ("" if job.terminal else " yet"))
        return out
    table = Table(title="ranks", box=None, header_style="bold", title_justify="left")
    for column in ("RANK", "NODE", "HOST", "SAMPLES/S", "TOKENS/S", "STEP P50", "VS MEDIAN", "PEAK MEM", "MFU", "STEPS", ""):
        table.add_column(column, no_wrap=True)
    for r in m["per_rank"]:
        table.add_row(
            str(r["rank"]), fmt(r["node"], ""), Text(fmt(r["host"], "")), fmt(r["samples_per_sec"]),
            fmt(r["tokens_per_sec"] or None, ".0f"), fmt(r["step_time_ms_p50"], ".1f", " ms"),
            fmt(r["slowdown"], ".2f", "x"), fmt_mem(r["peak_mem_mb"]), fmt_pct(r["mfu"]), str(r["steps"]),
            "[yellow]STRAGGLER[/]" if r["straggler"] else "",
            style="yellow" if r["straggler"] else None,
        )
    out.append(table)
    for r in m["per_rank"]:
        if r["straggler"]:
            out.append(
                f"[yellow]straggler: rank {r['rank']} on {escape(fmt(r['host'], ''))} (node {fmt(r['node'], '')}) is "
                f"{(r['slowdown'] - 1):.0%} slower than the median rank[/]"
            )
    return out


def _run_lines(m: Mapping[str, Any]) -> list[Any]:
    """The run across its attempts, under the summary (which is its last attempt's)."""
    from rich.text import Text

    run = m.get("run") or {}
    if not run.get("attempts"):
        return []
    consumed = run.get("samples_consumed")
    lines = [Text(f"  run         {run['attempts']} attempt(s), to step {run['last_step']}"
                  + (f", {consumed} samples consumed" if consumed is not None else "")
                  + f", {run['steps_redone']} step(s) redone after a restart"
                  + (" (figures above: the last attempt)" if run["attempts"] > 1 else ""))]
    if run["attempts"] > 1:
        lines.append(Text(f"  goodput     {goodput_text(run, m.get('wall_s'))}"))
    if run["attempts"] > 1:
        lines += [Text(f"  attempt {a['attempt']:<3} {a['ranks']} rank(s) on {', '.join(a['hosts']) or '?'}: steps "
                       f"{a['resumed_at_step'] + 1}-{a['last_step']}") for a in m.get("attempts", [])]
    return lines


def goodput_text(run: Mapping[str, Any], wall_s: float | None) -> str:
    """``92% of 55.0 s wall time: 4.4 s lost to failures and restarts, 1 step(s) redone``."""
    share = run.get("goodput")
    return (f"{fmt_pct(share) if share is not None else '-'} of {fmt(wall_s, '.1f', ' s')} wall time: "
            f"{run['lost_s']:.1f} s lost to failures and restarts, {run['steps_redone']} step(s) redone")


def runs_on_gpus(job: JobRow) -> bool:
    """Whether the job's ranks ran on GPUs (its plan's process group is NCCL); a job planned on CPU slots is not."""
    return (job.plan or {}).get("dist_backend") == "nccl"


def _mfu_line(m: Mapping[str, Any], on_gpus: bool) -> str:
    if m["mfu"] is not None:
        return f"{fmt_pct(m['mfu'])} of {m['peak_tflops']:.0f} TFLOP/s per GPU ({m['gpu_name'] or 'gpu.peak_tflops'})"
    if not m["flops_per_sample"]:
        return "- (the program does not report FLOPs per sample)"
    if not on_gpus:
        return "- (CPU ranks: MFU is measured against a GPU's peak)"
    if m["peak_tflops"] is None:
        return "- (GPU peak unknown: set gpu.name or gpu.peak_tflops in the cluster spec)"
    return "-"
