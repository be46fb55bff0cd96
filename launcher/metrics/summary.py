"""A job's metric summary as typed values: ``JobSummary`` with one ``RankSummary`` per rank.

The figures are those of ``columns.COLUMNS``: the built-in ones are fields here;
a figure registered there without a field here lives in ``more`` and is printed
all the same. ``as_json`` gives the shape `status --json` and `metrics --json`
print; ``from_stored`` reads a stored summary back leniently (a value that is
not a finite number reads as unknown), so any stored row renders.

Standard library only: `launch status` imports this module.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from launcher.metrics import columns as registry
from launcher.metrics.bounds import MAX_RANKS, MAX_TEXT_CHARS, Bound, clean_value


@dataclasses.dataclass(frozen=True)
class RankSummary:
    """One rank's figures over an attempt (throughput and step time need the Reporter; memory may be sampled)."""

    rank: int
    node: int | None = None
    host: str | None = None
    steps: int = 0
    samples_per_sec: float | None = None
    tokens_per_sec: float | None = None
    step_time_ms_p50: float | None = None
    peak_mem_mb: float | None = None
    more: dict[str, float | None] = dataclasses.field(default_factory=dict)

    def figure(self, name: str) -> float | None:
        """A registered figure by name (a field, else from ``more``)."""
        return getattr(self, name) if name in _RANK_FIGURES else self.more.get(name)

    def as_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"rank": self.rank, "node": self.node, "host": self.host}
        data.update({c.name: self.figure(c.name) for c in registry.rank_columns()})
        data["steps"] = self.steps
        return data

    @classmethod
    def from_stored(cls, data: Any) -> RankSummary | None:
        if not isinstance(data, Mapping):
            return None
        rank = clean_value(data.get("rank"), int, Bound(0, MAX_RANKS))
        if rank is None:
            return None
        return cls.build(
            rank=rank,
            node=clean_value(data.get("node"), int, Bound(0, MAX_RANKS)),
            host=clean_value(data.get("host"), str, Bound(max_len=MAX_TEXT_CHARS)),
            steps=clean_value(data.get("steps"), int, Bound(0, None)) or 0,
            figures={c.name: data.get(c.name) for c in registry.rank_columns()},
        )

    @classmethod
    def build(cls, *, rank: int, node: int | None, host: str | None, steps: int, figures: Mapping[str, Any]) -> RankSummary:
        """A rank's summary from its registered figures by name (non-finite values read as unknown)."""
        return cls(rank=rank, node=node, host=host, steps=steps, **_figures(figures, _RANK_FIGURES))


@dataclasses.dataclass(frozen=True)
class JobSummary:
    """A job's figures over one attempt, and its ranks'."""

    steps: int = 0
    records: int = 0
    step_time_ms_p50: float | None = None
    step_time_ms_p95: float | None = None
    steps_per_sec: float | None = None
    samples_per_sec: float | None = None
    tokens_per_sec: float | None = None
    peak_mem_mb: float | None = None
    gpu_util: float | None = None
    flops_per_sample: float | None = None
    loss: float | None = None
    per_rank: tuple[RankSummary, ...] = ()
    more: dict[str, float | None] = dataclasses.field(default_factory=dict)

    def figure(self, name: str) -> float | None:
        """A registered figure by name (a field, else from ``more``)."""
        return getattr(self, name) if name in _JOB_FIGURES else self.more.get(name)

    def as_json(self, records: bool = True) -> dict[str, Any]:
        """The summary as `metrics --json` prints it (`status --json` leaves out ``records``)."""
        data: dict[str, Any] = {"steps": self.steps}
        if records:
            data["records"] = self.records
        data.update({c.name: self.figure(c.name) for c in registry.columns()})
        data["per_rank"] = [rank.as_json() for rank in self.per_rank]
        return data

    @classmethod
    def from_stored(cls, data: Any) -> JobSummary:
        """A stored summary (JSON data of any shape); what is not a valid figure reads as unknown."""
        if not isinstance(data, Mapping):
            return cls()
        ranks = data.get("per_rank")
        per_rank = [RankSummary.from_stored(r) for r in ranks] if isinstance(ranks, list) else []
        return cls.build(
            steps=clean_value(data.get("steps"), int, Bound(0, None)) or 0,
            records=clean_value(data.get("records"), int, Bound(0, None)) or 0,
            figures={c.name: data.get(c.name) for c in registry.columns()},
            per_rank=[r for r in per_rank if r is not None],
        )

    @classmethod
    def build(cls, *, steps: int, records: int, figures: Mapping[str, Any], per_rank: Iterable[RankSummary]) -> JobSummary:
        """A job's summary from its registered figures by name (non-finite values read as unknown)."""
        return cls(steps=steps, records=records, per_rank=tuple(per_rank), **_figures(figures, _JOB_FIGURES))


def _figures(figures: Mapping[str, Any], fields: frozenset[str]) -> dict[str, Any]:
    """Keyword arguments for a summary: finite figures, those with a field as fields, the others in ``more``."""
    values = {name: registry.finite(value) for name, value in figures.items()}
    return {**{k: v for k, v in values.items() if k in fields}, "more": {k: v for k, v in values.items() if k not in fields}}


_META = {"rank", "node", "host", "steps", "records", "per_rank", "more"}
_RANK_FIGURES = frozenset(f.name for f in dataclasses.fields(RankSummary)) - _META
_JOB_FIGURES = frozenset(f.name for f in dataclasses.fields(JobSummary)) - _META
