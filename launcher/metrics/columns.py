"""The figures of the metric summaries, each declared once: the one place to add a metric column.

A ``Column`` names a figure (its key in `status --json` ``metrics``, `metrics --json`
and `compare --json`), says how it is computed from an attempt's records (and, for
per-rank figures, from one rank's records and process samples), and, with a
``header``, how the comparison table shows it. Everything that prints summaries
iterates ``COLUMNS``; a figure added here shows up in all of them (the raw record
fields reach `metrics --csv` from ``MetricRecord`` itself).

To add a figure from a new record field (or a key the program adds with
``Reporter(extra=...)``), append for example::

    Column("grad_norm", job=last("grad_norm"), rank=last("grad_norm"), header="GRAD NORM", cell=number(".3g"))

(tests/unit/test_columns.py registers one that way and finds it in every output).

Standard library only: `launch status` imports this module.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from launcher.metrics.record import RankUsage

MB = 1024 * 1024


class Fields(Protocol):
    """What the figures read of a set of metric records (one rank's in an attempt, or the whole attempt's): from the
    records themselves (``aggregate.RecordFields``) or from the store's running summary (``tally``), which keeps
    only what the built-in figures read and raises ``tally.NotKept`` for anything else."""

    @property
    def count(self) -> int:
        """How many records."""

    def values(self, name: str, steady: bool = False) -> Sequence[float]:
        """The known numeric values of a field (or program-added key); ``steady``: of the records past warm-up only
        (all of them when none is)."""

    def last(self, name: str, nonzero: bool = False) -> float | None:
        """The latest known value of a field (``nonzero``: the latest that is not 0)."""

    def maximum(self, name: str) -> float | None:
        """The largest known value of a field."""


class RankFigures(Protocol):
    """What a job's figure reads of a rank's summary (``summary.RankSummary``, which is built from these columns)."""

    def figure(self, name: str) -> float | None:
        """A registered figure by name, None when unknown."""


@dataclasses.dataclass(frozen=True)
class RankData:
    """One rank's part of an attempt: its records and its process samples."""

    records: Fields
    usage: RankUsage | None


@dataclasses.dataclass(frozen=True)
class AttemptData:
    """An attempt's records (all ranks), its per-rank summaries and process samples."""

    records: Fields
    per_rank: Sequence[RankFigures]
    usage: Sequence[RankUsage]


# formatting of table cells


