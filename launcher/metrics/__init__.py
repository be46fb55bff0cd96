"""Metrics: the in-rank reporter, the record model it writes, and the summaries built from its records.

``Reporter`` (a rank's side: sockets, timers) is imported on first use, so the store and `launch status`, which
read records, do not load it.
"""

from typing import TYPE_CHECKING, Any

from launcher.metrics.record import (
    MetricRecord,
    ProcessSample,
    Rejected,
    parse_line,
    parse_samples,
)

if TYPE_CHECKING:
    from launcher.metrics.reporter import Reporter

__all__ = ["MetricRecord", "ProcessSample", "Rejected", "Reporter", "parse_line", "parse_samples"]


def __getattr__(name: str) -> Any:
    if name == "Reporter":
        from launcher.metrics.reporter import Reporter

        return Reporter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
