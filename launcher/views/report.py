"""`launch report`: one self-contained HTML file (inline CSS and SVG, no scripts, nothing fetched).

Sections: the comparison table, throughput over steps (samples/s of the whole
job), peak memory per rank, loss over steps, and per-job notes (failures,
stragglers). Plots are plain SVG built here, so the file opens offline in
any browser and can be attached to a ticket as is.
"""

from __future__ import annotations

import html
import math
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from launcher.metrics.columns import fmt
from launcher.metrics.record import MetricRecord, RankUsage
from launcher.store.rows import JobRow
from launcher.store.states import JobState
from launcher.views.compare import (
    TEXT_HEADERS,
    comparison,
    goodput_text,
    job_metrics,
    row_cells,
    table_headers,
)

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
WIDTH, HEIGHT = 960, 320
LEFT, RIGHT, BOTTOM = 70, 20, 50
LEGEND_ROW = 18

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px; color: #222; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; }
.meta { color: #666; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
th, td { padding: 4px 8px; border-bottom: 1px solid #ddd; text-align: right; white-space: nowrap; }
th { white-space: normal; vertical-align: bottom; }
th { background: #f3f3f3; } td.l, th.l { text-align: left; }
tr.failed td { color: #b00020; } tr.base td { font-weight: 600; }
.note { color: #b00020; } .warn { color: #a15c00; }
svg { display: block; max-width: 100%; height: auto; background: #fff; border: 1px solid #e4e4e4; }
svg text { font: 12px system-ui, sans-serif; fill: #333; }
"""


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [low, high].

    A range too narrow to divide (equal ends, or a difference lost in the floats' precision)
    is widened to [low, low + |low|] (or [low, low + 1]); non-finite ends give [0].
    """
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0]
    if high - low <= max(abs(low), abs(high)) * 1e-9 or high - low < 1e-300:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / count
    if not math.isfinite(raw) or raw <= 0:
        return [low]
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    ticks = [math.floor(low / step) * step]
    while ticks[-1] < high:
        ticks.append(ticks[0] + step * len(ticks))
    return [round(t, 10) if abs(step) >= 1e-9 else t for t in ticks]


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.0f}k"
    return f"{value:.4g}"


def _frame(title: str, xlabel: str, ylabel: str, xt: list[float], yt: list[float], sx, sy, top: int) -> list[str]:
    parts = [f'<text x="{LEFT}" y="22" style="font-weight:600;font-size:14px">{html.escape(title)}</text>']
    for y in yt:
        parts.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{_label(y)}</text>')
    for x in xt:
        parts.append(f'<text x="{sx(x):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{_label(x)}</text>')
    parts.append(
        f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{HEIGHT - BOTTOM}" y2="{HEIGHT - BOTTOM}" stroke="#999"/>'
        f'<line x1="{LEFT}" x2="{LEFT}" y1="{top}" y2="{HEIGHT - BOTTOM}" stroke="#999"/>'
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2}" y="{HEIGHT - 12}" text-anchor="middle">{html.escape(xlabel)}</text>'
        f'<text transform="translate(16 {(top + HEIGHT - BOTTOM) / 2}) rotate(-90)" text-anchor="middle">'
        f"{html.escape(ylabel)}</text>"
    )
    return parts


def _legend(labels: list[str]) -> tuple[list[str], int]:
    """Legend entries flowing left to right under the title; (SVG parts, top of the plot area)."""
    parts, x, y = [], LEFT, 40
    for index, label in enumerate(labels):
        width = 16 + 7 * len(label) + 18
        if x + width > WIDTH - RIGHT and x > LEFT:
            x, y = LEFT, y + LEGEND_ROW
        parts.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{PALETTE[index % len(PALETTE)]}"/>')
        parts.append(f'<text x="{x + 16}" y="{y}">{html.escape(label)}</text>')
        x += width
    return parts, y + 14


def _svg(parts: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" aria-label="{html.escape(title)}">' + "".join(parts) + "</svg>"
    )


def _empty(title: str) -> str:
    return _svg([f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">{html.escape(title)}: no data</text>'], title)


def line_chart(
    title: str, series: list[tuple[str, list[tuple[float, float]]]], xlabel: str, ylabel: str, zero: bool = True
) -> str:
    """An SVG line chart: one polyline (with point markers) per (label, points) series."""
    points = [p for _, pts in series for p in pts]
    if not points:
        return _empty(title)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    xt = nice_ticks(min(xs), max(xs))
    yt = nice_ticks(0.0 if zero else min(ys), max(ys))
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]
    legend, top = _legend([label for label, _ in series])
    sx = lambda x: LEFT + (x - x0) / ((x1 - x0) or 1) * (WIDTH - LEFT - RIGHT)  # noqa: E731
    sy = lambda y: HEIGHT - BOTTOM - (y - y0) / ((y1 - y0) or 1) * (HEIGHT - top - BOTTOM)  # noqa: E731
    parts = _frame(title, xlabel, ylabel, xt, yt, sx, sy, top) + legend
    for index, (_, pts) in enumerate(series):
        color = PALETTE[index % len(PALETTE)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
        parts.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>' for x, y in pts)
    return _svg(parts, title)


def bar_chart(title: str, categories: list[str], series: list[tuple[str, list[float | None]]], xlabel: str, ylabel: str) -> str:
    """An SVG grouped bar chart: one group per category, one bar per (label, values) series."""
    values = [v for _, vals in series for v in vals if v is not None]
    if not values or not categories:
        return _empty(title)
    yt = nice_ticks(0.0, max(values))
    y1 = yt[-1] or 1.0
    group = (WIDTH - LEFT - RIGHT) / len(categories)
    bar = group * 0.8 / len(series)
    legend, top = _legend([label for label, _ in series])
    sx = lambda i: LEFT + group * (i + 0.5)  # noqa: E731
    sy = lambda y: HEIGHT - BOTTOM - y / y1 * (HEIGHT - top - BOTTOM)  # noqa: E731
    parts = _frame(title, xlabel, ylabel, [], yt, sx, sy, top) + legend
    for i, category in enumerate(categories):
        parts.append(f'<text x="{sx(i):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="middle">{html.escape(category)}</text>')
        for j, (label, vals) in enumerate(series):
            if i < len(vals) and vals[i] is not None:
                x = LEFT + group * i + group * 0.1 + bar * j
                parts.append(
                    f'<rect x="{x:.1f}" y="{sy(vals[i]):.1f}" width="{bar * 0.92:.1f}" '
                    f'height="{HEIGHT - BOTTOM - sy(vals[i]):.1f}" fill="{PALETTE[j % len(PALETTE)]}">'
                    f"<title>{html.escape(label)} {html.escape(category)}: {vals[i]:.1f}</title></rect>"
                )
    return _svg(parts, title)


def _latest(records: Sequence[MetricRecord], attempt: int | None = None) -> list[MetricRecord]:
    attempt = max((r.attempt for r in records), default=0) if attempt is None else attempt
    return [r for r in records if r.attempt == attempt]


def throughput_series(records: Sequence[MetricRecord], attempt: int | None = None) -> list[tuple[float, float]]:
    """(step, job samples/s): the ranks' samples/s summed at each reporting step of ``attempt`` (default: the last)."""
    total: dict[int, float] = defaultdict(float)
    for record in _latest(records, attempt):
        if record.samples_per_sec is not None:
            total[record.step] += record.samples_per_sec
    return sorted(total.items())


def loss_series(records: Sequence[MetricRecord], attempt: int | None = None) -> list[tuple[float, float]]:
    """(step, loss averaged over the ranks that reported one) of ``attempt`` (default: the last)."""
    losses: dict[int, list[float]] = defaultdict(list)
    for record in _latest(records, attempt):
        if record.loss is not None:
            losses[record.step].append(record.loss)
    return sorted((step, sum(v) / len(v)) for step, v in losses.items())


def _series_label(job: JobRow) -> str:
    return f"{job.id} ({job.strategy or 'entrypoint'})"


def attempt_series(job: JobRow, records: Sequence[MetricRecord], series) -> list[tuple[str, list[tuple[float, float]]]]:
    """One curve an attempt (a job that restarted shows where each attempt ran, and the steps a restart redid), or
    the job's one curve."""
    attempts = sorted({r.attempt for r in records})
    if len(attempts) < 2:
        return [(_series_label(job), series(records))]
    return [(f"{_series_label(job)}, attempt {a}{' (restarted)' if a else ''}", series(records, a)) for a in attempts]


STORY_EVENTS = ("restarting", "no_restart", "elastic_restart", "node_left_out")  # how an attempt ended, what the next changed


def _story(job: JobRow, metrics: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> str:
    """A job's attempts (ranks, hosts, steps), how each ended and what the next changed (lost nodes, re-plans), and
    its goodput; empty for a job of one attempt without restarts."""
    told = [e for e in events if e.get("kind") in STORY_EVENTS]
    attempts = metrics.get("attempts") or []
    if len(attempts) < 2 and not told:
        return ""
    name = html.escape(job.id)
    rows = "".join(
        f'<tr><td>{a["attempt"]}</td><td>{a["ranks"]}</td><td class="l">{html.escape(", ".join(a["hosts"]) or "?")}</td>'
        f'<td>{a["resumed_at_step"] + 1}-{a["last_step"]}</td><td>{fmt(a["samples_consumed"], "d")}</td></tr>'
        for a in attempts)
    table = ('<div class="scroll"><table><thead><tr><th>ATTEMPT</th><th>RANKS</th><th class="l">HOSTS</th><th>STEPS</th>'
             f"<th>SAMPLES CONSUMED</th></tr></thead><tbody>{rows}</tbody></table></div>")
    items = "".join(f'<li class="{"warn" if e["kind"] in ("elastic_restart", "node_left_out") else "note"}">'
                    f'{html.escape(str(e.get("message", "")))}</li>' for e in told)
    run = metrics.get("run") or {}
    good = (f"<p>Goodput: {html.escape(goodput_text(run, metrics.get('wall_s')))}.</p>"
            if run.get("attempts", 0) > 1 else "")
    return f"<h3>{name}</h3>{table}<ul>{items}</ul>{good}"


def _table(rows: list[dict[str, Any]]) -> str:
    left = set(TEXT_HEADERS)
    headers = table_headers()
    head = "".join(f'<th class="{"l" if h in left else ""}">{html.escape(h)}</th>' for h in headers)
    body = []
    for row in rows:
        cells = row_cells(row)
        klass = "failed" if row["state"] == JobState.FAILED else "base" if row.get("baseline") else ""
        tds = "".join(
            f'<td class="{"l" if h in left else ""}">{html.escape(str(c))}</td>' for c, h in zip(cells, headers)
        )
        body.append(f'<tr class="{klass}">{tds}</tr>')
    return f"<div class=\"scroll\"><table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"


def _notes(rows: list[dict[str, Any]], metrics: dict[str, dict[str, Any]], restarted: bool = False) -> str:
    notes = []
    for row in rows:
        name = html.escape(str(row["job"] or row["strategy"] or "?"))
        if row["state"] in (JobState.FAILED, JobState.CANCELLED):
            reason = html.escape(str(row["reason"] or "no reason recorded"))
            notes.append(f'<li class="note">{name}: {html.escape(str(row["state"]).lower())}: {reason}</li>')
        for rank in (metrics.get(row["job"]) or {}).get("per_rank", []):
            if rank["straggler"]:
                notes.append(
                    f'<li class="warn">{name}: straggler rank {rank["rank"]} on {html.escape(str(rank["host"]))}: '
                    f'{rank["slowdown"] - 1:.0%} slower than the median rank</li>'
                )
    if restarted:
        notes.append('<li class="note">Attempts failed and restarted: see Attempts below.</li>')
    return f"<ul>{''.join(notes)}</ul>" if notes else "<p>No failures or stragglers.</p>"


def build_report(entries: Sequence[tuple[JobRow, Sequence[MetricRecord]]], rows: list[dict[str, Any]] | None = None,
                 title: str = "launch report", usage: Mapping[str, Sequence[RankUsage]] | None = None,
                 events: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> str:
    """The HTML report for (job row, records) pairs; ``rows`` overrides the comparison rows.

    ``usage`` (by job id) adds the node agents' process samples: peak memory of ranks without the Reporter;
    ``events`` (by job id) the story of a job that restarted: how each attempt ended, the nodes lost, the re-plans.
    """
    usage = usage or {}
    metrics = {job.id: job_metrics(job, records, usage=usage.get(job.id, ())) for job, records in entries}
    if rows is None:
        rows = comparison([(job, metrics[job.id]) for job, _ in entries])
    throughput = [curve for job, records in entries for curve in attempt_series(job, records, throughput_series)]
    loss = [curve for job, records in entries for curve in attempt_series(job, records, loss_series)]
    stories = "".join(_story(job, metrics[job.id], (events or {}).get(job.id, ())) for job, _ in entries)
    ranks = sorted({r["rank"] for m in metrics.values() for r in m["per_rank"]})
    memory = []
    for job, _ in entries:
        peaks = {r["rank"]: r["peak_mem_mb"] for r in metrics[job.id]["per_rank"]}
        memory.append((_series_label(job), [peaks.get(rank) for rank in ranks]))
    jobs = ", ".join(html.escape(job.id) for job, _ in entries) or "none"
    return "\n".join([
        "<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="meta">Jobs: {jobs}. Generated {time.strftime("%Y-%m-%d %H:%M:%S")}. '
        "Throughput and step time leave out warm-up steps; speed-up is samples/s and memory ratio is peak memory of "
        "the largest rank (a GPU's on GPU nodes), "
        "each against the baseline (the first job with metrics).</p>",
        "<h2>Comparison</h2>", _table(rows), _notes(rows, metrics, bool(stories)),
        *(["<h2>Attempts</h2>", stories] if stories else []),
        "<h2>Throughput over steps</h2>",
        line_chart("Job throughput (all ranks)", throughput, "step", "samples/s"),
        "<h2>Peak memory per rank</h2>",
        bar_chart("Peak memory per rank", [f"rank {r}" for r in ranks], memory, "rank", "MB"),
        "<h2>Loss</h2>",
        line_chart("Loss (mean over ranks)", loss, "step", "loss", zero=False),
        "</body></html>",
    ])
