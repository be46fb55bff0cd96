"""The records launch keeps about a job's ranks, each one typed and bounded value.

``MetricRecord``: what a rank reports through the Reporter, one marked stdout line
(``@@launch {json}``, version 1). It is rank output, so untrusted: ``parse_line``
turns a line into a record only if the whole line is the record (the marker first,
the JSON to the end: a debug print that merely contains the marker is output) and
every value is of its type and within its bounds (finite numbers, counts within
SQLite's integers and below sane caps, short strings, a few program-added extra
keys), else into a ``Rejected`` with a one-line reason. Who reported it comes from
the channel, never from the JSON: the rank is the one whose stream the line came
on (the ``[rank]: `` prefix torchrun and the node side put on each rank's lines, or
the caller's ``rank=`` when it reads one rank's stream), the node and host are the
caller's, and the store sets the job and attempt. A record whose ``rank`` names
another rank than its stream is dropped.

``ProcessSample``: what the node agent measures of a rank's process tree from
outside (CPU time, RSS, GPU memory and utilisation); ``RankUsage`` is what the
store keeps of them per rank and attempt (the latest sample, the peaks, the
mean utilisation).

This module imports only the standard library: `launch status` reads stored
records with ``MetricRecord.from_stored``, which never raises: a row that would
not validate is left out and a NaN (as older launches stored) reads as unknown,
so any stored row renders. Validation of untrusted
input (``parse_line``, ``parse_samples``, ``check_extra``) uses pydantic,
imported on first use; the bounds it enforces are the ``Bound`` marks of the
field types (``bounds``).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from typing import Annotated, Any

from launcher.metrics.bounds import (
    INT64_MAX,
    MAX_EXTRA_KEYS,
    MAX_KEY_CHARS,
    MAX_MAGNITUDE,
    MAX_RANKS,
    MAX_SECONDS,
    MAX_TEXT_CHARS,
    Bound,
    Bytes,
    Count,
    Extras,
    Flops,
    Fraction,
    Index,
    Number,
    Rate,
    Seconds,
    Text,
    Timestamp,
    clean_value,
    read_fields,
)
from launcher.node import rankrelay

MARKER = "@@launch "
# what torchrun (the plan's prefix template) and the node side (rankrelay) put before each rank's line
RANK_PREFIX = re.compile(rankrelay.PREFIX_PATTERN)
RECORD_VERSION = 1

MAX_RECORD_CHARS = 16 * 1024  # the JSON text of one record; a valid record is far smaller

FINITE_ONLY = {"allow_inf_nan": False}  # pydantic's config, as a plain dict: no import needed here


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class MetricRecord:
    """One reporting interval of one rank (fields in the order `launch metrics --csv` shows them)."""

    __pydantic_config__ = FINITE_ONLY

    job: Text = ""  # set by the store (the job the channel belongs to)
    attempt: Count = 0  # set by the store
    node: Index | None = None  # from the channel, never from the line
    rank: Index
    local_rank: Index | None = None
    host: Text | None = None  # from the channel, never from the line
    step: Count
    t: Timestamp | None = None
    warmup: bool = False
    steps: Count = 0
    interval_s: Seconds = 0.0
    step_time_s: Seconds | None = None
    samples: Count = 0
    tokens: Count = 0
    samples_per_sec: Rate | None = None
    tokens_per_sec: Rate | None = None
    loss: Number | None = None
    mem_peak_bytes: Bytes | None = None
    gpu_util: Fraction | None = None
    flops_per_sample: Flops | None = None
    gpu_name: Text | None = None
    observed: bool = False  # by launch's step hooks (``launcher.node.stephooks``), not reported by the program
    ended: bool = False  # the rank's program returned (its Python began to shut down): its last record
    extra: Extras = dataclasses.field(default_factory=dict)  # program-added keys (Reporter(extra=...))

    def to_wire(self) -> dict[str, Any]:
        """The record as the Reporter writes it (and the store keeps it): version 1 keys, extras at the top level."""
        data: dict[str, Any] = {"v": RECORD_VERSION}
        for name in WIRE_FIELDS:
            data[name] = getattr(self, name)
        if not self.observed:  # the Reporter's records keep version 1's keys as they were
            del data["observed"]
        if not self.ended:
            del data["ended"]
        data.update(self.extra)
        return data

    def number(self, name: str) -> float | None:
        """The value of a field or extra key when it is a number (not a flag or a text), else None."""
        value = getattr(self, name) if name in RECORD_FIELDS else self.extra.get(name)
        return None if isinstance(value, bool) or not isinstance(value, (int, float)) else value

    @classmethod
    def from_stored(cls, data: Mapping[str, Any], attempt: int | None = None) -> MetricRecord | None:
        """A stored record; None if one of its values is of the wrong type or out of bounds.

        NaN and infinities (which launches before the record model stored) read as unknown;
        program-added keys that would not validate are left out.
        """
        values = read_fields(cls, data)
        if values is None:
            return None
        if attempt is not None:
            values["attempt"] = attempt
        values["extra"] = _read_extras(data)
        return cls(**values)


RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(MetricRecord)) - {"extra"}
ORIGIN_FIELDS = frozenset({"job", "attempt", "node", "host", "rank"})  # never taken from a rank's line
WIRE_FIELDS = tuple(f.name for f in dataclasses.fields(MetricRecord) if f.name not in ("attempt", "extra"))
CSV_FIELDS = tuple(f.name for f in dataclasses.fields(MetricRecord) if f.name != "extra")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ProcessSample:
    """One look by the node agent at one rank's process tree (GPU figures None on CPU nodes)."""

    __pydantic_config__ = FINITE_ONLY

    node: Index
    rank: Index
    host: Text | None = None
    t: Timestamp
    pid: Annotated[int, Bound(1, INT64_MAX)]
    cpu_s: Annotated[float, Bound(0, MAX_SECONDS * 1e3)]  # cumulative CPU seconds of the whole tree
    rss_bytes: Bytes  # the memory the rank's processes use: PSS, not RSS, despite the name (``node.proctree``)
    rss_peak_bytes: Bytes
    gpu_mem_bytes: Bytes | None = None
    gpu_util: Fraction | None = None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RankUsage:
    """What the store keeps of one rank's samples in one attempt: the latest, the peaks, the mean utilisation."""

    attempt: Count = 0
    node: Index | None = None
    rank: Index
    host: Text | None = None
    t: Timestamp | None = None
    pid: Annotated[int, Bound(1, INT64_MAX)] | None = None
    cpu_s: Annotated[float, Bound(0, MAX_SECONDS * 1e3)] | None = None
    rss_bytes: Bytes | None = None
    rss_peak_bytes: Bytes | None = None
    gpu_mem_bytes: Bytes | None = None
    gpu_mem_peak_bytes: Bytes | None = None
    gpu_util_mean: Fraction | None = None
    samples: Count = 0

    @property
    def peak_mem_bytes(self) -> int | None:
        """The sampled peak: GPU memory in use on GPU nodes, the tree's RSS on CPU nodes."""
        return self.gpu_mem_peak_bytes if self.gpu_mem_peak_bytes is not None else self.rss_peak_bytes

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> RankUsage | None:
        """A stored row; None if one of its values is of the wrong type or out of bounds."""
        values = read_fields(cls, data)
        return None if values is None else cls(**values)