def fmt(value: Any, spec: str = ".1f", unit: str = "") -> str:
    """A number for a table cell; '-' for unknown."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:{spec}}{unit}"


def fmt_pct(fraction: float | None) -> str:
    """A fraction as a percentage with three significant digits (tiny CPU MFUs stay visible)."""
    return "-" if fraction is None else f"{fraction * 100:.3g}%"


def fmt_mem(mb: float | None) -> str:
    """Memory in MB or GB, whichever reads better."""
    if mb is None:
        return "-"
    return f"{mb / 1024:.1f} GB" if mb >= 10 * 1024 else f"{mb:.0f} MB"


def number(spec: str = ".1f", unit: str = "") -> Callable[[Any], str]:
    """A cell formatter for ``fmt`` with this format spec."""
    return lambda value: fmt(value, spec, unit)


# building blocks for aggregations


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


# Aggregations of one field, for a job (AttemptData) or a rank (RankData) alike.


def last(name: str) -> Callable[[AttemptData | RankData], float | None]:
    """The latest known value of a field."""
    return lambda data: data.records.last(name)


def mean(name: str) -> Callable[[AttemptData | RankData], float | None]:
    """The mean of a field over the records past warm-up."""
    return lambda data: _fmean(data.records.values(name, steady=True))


def maximum(name: str) -> Callable[[AttemptData | RankData], float | None]:
    """The largest value of a field."""
    return lambda data: data.records.maximum(name)


def _fmean(numbers: Sequence[float]) -> float | None:
    return statistics.fmean(numbers) if numbers else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _rate(name: str) -> Callable[[RankData], float | None]:
    """Rank figure: a count field summed past warm-up over the seconds it took (None without records, without the
    seconds (no ``interval_s``), or when none was counted: a program whose batch the step hooks could not see
    reports steps/s only)."""

    def rate(rank: RankData) -> float | None:
        if not rank.records.count:
            return None
        seconds = sum(rank.records.values("interval_s", steady=True))
        if seconds <= 0:  # records without their interval: not measured (over 1e-9 s, 8 samples were 8e9 a second)
            return None
        return sum(rank.records.values(name, steady=True)) / seconds or None

    return rate


def _sum_ranks(name: str, zero_is_unknown: bool = False) -> Callable[[AttemptData], float | None]:
    def total(data: AttemptData) -> float | None:
        known = [v for v in (r.figure(name) for r in data.per_rank) if v is not None]
        if not known:
            return None
        return (sum(known) or None) if zero_is_unknown else sum(known)

    return total


def _max_ranks(name: str) -> Callable[[AttemptData], float | None]:
    return lambda data: max((v for v in (r.figure(name) for r in data.per_rank) if v is not None), default=None)


def _rank_step_p50(rank: RankData) -> float | None:
    return _ms(percentile(rank.records.values("step_time_s", steady=True), 50))


def _rank_peak_mem(rank: RankData) -> float | None:
    """The Reporter's peak when the rank reported one, else the node agent's sampled peak."""
    reported = rank.records.maximum("mem_peak_bytes")
    if reported is not None:
        return reported / MB
    sampled = rank.usage.peak_mem_bytes if rank.usage is not None else None
    return None if sampled is None else sampled / MB


def _step_p(q: float) -> Callable[[AttemptData], float | None]:
    return lambda data: _ms(percentile(data.records.values("step_time_s", steady=True), q))


def _steps_per_sec(data: AttemptData) -> float | None:
    p50 = percentile(data.records.values("step_time_s", steady=True), 50)
    return 1.0 / p50 if p50 else None


def _gpu_util(data: AttemptData) -> float | None:
    """The ranks' own NVML readings past warm-up, else the node agent's sampled means."""
    reported = data.records.values("gpu_util", steady=True)
    if reported:
        return statistics.fmean(reported)
    return _fmean([u.gpu_util_mean for u in data.usage if u.gpu_util_mean is not None])


def _last_flops(data: AttemptData) -> float | None:
    return data.records.last("flops_per_sample", nonzero=True)


@dataclasses.dataclass(frozen=True)
class Column:
    """One summary figure: its JSON key, how it is aggregated, and how the comparison shows it.

    ``job`` computes the job's value from an attempt; ``rank`` (if given) the value of
    one rank, shown in every ``per_rank`` entry. ``header`` makes it a column of the
    comparison table (and a key of its rows, ``compare_key`` or ``name``); a figure
    without a header is in a comparison row only when ``compare_key`` is given.
    """

    name: str
    job: Callable[[AttemptData], float | None]
    rank: Callable[[RankData], float | None] | None = None
    header: str | None = None
    cell: Callable[[Any], str] = number()
    compare_key: str | None = None

    @property
    def row_key(self) -> str | None:
        """The key of this figure in comparison rows; None when it is not in them."""
        return self.compare_key or (self.name if self.header else None)


COLUMNS: tuple[Column, ...] = (
    Column("step_time_ms_p50", job=_step_p(50), rank=_rank_step_p50, header="STEP MS", compare_key="step_time_ms"),
    Column("step_time_ms_p95", job=_step_p(95), compare_key="step_time_ms_p95"),
    Column("steps_per_sec", job=_steps_per_sec, header="STEPS/S", cell=number(".2f")),
    Column("samples_per_sec", job=_sum_ranks("samples_per_sec", zero_is_unknown=True), rank=_rate("samples"), header="SAMPLES/S"),
    Column("tokens_per_sec", job=_sum_ranks("tokens_per_sec", zero_is_unknown=True), rank=_rate("tokens"),
           header="TOKENS/S", cell=number(".0f")),
    Column("peak_mem_mb", job=_max_ranks("peak_mem_mb"), rank=_rank_peak_mem, header="MEM/GPU", cell=fmt_mem),
    Column("gpu_util", job=_gpu_util, header="GPU UTIL", cell=number(".0%")),
    Column("flops_per_sample", job=_last_flops),
    Column("loss", job=last("loss")),
)


def columns() -> tuple[Column, ...]:
    """The registered figures (read at each call, so a column added to ``COLUMNS`` is seen everywhere)."""
    return COLUMNS


def rank_columns() -> tuple[Column, ...]:
    return tuple(c for c in COLUMNS if c.rank is not None)


def table_columns() -> tuple[Column, ...]:
    """The figures the comparison table shows, in its order."""
    return tuple(c for c in COLUMNS if c.header)


def finite(value: Any) -> float | None:
    """A figure as stored: a finite number, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None
