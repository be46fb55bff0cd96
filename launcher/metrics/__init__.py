"""Metrics: the in-rank reporter and the summaries built from its records."""

from launcher.metrics.reporter import Reporter, parse_record

__all__ = ["Reporter", "parse_record"]