@dataclasses.dataclass(frozen=True)
class Rejected:
    """A marked line that is not a valid record: dropped, counted, and its reason shown once."""

    reason: str


@dataclasses.dataclass
class RejectedCount:
    """Rejected lines of one attempt: how many, and the first reason (the one warning worth showing)."""

    count: int = 0
    first: str | None = None

    def add(self, rejected: Rejected) -> str | None:
        """Count one; the warning line to show for the first, None afterwards."""
        self.count += 1
        if self.first is not None:
            return None
        self.first = rejected.reason
        return f"metric record dropped: {rejected.reason} (later drops are counted, not shown)"


def parse_line(
    text: str, *, world_size: int, node: int | None, host: str | None, rank: int | None = None,
) -> MetricRecord | Rejected | None:
    """The metric record a line of rank output carries; None for ordinary output.

    ``rank`` is the rank whose own stream ``text`` was read from, when the caller knows it; else the
    line's ``[rank]: `` prefix says it, and a marked line with neither is dropped (it came on no rank's
    stream). Only a whole line is a record: the marker first, after the prefix. ``world_size`` bounds
    the rank; ``node`` and ``host`` are those of the channel (the line's own ``node``, ``host`` and
    ``job`` are ignored). Never raises.
    """
    if rank is None:
        prefix = RANK_PREFIX.match(text)
        if prefix is not None:
            rank, text = int(prefix[1]), text[prefix.end():]
    if not text.startswith(MARKER):
        return None
    if rank is None:
        return Rejected("a record on no rank's stream (a line without a [rank]: prefix)")
    if rank >= world_size:
        return Rejected(f"a record on the stream of rank {rank}, which is not in this job (world size {world_size})")
    payload = text[len(MARKER):]
    if len(payload) > MAX_RECORD_CHARS:
        return Rejected(f"record of {len(payload)} characters (limit {MAX_RECORD_CHARS})")
    from pydantic_core import from_json

    try:
        data = from_json(payload)
    except ValueError as exc:
        return Rejected(f"not JSON ({_short(str(exc))})")
    if not isinstance(data, dict):
        return Rejected(f"not a JSON object ({type(data).__name__})")
    if data.get("v") != RECORD_VERSION:
        return Rejected(f"record version {_short(repr(data.get('v')))}; this launch reads version {RECORD_VERSION}")
    claimed = data.get("rank", rank)
    if claimed != rank or isinstance(claimed, bool):
        return Rejected(f"a record claiming rank {_short(repr(claimed))} on the stream of rank {rank}")
    fields = {k: v for k, v in data.items() if k in RECORD_FIELDS and k not in ORIGIN_FIELDS}
    extra = {k: v for k, v in data.items() if k not in RECORD_FIELDS and k != "v"}
    return _validate(MetricRecord, {**fields, "extra": extra, "node": node, "host": host, "rank": rank})


