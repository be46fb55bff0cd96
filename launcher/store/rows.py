"""Store rows read back defensively, and values written as strict JSON.

Every view renders any stored row: in a job row a value of the wrong type, a JSON column that
does not parse or a NaN reads as unknown (None).
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Mapping
from typing import Any

JSON_COLUMNS = ("first_failure", "plan", "spec", "summary")
INT_COLUMNS = ("nnodes", "nproc_per_node", "world_size", "micro_batch", "grad_accum", "global_batch", "max_steps",
               "attempt", "supervisor_pid")
TIME_COLUMNS = ("created_at", "started_at", "ended_at", "supervisor_at")
TEXT_COLUMNS = ("id", "name", "state", "backend", "cluster", "launcher", "strategy", "precision", "run_dir", "reason",
                "queue_reason", "scheduler_id")


def json_text(value: Any) -> str:
    """JSON text for a column (see ``json_safe``)."""
    return json.dumps(json_safe(value), separators=(",", ":"), allow_nan=False)


def json_safe(value: Any) -> Any:
    """``value`` as strict JSON data: objects with ``as_json`` as their JSON, NaN and infinities as null."""
    if hasattr(value, "as_json"):
        value = value.as_json()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def json_value(text: Any) -> Any:
    """A JSON column's value; None when it does not parse. NaN, infinities and out-of-range numbers read as None."""
    if not isinstance(text, (str, bytes)) or not text:
        return None
    try:
        return json.loads(text, parse_constant=lambda _: None, parse_float=_parse_float)
    except (ValueError, RecursionError):
        return None


def _parse_float(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def finite_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def text_or_none(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def job_dict(row: sqlite3.Row) -> dict[str, Any]:
    """A job row with each column of its expected type (a JSON column that is not an object, or junk, reads as None)."""
    job = dict(row)
    for key in JSON_COLUMNS:
        if key in job:
            value = json_value(job[key])
            job[key] = value if isinstance(value, dict) else None
    for key in INT_COLUMNS:
        if key in job and (isinstance(job[key], bool) or not isinstance(job[key], int)):
            job[key] = None
    for key in TIME_COLUMNS:
        if key in job:
            job[key] = finite_or_none(job[key])
    for key in TEXT_COLUMNS:
        if key in job:
            job[key] = text_or_none(job[key])
    return job
