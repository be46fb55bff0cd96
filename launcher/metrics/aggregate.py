"""Per-job summaries built from raw per-rank metric records.

Warm-up intervals are left out of throughput and step time (unless a run
was so short that it has nothing else). Step-time percentiles are taken over
reporting intervals: each record carries the mean step time of its interval,
measured without a device synchronisation on ordinary steps.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

MB = 1024 * 1024


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _steady(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    steady = [r for r in records if not r.get("warmup")]
    return steady or records


def summarize(records: list[dict[str, Any]], attempt: int | None = None) -> dict[str, Any]:
    """Job summary: throughput, step time p50/p95, peak memory, per-rank figures.

    Only the given ``attempt`` (default: the latest present) is summarised.
    """
    if attempt is None and records:
        attempt = max(r.get("attempt", 0) for r in records)
    records = [r for r in records if r.get("attempt", 0) == attempt]
    by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_rank[int(record.get("rank", 0))].append(record)

    per_rank = [_rank_summary(rank, rows) for rank, rows in sorted(by_rank.items())]
    steady = _steady(records)
    step_times = [r["step_time_s"] for r in steady if r.get("step_time_s") is not None]
    utils = [r["gpu_util"] for r in steady if r.get("gpu_util") is not None]
    tokens = sum(p["tokens_per_sec"] for p in per_rank) if per_rank else None
    flops = [r.get("flops_per_sample") for r in records if r.get("flops_per_sample")]
    return {
        "steps": max((r.get("step", 0) for r in records), default=0),
        "records": len(records),
        "samples_per_sec": sum(p["samples_per_sec"] for p in per_rank) if per_rank else None,
        "tokens_per_sec": tokens or None,
        "step_time_ms_p50": _ms(percentile(step_times, 50)),
        "step_time_ms_p95": _ms(percentile(step_times, 95)),
        "steps_per_sec": (1.0 / percentile(step_times, 50)) if step_times else None,
        "peak_mem_mb": max((p["peak_mem_mb"] for p in per_rank), default=None),
        "gpu_util": statistics.fmean(utils) if utils else None,
        "flops_per_sample": flops[-1] if flops else None,
        "loss": _last_loss(records),
        "per_rank": per_rank,
    }


def _rank_summary(rank: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    steady = _steady(rows)
    seconds = sum(r.get("interval_s", 0.0) for r in steady) or 1e-9
    step_times = [r["step_time_s"] for r in steady if r.get("step_time_s") is not None]
    last = rows[-1]
    return {
        "rank": rank,
        "node": last.get("node"),
        "host": last.get("host"),
        "samples_per_sec": sum(r.get("samples", 0) for r in steady) / seconds,
        "tokens_per_sec": sum(r.get("tokens", 0) for r in steady) / seconds,
        "step_time_ms_p50": _ms(percentile(step_times, 50)),
        "peak_mem_mb": max(r.get("mem_peak_bytes", 0) for r in rows) / MB,
        "steps": max(r.get("step", 0) for r in rows),
    }


def _last_loss(records: list[dict[str, Any]]) -> float | None:
    for record in reversed(records):
        if record.get("loss") is not None:
            return record["loss"]
    return None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0
