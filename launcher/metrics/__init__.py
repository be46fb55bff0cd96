"""Metrics: the in-rank reporter, the record model it writes, and the summaries built from its records."""

from launcher.metrics.record import (
    MetricRecord,
    ProcessSample,
    Rejected,
    parse_line,
    parse_samples,
)
from launcher.metrics.reporter import Reporter

__all__ = ["MetricRecord", "ProcessSample", "Rejected", "Reporter", "parse_line", "parse_samples"]
