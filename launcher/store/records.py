"""A job's events, metric records and process samples in the store.

Metric records come from ranks (untrusted) and are bounded: at most ``MAX_METRIC_RECORDS`` a job
(``launch metrics`` reads them all), the rest dropped with one ``metrics_capped`` event. The records
kept are tallied as they are stored, in the same transaction (``store.tally``): `launch status` of a
running job reads that running summary, not every record. Samples are folded into one row per rank
and attempt, so a long job does not grow the store. A row that does not read as valid is left out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from launcher.metrics import tally
from launcher.metrics.record import MetricRecord, ProcessSample, RankUsage
from launcher.metrics.summary import JobSummary
from launcher.store.rows import finite_or_none, json_text, json_value, text_or_none
from launcher.store.tally import TallyStore, tally_statements

MAX_METRIC_RECORDS = 50_000  # a job's records kept: 8 ranks reporting every 10 steps for 60,000 steps
CAPPED = "metrics_capped"


@dataclass(frozen=True)
class Seen:
    """Where a node's journal may be resumed: its ``lines`` received in whole, and its log file's size (``log_bytes``)
    once the output among them was written. Stored with the records and samples those lines carried, in one
    transaction, so that a supervisor killed at any moment leaves a mark no record of it is beyond."""

    node: int
    lines: int
    log_bytes: int | None

    def row(self, job_id: str, attempt: int) -> tuple:
        return self.lines, self.log_bytes, job_id, attempt, self.node


@dataclass
class Batch:
    """What the supervisor's loop files in one transaction: metric records and samples of an attempt, and how far
    each node's journal was received once they were (the last ``Seen`` of each node)."""

    records: list[MetricRecord] = field(default_factory=list)
    samples: list[ProcessSample] = field(default_factory=list)
    seen: dict[int, Seen] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.records or self.samples or self.seen)


SEEN_SQL = "UPDATE nodes SET seen = ?, log_bytes = ? WHERE job_id = ? AND attempt = ? AND node = ?"
#: The figures of a record kept in columns of their own too (schema 7; ``figures`` is 1 on such a row): the dashboard
#: plots them, read without parsing each record's JSON (SQLite 3.40 parses it again for each figure read).
FIGURE_COLUMNS = ("samples_per_sec", "step_time_s", "loss", "mem_peak_bytes")
METRICS_SQL = (f"INSERT INTO metrics (job_id, attempt, node, rank, step, record, figures, warmup, {', '.join(FIGURE_COLUMNS)})"
               f" VALUES (?,?,?,?,?,?,1,?{',?' * len(FIGURE_COLUMNS)})")
#: Whether a row is a record of the plots: not a warm-up step's; a row stored before schema 7 read from its JSON.
PLOTTED_ROW = ("CASE WHEN figures THEN warmup = 0 WHEN json_valid(record) "
               "THEN coalesce(json_extract(record, '$.warmup'), 0) = 0 ELSE 0 END")
SAMPLES_SQL = """INSERT INTO samples (job_id, attempt, rank, node, host, pid, t, cpu_s, rss_bytes, rss_peak_bytes,
   gpu_mem_bytes, gpu_mem_peak_bytes, gpu_util_sum, gpu_util_samples, samples)
   VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,1)
   ON CONFLICT (job_id, attempt, rank) DO UPDATE SET
   node = excluded.node, host = excluded.host, pid = excluded.pid, t = excluded.t,
   cpu_s = excluded.cpu_s, rss_bytes = excluded.rss_bytes,
   rss_peak_bytes = max(coalesce(rss_peak_bytes, 0), excluded.rss_peak_bytes),
   gpu_mem_bytes = excluded.gpu_mem_bytes,
   gpu_mem_peak_bytes = CASE WHEN excluded.gpu_mem_peak_bytes IS NULL THEN gpu_mem_peak_bytes
       ELSE max(coalesce(gpu_mem_peak_bytes, 0), excluded.gpu_mem_peak_bytes) END,
   gpu_util_sum = gpu_util_sum + excluded.gpu_util_sum,
   gpu_util_samples = gpu_util_samples + excluded.gpu_util_samples,
   samples = samples + 1"""