def parse_samples(data: Any, *, world_size: int, node: int, host: str | None) -> list[ProcessSample | Rejected]:
    """The node agent's sample event (``{"t": T, "ranks": [{rank, pid, cpu_s, rss_bytes, ...}]}``) as typed samples."""
    if not isinstance(data, dict) or not isinstance(data.get("ranks"), list):
        return [Rejected("a sample event needs a list 'ranks'")]
    names = {f.name for f in dataclasses.fields(ProcessSample)} - {"node", "host"}
    out: list[ProcessSample | Rejected] = []
    for entry in data["ranks"][:MAX_RANKS]:
        if not isinstance(entry, dict):
            out.append(Rejected("a sampled rank is not a JSON object"))
            continue
        values = {k: v for k, v in entry.items() if k in names}
        values.setdefault("t", data.get("t"))
        sample = _validate(ProcessSample, {**values, "node": node, "host": host})
        if isinstance(sample, ProcessSample) and sample.rank >= world_size:
            sample = Rejected(f"sampled rank {sample.rank} is not in this job (world size {world_size})")
        out.append(sample)
    return out


def check_extra(extra: Mapping[str, Any]) -> dict[str, Any]:
    """Program-added record keys, validated as a record would validate them; ValueError with the reason if not."""
    clash = sorted(set(extra) & (RECORD_FIELDS | {"v"}))
    if clash:
        raise ValueError(f"extra keys {clash} are record fields; choose other names")
    result = _validate(MetricRecord, {"rank": 0, "step": 0, "extra": dict(extra)})
    if isinstance(result, Rejected):
        raise ValueError(result.reason)
    return result.extra


@functools.cache
def _adapter(kind: type) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(kind)


def _validate(kind: type, values: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    try:
        return _adapter(kind).validate_python(values)
    except ValidationError as exc:
        return Rejected(_reason(exc))


def _reason(exc: Any) -> str:
    """One line from pydantic's first error: which key, what was wrong, what was given."""
    error = exc.errors(include_url=False)[0]
    loc = [str(part) for part in error["loc"]]
    got = f" (got {_short(repr(error.get('input')))})"
    if loc[:1] == ["extra"]:
        if len(loc) == 1:
            return f"more than {MAX_EXTRA_KEYS} program-added keys"
        if loc[2:3] == ["[key]"]:
            return f"key {_short(repr(loc[1]))}: names are letters, digits and _, at most {MAX_KEY_CHARS} characters"
        return (f"{_short(repr(loc[1]))}: a program-added value must be a boolean, a number within +-{MAX_MAGNITUDE:g} "
                f"or a text of at most {MAX_TEXT_CHARS} characters{got}")
    where = ".".join(loc)
    if error["type"] == "missing":
        return f"'{where}' is missing"
    message = error["msg"]
    ctx = error.get("ctx") or {}
    for key, text in (("le", "at most"), ("ge", "at least")):
        if isinstance(ctx.get(key), (int, float)):
            message = f"must be {text} {ctx[key]:.6g}"
    return f"'{where}': {message}{got}"


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_extras(data: Mapping[str, Any]) -> dict[str, Any]:
    """The program-added keys of a stored record, by the bounds they were validated with; others are left out."""
    extras: dict[str, Any] = {}
    for key, value in data.items():
        if len(extras) >= MAX_EXTRA_KEYS:
            break
        if key in RECORD_FIELDS or key == "v" or not isinstance(key, str) or len(key) > MAX_KEY_CHARS or not key.isidentifier():
            continue
        if isinstance(value, bool):
            extras[key] = value
        elif isinstance(value, int) and abs(value) <= INT64_MAX:
            extras[key] = value
        elif isinstance(value, (int, float)):
            number = clean_value(value, float, Bound(-MAX_MAGNITUDE, MAX_MAGNITUDE))
            if number is not None:
                extras[key] = number
        elif isinstance(value, str):
            extras[key] = value[:MAX_TEXT_CHARS]
    return extras
