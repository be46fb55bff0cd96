"""Per-job summaries built from the ranks' metric records and the node agents' process samples.

Warm-up intervals are left out of throughput and step time (unless a run
was so short that it has nothing else). Step-time percentiles are taken over
reporting intervals: each record carries the mean step time of its interval,
measured without a device synchronisation on ordinary steps.

A rank known only from process samples (a program that never imports the
Reporter) still gets a per-rank entry with its sampled peak memory; its
samples/s, tokens/s and step time stay unknown. Which figures exist and how
each is aggregated is declared once, in ``columns.COLUMNS``.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from launcher.metrics import columns as registry
from launcher.metrics.columns import AttemptData, Fields, RankData, percentile
from launcher.metrics.record import MetricRecord, RankUsage
from launcher.metrics.summary import JobSummary, RankSummary

__all__ = ["RankRecords", "RecordFields", "as_records", "percentile", "summarize", "summary_of"]


def as_records(items: Iterable[MetricRecord | Mapping[str, Any]]) -> list[MetricRecord]:
    """Records, with record-shaped mappings read as stored rows are (invalid ones left out)."""
    out = []
    for item in items:
        record = item if isinstance(item, MetricRecord) else MetricRecord.from_stored(item)
        if record is not None:
            out.append(record)
    return out


class RecordFields:
    """``columns.Fields`` read from the records themselves, in arrival order."""

    def __init__(self, records: Sequence[MetricRecord]) -> None:
        self.records = records
        self.steady = [r for r in records if not r.warmup] or records

    @property
    def count(self) -> int:
        return len(self.records)

    def values(self, name: str, steady: bool = False) -> list[float]:
        return [v for v in (r.number(name) for r in (self.steady if steady else self.records)) if v is not None]

    def last(self, name: str, nonzero: bool = False) -> float | None:
        return next((v for v in reversed(self.values(name)) if v or not nonzero), None)

    def maximum(self, name: str) -> float | None:
        return max(self.values(name), default=None)


@dataclasses.dataclass(frozen=True)
class RankRecords:
    """One rank's records in an attempt, and the node and host of its latest."""

    fields: Fields
    node: int | None
    host: str | None


def summarize(records: Iterable[MetricRecord], usage: Iterable[RankUsage] = (), attempt: int | None = None) -> JobSummary:
    """The job's figures (``columns.COLUMNS``) and its ranks', for ``attempt`` (default: the latest present)."""
    records, usage = list(records), list(usage)
    if attempt is None:
        attempt = max([r.attempt for r in records] + [u.attempt for u in usage], default=0)
    records = [r for r in records if r.attempt == attempt]
    by_rank: dict[int, list[MetricRecord]] = defaultdict(list)
    for record in records:
        by_rank[record.rank].append(record)
    ranks = {rank: RankRecords(RecordFields(rows), rows[-1].node, rows[-1].host) for rank, rows in by_rank.items()}
    return summary_of(RecordFields(records), ranks, [u for u in usage if u.attempt == attempt])


def summary_of(records: Fields, ranks: Mapping[int, RankRecords], usage: Sequence[RankUsage]) -> JobSummary:
    """An attempt's summary from its records (``records``, and each rank's) and its process samples."""
    usage_by_rank = {u.rank: u for u in usage}
    per_rank = tuple(
        _rank_summary(rank, ranks.get(rank), usage_by_rank.get(rank))
        for rank in sorted(set(ranks) | set(usage_by_rank))
    )
    data = AttemptData(records=records, per_rank=per_rank, usage=usage)
    return JobSummary.build(
        steps=int(records.maximum("step") or 0),
        records=records.count,
        figures={column.name: column.job(data) for column in registry.columns()},
        per_rank=per_rank,
    )


def _rank_summary(rank: int, part: RankRecords | None, usage: RankUsage | None) -> RankSummary:
    data = RankData(records=part.fields if part else RecordFields(()), usage=usage)
    origin = part or usage
    return RankSummary.build(
        rank=rank,
        node=origin.node if origin else None,
        host=origin.host if origin else None,
        steps=int(data.records.maximum("step") or 0),
        figures={column.name: column.rank(data) for column in registry.rank_columns() if column.rank is not None},
    )
