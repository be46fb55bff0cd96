"""The running summary of each job's metric records (``metrics.tally``), kept by the store as it stores them.

Three tables (schema 4): ``tally_ranks``, a row a rank and attempt (its counts, highest step and reported memory
peak, the node and host of its latest record); ``tally_values``, the rank's packed values, those past warm-up
and those in it apart, a row for every ``CHUNK`` records or so, so that a batch rewrites a few KiB, never all
of a rank's values; ``tally_attempts``, the attempt's latest loss and FLOPs a sample. ``tally_statements`` are
what a batch adds, run in the transaction that stores its records (after the cap: what is tallied is what is
kept). ``tally`` reads an attempt's back: None when a row does not read as launch writes it.

A job whose records were stored before schema 4, or by an older launch still running it, has records that no
tally counts: ``tallied_attempts`` says so (None), and the summary is made from the records as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from launcher.metrics.record import MetricRecord
from launcher.metrics.tally import EMPTY, KINDS, AttemptTally, Packed, RankTally, fold
from launcher.store.base import StoreBase

CHUNK = 256  # records a tally_values row holds, give or take a batch

_NAMES = [name for name, _ in KINDS]
VALUES_SQL = f"""INSERT INTO tally_values (job_id, attempt, rank, warmup, chunk, {", ".join(_NAMES)})
   VALUES (?1, ?2, ?3, ?4, coalesce((SELECT CASE WHEN ?4 THEN warmup_records ELSE records - warmup_records END
       FROM tally_ranks WHERE job_id = ?1 AND attempt = ?2 AND rank = ?3), 0) / {CHUNK},
       {", ".join(f"?{i}" for i in range(5, 5 + len(_NAMES)))})
   ON CONFLICT (job_id, attempt, rank, warmup, chunk) DO UPDATE SET
   {", ".join(f"{name} = CAST({name} || excluded.{name} AS BLOB)" for name in _NAMES)}"""
RANKS_SQL = """INSERT INTO tally_ranks (job_id, attempt, rank, node, host, records, warmup_records, step, mem_peak_bytes)
   VALUES (?,?,?,?,?,?,?,?,?)
   ON CONFLICT (job_id, attempt, rank) DO UPDATE SET
   node = excluded.node, host = excluded.host, records = records + excluded.records,
   warmup_records = warmup_records + excluded.warmup_records, step = max(step, excluded.step),
   mem_peak_bytes = max(coalesce(mem_peak_bytes, excluded.mem_peak_bytes), coalesce(excluded.mem_peak_bytes, mem_peak_bytes))"""
ATTEMPTS_SQL = """INSERT INTO tally_attempts (job_id, attempt, loss, flops_per_sample) VALUES (?,?,?,?)
   ON CONFLICT (job_id, attempt) DO UPDATE SET loss = coalesce(excluded.loss, loss),
   flops_per_sample = coalesce(excluded.flops_per_sample, flops_per_sample)"""


def tally_statements(job_id: str, attempt: int, records: Sequence[MetricRecord]) -> list[tuple[str, list[tuple]]]:
    """What a batch of an attempt's records (as stored, in arrival order) adds to its running summary: statements
    for ``StoreBase._transaction``, values first (their chunk is counted from the rank's tally before the batch)."""
    if not records:
        return []
    added = fold(records)
    values = [(job_id, attempt, rank.rank, warmup, *part.columns())
              for rank in added.ranks for warmup, part in ((1, rank.warm), (0, rank.steady)) if part.count]
    ranks = [(job_id, attempt, rank.rank, rank.node, rank.host, rank.records, rank.warmup_records, rank.step,
              rank.mem_peak_bytes) for rank in added.ranks]
    return [(VALUES_SQL, values), (RANKS_SQL, ranks), (ATTEMPTS_SQL, [(job_id, attempt, added.loss, added.flops_per_sample)])]


class TallyStore(StoreBase):
    """Reading the running summaries back (``tally_statements`` writes them)."""

    def tallied_attempts(self, job_id: str) -> list[int] | None:
        """The attempts a job's running summary covers; None when it does not count every record stored of the job."""
        stored = self._query("SELECT count(*) FROM metrics WHERE job_id = ?", (job_id,))[0][0]
        rows = self._query("SELECT attempt, sum(records) FROM tally_ranks WHERE job_id = ? GROUP BY attempt", (job_id,))
        return [row[0] for row in rows] if sum(row[1] for row in rows) == stored else None

    def tally(self, job_id: str, attempt: int) -> AttemptTally | None:
        """An attempt's running summary; None when one of its rows does not read as launch writes them."""
        key = (job_id, attempt)
        packed: dict[tuple[Any, Any], list[Sequence[bytes]]] = {}
        for row in self._query(f"SELECT rank, warmup, {', '.join(_NAMES)} FROM tally_values WHERE job_id = ? AND "
                               "attempt = ? ORDER BY rank, warmup, chunk", key):
            packed.setdefault((row[0], row[1]), []).append(tuple(row)[2:])
        ranks = []
        for row in self._query("SELECT rank, node, host, records, warmup_records, step, mem_peak_bytes FROM tally_ranks "
                               "WHERE job_id = ? AND attempt = ? ORDER BY rank", key):
            rank = _rank(tuple(row), packed.get((row[0], 1), []), packed.get((row[0], 0), []))
            if rank is None:
                return None
            ranks.append(rank)
        latest = self._query("SELECT loss, flops_per_sample FROM tally_attempts WHERE job_id = ? AND attempt = ?", key)
        loss, flops = tuple(latest[0]) if latest else (None, None)
        if not all(value is None or isinstance(value, float) for value in (loss, flops)):
            return None
        return AttemptTally(ranks=tuple(ranks), loss=loss, flops_per_sample=flops)


def _rank(row: tuple, warm: list[Sequence[bytes]], steady: list[Sequence[bytes]]) -> RankTally | None:
    """A ``tally_ranks`` row and its rank's ``tally_values`` chunks (in order) as a tally; None if they do not read
    as written: a value of another type, counts that do not add up, packed values that are not whole numbers."""
    rank, node, host, records, warmup_records, step, peak = row
    ints = (rank, records, warmup_records, step)
    if not all(type(v) is int for v in ints) or not 0 <= warmup_records <= records or records < 1:
        return None
    if not all(v is None or type(v) is int for v in (node, peak)) or not (host is None or isinstance(host, str)):
        return None
    parts = []
    for chunks in (warm, steady):
        if not all(isinstance(blob, bytes) and len(blob) % 8 == 0 for chunk in chunks for blob in chunk):
            return None
        parts.append(Packed(*(b"".join(column) for column in zip(*chunks, strict=True))) if chunks else EMPTY)
    if parts[0].count != warmup_records or parts[1].count != records - warmup_records:
        return None
    return RankTally(rank=rank, node=node, host=host, records=records, warmup_records=warmup_records, step=step,
                     mem_peak_bytes=peak, warm=parts[0], steady=parts[1])
