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

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from launcher.metrics import columns as registry
from launcher.metrics.columns import AttemptData, RankData, percentile, steady
from launcher.metrics.record import MetricRecord, RankUsage
from launcher.metrics.summary import JobSummary, RankSummary

__all__ = ["as_records", "percentile", "summarize"]


def as_records(items: Iterable[MetricRecord | Mapping[str, Any]]) -> list[MetricRecord]:
    """Records, with record-shaped mappings read as stored rows are (invalid ones left out)."""
    out = []
    for item in items:
        record = item if isinstance(item, MetricRecord) else MetricRecord.from_stored(item)
        if record is not None:
            out.append(record)
    return out


def summarize(records: Iterable[MetricRecord], usage: Iterable[RankUsage] = (), attempt: int | None = None) -> JobSummary:
    """The job's figures (``columns.COLUMNS``) and its ranks', for ``attempt`` (default: the latest present)."""
    records, usage = list(records), list(usage)
    if attempt is None:
        attempt = max([r.attempt for r in records] + [u.attempt for u in usage], default=0)
    records = [r for r in records if r.attempt == attempt]
    usage = [u for u in usage if u.attempt == attempt]
    by_rank: dict[int, list[MetricRecord]] = defaultdict(list)
    for record in records:
        by_rank[record.rank].append(record)
    usage_by_rank = {u.rank: u for u in usage}
    per_rank = tuple(
        _rank_summary(rank, by_rank.get(rank, []), usage_by_rank.get(rank))
        for rank in sorted(set(by_rank) | set(usage_by_rank))
    )
    data = AttemptData(records=records, steady=steady(records), per_rank=per_rank, usage=usage)
    return JobSummary.build(
        steps=max((r.step for r in records), default=0),
        records=len(records),
        figures={column.name: column.job(data) for column in registry.columns()},
        per_rank=per_rank,
    )


def _rank_summary(rank: int, rows: Sequence[MetricRecord], usage: RankUsage | None) -> RankSummary:
    data = RankData(records=rows, steady=steady(rows), usage=usage)
    origin = rows[-1] if rows else usage
    return RankSummary.build(
        rank=rank,
        node=origin.node if origin else None,
        host=origin.host if origin else None,
        steps=max((r.step for r in rows), default=0),
        figures={column.name: column.rank(data) for column in registry.rank_columns() if column.rank is not None},
    )
