"""The running summary of an attempt's metric records: what the store keeps of them as they arrive (``fold``) and
the job's figures read back from it (``summary``), the same figures ``aggregate.summarize`` makes of the records.

`launch status` of a running job used to summarise every record on every call: 50,000 of them, decoded and
checked, for a 1,000-rank job (seconds). The store's one writer now folds each batch into a row a rank and
attempt, which status reads instead. Exact, not estimated: a figure is a percentile, a sum in arrival order or
a mean over a rank's (or the attempt's) records past warm-up, so the values it is taken over are kept, packed
in arrival order (``Packed``, 8 bytes a value), with the counts, the highest step and reported memory peak, the
node and host of the rank's latest record, and the attempt's latest loss and FLOPs a sample. A figure that reads
anything else (a column registered for a program's own key, see ``columns.COLUMNS``) raises ``NotKept``:
``summary`` then gives None, and the caller summarises the records.

Standard library only: `launch status` imports this module.
"""

from __future__ import annotations

import dataclasses
import sys
from array import array
from collections.abc import Sequence

from launcher.metrics.aggregate import RankRecords, RecordFields, summary_of
from launcher.metrics.record import MetricRecord, RankUsage
from launcher.metrics.summary import JobSummary

LATEST = {("loss", False): "loss", ("flops_per_sample", True): "flops_per_sample"}  # (field, nonzero): AttemptTally's


class NotKept(LookupError):
    """A figure read something of the records that the running summary does not keep."""


def _pack(code: str, values: Sequence[float]) -> bytes:
    packed = array(code, values)
    if sys.byteorder == "big":
        packed.byteswap()  # kept little-endian
    return packed.tobytes()


def _unpack(code: str, data: bytes) -> array:
    values = array(code, data)
    if sys.byteorder == "big":
        values.byteswap()
    return values


@dataclasses.dataclass(frozen=True)
class Packed:
    """The known values of some of a rank's records (those past warm-up, or those in it), in arrival order, each
    field's packed as stored: 8 bytes a value, little-endian (``KINDS``: the integers' and the floats')."""

    step_time_s: bytes = b""
    interval_s: bytes = b""
    samples: bytes = b""
    tokens: bytes = b""
    gpu_util: bytes = b""

    @classmethod
    def of(cls, records: Sequence[MetricRecord]) -> Packed:
        """Of valid records (as the store keeps them: each field of its type, so a known value is one not None)."""
        if not records:
            return EMPTY
        return cls(*(_pack(code, [v for r in records if (v := getattr(r, name)) is not None]) for name, code in KINDS))

    def columns(self) -> tuple[bytes, ...]:
        """The packed values in ``KINDS`` order, as stored."""
        return tuple(getattr(self, name) for name in CODES)

    @property
    def count(self) -> int:
        """How many records (each has its interval)."""
        return len(self.interval_s) // 8

    def values(self, name: str) -> array:
        return _unpack(CODES[name], getattr(self, name))


KINDS = tuple((f.name, "q" if f.name in ("samples", "tokens") else "d") for f in dataclasses.fields(Packed))
CODES = dict(KINDS)
EMPTY = Packed()


@dataclasses.dataclass(frozen=True)
class RankTally:
    """One rank's running summary in an attempt (or what a batch of its records adds to it); ``columns.Fields``."""

    rank: int
    node: int | None
    host: str | None
    records: int
    warmup_records: int
    step: int
    mem_peak_bytes: int | None
    warm: Packed
    steady: Packed

    @classmethod
    def of(cls, rank: int, records: Sequence[MetricRecord]) -> RankTally:
        """The tally of ``records``, one rank's, in arrival order."""
        warm = [r for r in records if r.warmup]
        return cls(rank=rank, node=records[-1].node, host=records[-1].host, records=len(records),
                   warmup_records=len(warm), step=max(r.step for r in records),
                   mem_peak_bytes=max((r.mem_peak_bytes for r in records if r.mem_peak_bytes is not None), default=None),
                   warm=Packed.of(warm), steady=Packed.of([r for r in records if not r.warmup]))

    @property
    def count(self) -> int:
        return self.records

    @property
    def past_warmup(self) -> bool:
        """Whether any record is past warm-up (else the figures are taken over those in it)."""
        return self.records > self.warmup_records

    def values(self, name: str, steady: bool = False) -> array:
        if not steady or name not in CODES:  # all of a rank's values in arrival order are not kept (only each part's)
            raise NotKept(name)
        return (self.steady if self.past_warmup else self.warm).values(name)

    def last(self, name: str, nonzero: bool = False) -> float | None:
        raise NotKept(name)

    def maximum(self, name: str) -> float | None:
        if name == "step":
            return self.step
        if name == "mem_peak_bytes":
            return self.mem_peak_bytes
        if name not in CODES:
            raise NotKept(name)
        return max([*self.warm.values(name), *self.steady.values(name)], default=None)


@dataclasses.dataclass(frozen=True)
class AttemptTally:
    """An attempt's running summary: its ranks' and its latest loss and FLOPs a sample; ``columns.Fields``."""

    ranks: tuple[RankTally, ...]
    loss: float | None = None
    flops_per_sample: float | None = None
    _sorted: dict[str, list[float]] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    @property
    def count(self) -> int:
        return sum(rank.records for rank in self.ranks)

    def values(self, name: str, steady: bool = False) -> list[float]:
        """In ascending order, not in arrival order (the figures taken over an attempt's values, percentiles and
        means, do not depend on it; sorted once, the three percentiles sort in linear time)."""
        if not steady or name not in CODES:
            raise NotKept(name)
        if name not in self._sorted:
            past_warmup = any(rank.past_warmup for rank in self.ranks)
            packed = b"".join(getattr(rank.steady if past_warmup else rank.warm, name) for rank in self.ranks)
            self._sorted[name] = sorted(_unpack(CODES[name], packed))
        return self._sorted[name]

    def last(self, name: str, nonzero: bool = False) -> float | None:
        field = LATEST.get((name, nonzero))
        if field is None:
            raise NotKept(name)
        return getattr(self, field)

    def maximum(self, name: str) -> float | None:
        return max((v for v in (rank.maximum(name) for rank in self.ranks) if v is not None), default=None)


def fold(records: Sequence[MetricRecord]) -> AttemptTally:
    """What ``records`` (a batch of one attempt's, in arrival order) add to its running summary."""
    by_rank: dict[int, list[MetricRecord]] = {}
    for record in records:
        by_rank.setdefault(record.rank, []).append(record)
    fields = RecordFields(records)
    return AttemptTally(ranks=tuple(RankTally.of(rank, rows) for rank, rows in by_rank.items()),
                        loss=fields.last("loss"), flops_per_sample=fields.last("flops_per_sample", nonzero=True))


def summary(tally: AttemptTally, usage: Sequence[RankUsage]) -> JobSummary | None:
    """The attempt's summary from its running summary and its process samples; None when a figure reads what the
    running summary does not keep (``NotKept``): summarise the records then."""
    ranks = {rank.rank: RankRecords(rank, rank.node, rank.host) for rank in tally.ranks}
    try:
        return summary_of(tally, ranks, usage)
    except NotKept:
        return None
