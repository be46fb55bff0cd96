"""Store rows read back defensively as typed values (``JobRow``, ``NodeRow``), and values written as strict JSON.

Every view renders any stored row: in a job row a value of the wrong type, a JSON column that
does not parse or a NaN reads as unknown (None). Standard library only: `launch status` reads every row.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import Any, TypeVar

from launcher.store.states import FailureKind, JobState, NodeState

E = TypeVar("E", bound=Enum)

JSON_COLUMNS = ("first_failure", "plan", "spec", "summary")


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


def int_or_none(value: Any) -> int | None:
    return None if isinstance(value, bool) or not isinstance(value, int) else value


def _dict_or_none(text: Any) -> dict[str, Any] | None:
    value = json_value(text)
    return value if isinstance(value, dict) else None


def _enum_or_none(kind: type[E], value: Any) -> E | None:
    try:
        return kind(value)
    except ValueError:
        return None


@dataclass(frozen=True)
class JobRow:
    """One job as the store keeps it, each column of its type. A value of the wrong type, a JSON column that is not
    an object, a state or failure kind this launch does not know, reads as None; ``store.jobs`` leaves out ``plan``
    and ``spec`` (None)."""

    id: str
    name: str | None
    state: JobState | None
    created_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    backend: str | None = None
    cluster: str | None = None
    launcher: str | None = None
    strategy: str | None = None
    precision: str | None = None
    nnodes: int | None = None
    nproc_per_node: int | None = None
    world_size: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    global_batch: int | None = None
    max_steps: int | None = None
    attempt: int | None = None
    run_dir: str | None = None
    supervisor_pid: int | None = None
    supervisor_at: float | None = None
    reason: str | None = None
    failure_kind: FailureKind | None = None
    queue_reason: str | None = None
    scheduler_id: str | None = None
    user: str | None = None
    first_failure: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None
    spec: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None

    @classmethod
    def read(cls, row: sqlite3.Row) -> JobRow:
        got = {key: row[key] for key in row.keys()}  # noqa: SIM118 - sqlite3.Row iterates values
        values: dict[str, Any] = {}
        for column in fields(cls):
            if column.name not in got:
                continue
            value, kind = got[column.name], column.type
            if column.name == "state":
                values["state"] = _enum_or_none(JobState, value)
            elif column.name == "failure_kind":
                values["failure_kind"] = _enum_or_none(FailureKind, value)
            elif "dict" in kind:
                values[column.name] = _dict_or_none(value)
            elif kind.startswith("int"):
                values[column.name] = int_or_none(value)
            elif kind.startswith("float"):
                values[column.name] = finite_or_none(value)
            else:
                values[column.name] = text_or_none(value)
        values["id"] = values.get("id") or ""
        return cls(**values)

    @property
    def terminal(self) -> bool:
        """Whether the job has ended (a state this launch does not know has not)."""
        return self.state is not None and self.state.terminal


@dataclass(frozen=True)
class NodeRow:
    """One node of one attempt of a job, as the store keeps it (see ``JobRow`` for values of the wrong type)."""

    job_id: str
    attempt: int | None
    node: int | None
    host: str | None = None
    address: str | None = None
    state: NodeState | None = None
    pid: int | None = None
    exit_code: int | None = None
    log_path: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    seen: int | None = None
    log_bytes: int | None = None
    start_ticks: int | None = None

    @classmethod
    def read(cls, row: sqlite3.Row) -> NodeRow:
        got = {key: row[key] for key in row.keys()}  # noqa: SIM118 - sqlite3.Row iterates values
        return cls(
            job_id=text_or_none(got["job_id"]) or "", attempt=int_or_none(got["attempt"]), node=int_or_none(got["node"]),
            host=text_or_none(got.get("host")), address=text_or_none(got.get("address")),
            state=_enum_or_none(NodeState, got.get("state")), pid=int_or_none(got.get("pid")),
            exit_code=int_or_none(got.get("exit_code")), log_path=text_or_none(got.get("log_path")),
            started_at=finite_or_none(got.get("started_at")), ended_at=finite_or_none(got.get("ended_at")),
            seen=int_or_none(got.get("seen")), log_bytes=int_or_none(got.get("log_bytes")),
            start_ticks=int_or_none(got.get("start_ticks")),
        )

    def as_json(self) -> dict[str, Any]:
        """The node as ``status --json`` lists it under ``nodes``."""
        return asdict(self)
