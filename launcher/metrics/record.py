"""Metric records as the supervisor accepts them (interim: the typed model lands with the metrics rework)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from launcher.metrics.reporter import MARKER, RECORD_VERSION

MAX_INT = 2**62
NUMERIC = ("t", "steps", "local_rank", "interval_s", "step_time_s", "samples", "tokens", "samples_per_sec",
           "tokens_per_sec", "loss", "mem_peak_bytes", "gpu_util", "flops_per_sample")


@dataclass(frozen=True)
class Rejected:
    reason: str


def parse_line(text: str, *, world_size: int, node: int, host: str) -> dict[str, Any] | Rejected | None:
    """The record a rank's line carries (node and host from the channel, not the line), Rejected, or None."""
    at = text.find(MARKER)
    if at < 0:
        return None
    try:
        record = json.loads(text[at + len(MARKER):], parse_constant=lambda name: float("nan"))
    except ValueError as exc:
        return Rejected(f"not JSON: {exc}")
    if not isinstance(record, dict) or record.get("v") != RECORD_VERSION:
        return Rejected("not a version-1 record object")
    rank, step = record.get("rank"), record.get("step")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        return Rejected(f"rank {rank!r} is not an integer in [0, {world_size})")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < MAX_INT:
        return Rejected(f"step {step!r} is not a non-negative integer")
    for key in NUMERIC:
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return Rejected(f"{key}: {str(value)[:40]!r} is not a number")
    for key, value in record.items():
        if isinstance(value, bool) or value is None or isinstance(value, str) and len(value) <= 256:
            continue
        if isinstance(value, int) and abs(value) < MAX_INT or isinstance(value, float) and math.isfinite(value):
            continue
        return Rejected(f"{key}: {str(value)[:40]!r} is not a finite number or a short string")
    return {**record, "node": node, "host": host}
