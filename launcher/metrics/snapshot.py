"""Where a running job is, from its metric records: one pure function (``snapshot``) and the texts shown.

The records are untrusted rank output: a value that is not a finite, non-negative number is left out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Snapshot:
    """Where a running job is, from its metric records (``snapshot()``)."""

    step: int | None
    max_steps: int | None
    samples_per_sec: float | None
    slowest_rank: int | None
    slowest_step_s: float | None
    peak_mem_bytes: int | None
    loss: float | None
    ranks: int
    elapsed_s: float
    eta_s: float | None


def _number(record: Mapping[str, Any], key: str) -> float | None:
    """A finite, non-negative number from an untrusted record, else None."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _whole(record: Mapping[str, Any], key: str) -> int | None:
    value = record.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _fields(record: Any) -> Mapping[str, Any]:
    """A stored MetricRecord (or a mapping with its keys) as a mapping that includes its attempt."""
    if isinstance(record, Mapping):
        return record
    return {**record.to_wire(), "attempt": record.attempt}


def snapshot(records: Iterable[Any], max_steps: int | None, started_at: float, now: float) -> Snapshot:
    """The job's progress from its raw metric records (latest attempt only).

    step: the lowest of the ranks' latest steps; samples/s: the sum of the ranks' latest rates;
    slowest rank: the longest latest step time, which also paces the ETA; peak memory: the
    highest any rank reported. Records without a valid rank and step are ignored.
    """
    latest: dict[int, Mapping[str, Any]] = {}
    peak: float | None = None
    loss: float | None = None
    attempt = -1
    for record in map(_fields, records):
        rank, step, this_attempt = _whole(record, "rank"), _whole(record, "step"), _whole(record, "attempt") or 0
        if rank is None or step is None or this_attempt < attempt:
            continue
        if this_attempt > attempt:
            attempt, latest, peak, loss = this_attempt, {}, None, None
        if rank not in latest or step >= latest[rank]["step"]:
            latest[rank] = record
        memory = _number(record, "mem_peak_bytes")
        peak = memory if peak is None or (memory is not None and memory > peak) else peak
        value = record.get("loss")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            loss = float(value)
    elapsed = max(0.0, now - started_at)
    if not latest:
        return Snapshot(None, max_steps, None, None, None, None, None, 0, elapsed, None)
    step = min(r["step"] for r in latest.values())
    rates = [_number(r, "samples_per_sec") for r in latest.values()]
    times = [(t, rank) for rank, r in latest.items() if (t := _number(r, "step_time_s")) is not None]
    slowest_s, slowest_rank = max(times) if times else (None, None)
    eta = None
    if max_steps:
        eta = 0.0 if step >= max_steps else (max_steps - step) * slowest_s if slowest_s is not None else None
    return Snapshot(
        step, max_steps, sum(r for r in rates if r is not None) if any(r is not None for r in rates) else None,
        slowest_rank, slowest_s, int(peak) if peak is not None else None, loss, len(latest), elapsed, eta,
    )


def duration(seconds: float) -> str:
    """h:mm:ss, to the nearest second."""
    whole = round(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _memory(nbytes: int) -> str:
    return f"{nbytes / 2**30:.1f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def step_text(snap: Snapshot) -> str:
    """``step 30/60`` (or ``step 30`` without a step limit)."""
    step = snap.step or 0
    return f"step {step}/{snap.max_steps}" if snap.max_steps else f"step {step}"


def timing(snap: Snapshot) -> list[str]:
    """What goes beside the bar: percent done, elapsed, ETA."""
    parts = []
    if snap.max_steps and snap.step is not None:
        parts.append(f"{min(100, 100 * snap.step // snap.max_steps)}%")
    parts.append(f"elapsed {duration(snap.elapsed_s)}")
    if snap.eta_s is not None:
        parts.append(f"ETA {duration(snap.eta_s)}")
    return parts


def figures(snap: Snapshot) -> list[str]:
    """What goes under the bar: samples/s, the slowest rank, peak memory, loss."""
    if snap.step is None:
        return ["no metric records yet"]
    parts = []
    if snap.samples_per_sec is not None:
        parts.append(f"{_rate(snap.samples_per_sec)} samples/s")
    if snap.slowest_rank is not None and snap.slowest_step_s is not None and snap.ranks > 1:  # set together
        parts.append(f"slowest rank {snap.slowest_rank} ({snap.slowest_step_s * 1000:.0f} ms/step)")
    if snap.peak_mem_bytes is not None:
        parts.append(f"peak mem {_memory(snap.peak_mem_bytes)}")
    if snap.loss is not None:
        parts.append(f"loss {snap.loss:.4g}")
    return parts


def summary_line(snap: Snapshot) -> str:
    """The plain-mode summary: ``[progress] step 30/60  50%  elapsed 0:00:30  ETA 0:00:30  120 samples/s ...``."""
    return "  ".join([f"[progress] {step_text(snap)}", *timing(snap), *figures(snap)])


def with_elapsed(snap: Snapshot, elapsed: float) -> Snapshot:
    """The snapshot with the elapsed time of now (between reads of the store); the ETA counts down with it."""
    ticked = max(0.0, elapsed - snap.elapsed_s)
    eta = None if snap.eta_s is None else max(0.0, snap.eta_s - ticked)
    return dataclasses.replace(snap, elapsed_s=max(elapsed, snap.elapsed_s), eta_s=eta)