def _record_text(record: MetricRecord, job_id: str) -> str:
    """A record's stored JSON: its wire form under the job. A valid record's values are strict JSON as they are
    (``json_text``'s walk through them, the writer's largest cost a record, only for one that is not)."""
    wire = {**record.to_wire(), "job": job_id}
    try:
        return json.dumps(wire, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return json_text(wire)


def _figure(name: str) -> str:
    """The SQL that reads a record's figure ``name``: its column where it has one and the row was stored with it."""
    if not name.isidentifier():
        raise ValueError(f"not a figure name: {name!r}")
    extracted = f"json_extract(record, '$.{name}')"
    return f"CASE WHEN figures THEN {name} ELSE {extracted} END" if name in FIGURE_COLUMNS else extracted


class RecordsStore(TallyStore):
    """Events, metric records and their running summaries, and samples (the job rows are ``Store``'s)."""

    max_metric_records = MAX_METRIC_RECORDS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._metric_counts: dict[str, int] = {}
        self._capped: set[str] = set()

    def _within_metric_cap(self, job_id: str, rows: list[tuple]) -> list[tuple]:
        """The rows that fit under the job's cap; the first time the cap is hit, a ``metrics_capped`` event."""
        if not rows:
            return rows
        kept = self._metric_counts.get(job_id)
        if kept is None:
            kept = self._query("SELECT count(*) FROM metrics WHERE job_id = ?", (job_id,))[0][0]
        room = max(0, self.max_metric_records - kept)
        self._metric_counts[job_id] = kept + min(room, len(rows))
        if len(rows) > room and job_id not in self._capped:
            self._capped.add(job_id)
            if not self._query("SELECT 1 FROM events WHERE job_id = ? AND kind = ? LIMIT 1", (job_id, CAPPED)):
                self.add_event(job_id, CAPPED, f"{self.max_metric_records} metric records kept, the most a job keeps; "
                               "later records are dropped (summaries cover the records kept)",
                               {"limit": self.max_metric_records})
        return rows[:room]

    def add_event(self, job_id: str, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        self._execute(
            "INSERT INTO events (job_id, t, kind, message, data) VALUES (?,?,?,?,?)",
            (job_id, time.time(), kind, message, json_text(data) if data is not None else None),
        )

    def events(self, job_id: str) -> list[dict[str, Any]]:
        """A job's events in order; a value of the wrong type reads as unknown."""
        rows = self._query("SELECT t, kind, message, data FROM events WHERE job_id = ? ORDER BY id", (job_id,))
        return [
            {"t": finite_or_none(r["t"]) or 0.0, "kind": text_or_none(r["kind"]) or "?",
             "message": text_or_none(r["message"]) or "", "data": json_value(r["data"])}
            for r in rows
        ]

    def add_batch(self, job_id: str, attempt: int, batch: Batch) -> None:
        """File an attempt's records (as ``parse_line`` made them: valid) and their tally, samples and where each
        node's journal stands, in one transaction. A job keeps at most ``max_metric_records``: later ones are
        dropped, and a ``metrics_capped`` event says so once. Samples fold into one row per rank and attempt: the
        latest sample, the peaks of RSS and GPU memory, and the sum and count of GPU utilisation readings."""
        if batch:
            self._transaction(*self._metric_statements(job_id, attempt, batch.records),
                              (SAMPLES_SQL, self._sample_rows(job_id, attempt, batch.samples)),
                              (SEEN_SQL, [seen.row(job_id, attempt) for seen in batch.seen.values()]))

    def _metric_statements(self, job_id: str, attempt: int, records: list[MetricRecord]) -> list[tuple[str, list[tuple]]]:
        """The records' rows under the job's cap, and the tally of those kept."""
        rows = self._within_metric_cap(job_id, [
            (job_id, attempt, record.node, record.rank, record.step, _record_text(record, job_id), int(record.warmup),
             *(finite_or_none(getattr(record, name)) for name in FIGURE_COLUMNS)) for record in records])
        return [(METRICS_SQL, rows), *tally_statements(job_id, attempt, records[:len(rows)])]

    def running_summary(self, job_id: str) -> JobSummary | None:
        """The summary of a job's latest attempt from its running summary (``metrics.tally``) and its samples; None
        when the running summary does not count every record stored (records stored before schema 4) or does not
        keep what a figure reads: summarise the records then."""
        attempts = self.tallied_attempts(job_id)
        if attempts is None:
            return None
        usage = self.samples(job_id)
        attempt = max(attempts + [u.attempt for u in usage], default=0)
        found = self.tally(job_id, attempt)
        return None if found is None else tally.summary(found, [u for u in usage if u.attempt == attempt])

    def metrics(self, job_id: str) -> list[MetricRecord]:
        """A job's records, in arrival order, each with its attempt; rows that are not valid records are left out."""
        rows = self._query("SELECT attempt, record FROM metrics WHERE job_id = ? ORDER BY id", (job_id,))
        records = []
        for row in rows:
            data = json_value(row["record"])
            record = MetricRecord.from_stored(data, attempt=row["attempt"]) if isinstance(data, dict) else None
            if record is not None:
                records.append(record)
        return records

    def metric_points(self, job_id: str, attempt: int, names: tuple[str, ...]) -> list[tuple[int, int, list[float | None]]]:
        """(rank, step, the figures ``names``) of each record of an attempt but warm-up ones, in arrival order: the
        dashboard's plots, read from the figures' columns (``FIGURE_COLUMNS``; any other figure by SQLite's JSON
        functions) without building each record. A figure that is not a finite number reads as None."""
        figures = ", ".join(_figure(name) for name in names)
        rows = self._query(f"SELECT rank, step, {figures} FROM metrics WHERE job_id = ? AND attempt = ? AND {PLOTTED_ROW} "
                           "ORDER BY id", (job_id, attempt))
        return [(row[0], row[1], [finite_or_none(value) for value in row[2:]]) for row in rows
                if isinstance(row[0], int) and isinstance(row[1], int)]

    def metric_ranks(self, job_id: str, attempt: int) -> int:
        """How many ranks reported in an attempt."""
        return self._query("SELECT count(DISTINCT rank) FROM metrics WHERE job_id = ? AND attempt = ?",
                           (job_id, attempt))[0][0]

    def metric_spread(self, job_id: str, attempt: int, names: tuple[str, ...]) -> list[tuple[int, list[float | None]]]:
        """Per step of an attempt (warm-up records left out), the min, mean and max over the ranks of each figure in
        ``names`` (three values a name, in that order), computed by SQLite from the figures' columns."""
        extracted = ", ".join(f"{_figure(name)} AS f{i}" for i, name in enumerate(names))
        figures = ", ".join(f"{how}(f{i})" for i in range(len(names)) for how in ("min", "avg", "max"))
        rows = self._query(  # each figure read once a row
            f"SELECT step, {figures} FROM (SELECT step, {extracted} FROM metrics WHERE job_id = ? AND attempt = ? "
            f"AND {PLOTTED_ROW}) GROUP BY step ORDER BY step", (job_id, attempt))
        return [(row[0], [finite_or_none(value) for value in row[1:]]) for row in rows if isinstance(row[0], int)]

    def metrics_after(self, job_id: str, after: int, limit: int = 10_000) -> list[tuple[int, MetricRecord]]:
        """The job's records stored after row ``after`` (at most ``limit``), each with its row id, in order."""
        rows = self._query("SELECT id, attempt, record FROM metrics WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?",
                           (job_id, after, limit))
        out = []
        for row in rows:
            data = json_value(row["record"])
            record = MetricRecord.from_stored(data, attempt=row["attempt"]) if isinstance(data, dict) else None
            if record is not None:
                out.append((row["id"], record))
        return out

    def events_after(self, job_id: str, after: int) -> list[tuple[int, dict[str, Any]]]:
        """The job's events after row ``after``, each with its row id, in order."""
        rows = self._query("SELECT id, t, kind, message FROM events WHERE job_id = ? AND id > ? ORDER BY id",
                           (job_id, after))
        return [(row["id"], {"t": finite_or_none(row["t"]) or 0.0, "kind": text_or_none(row["kind"]) or "?",
                             "message": text_or_none(row["message"]) or ""}) for row in rows]

    @staticmethod
    def _sample_rows(job_id: str, attempt: int, samples: Iterable[ProcessSample]) -> list[tuple]:
        return [
            (job_id, attempt, s.rank, s.node, s.host, s.pid, s.t, s.cpu_s, s.rss_bytes, max(s.rss_peak_bytes, s.rss_bytes),
             s.gpu_mem_bytes, s.gpu_mem_bytes, s.gpu_util or 0.0, int(s.gpu_util is not None))
            for s in samples
        ]

    def samples(self, job_id: str) -> list[RankUsage]:
        """What the node agents saw of each rank, per attempt (rows that do not read as valid are left out)."""
        rows = self._query("SELECT * FROM samples WHERE job_id = ? ORDER BY attempt, rank", (job_id,))
        usage = []
        for row in rows:
            data = dict(row)
            count = data["gpu_util_samples"]
            if isinstance(count, int) and count > 0 and isinstance(data["gpu_util_sum"], (int, float)):
                data["gpu_util_mean"] = data["gpu_util_sum"] / count
            entry = RankUsage.from_stored(data)
            if entry is not None:
                usage.append(entry)
        return usage
