"""The running summary (metrics/tally.py, store/tally.py): `launch status` of a running job shows what it showed when
every record was summarised on each call, the same fields and the same numbers, from a row a rank."""

from __future__ import annotations

import json
import random
import time

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.cli.main import main
from launcher.metrics import columns, tally
from launcher.metrics.aggregate import summarize
from launcher.metrics.columns import Column, maximum
from launcher.metrics.record import MARKER, MetricRecord, ProcessSample, RankUsage, parse_line
from launcher.spec import JobSpec
from launcher.store.db import LAUNCHING, RUNNING, SUCCEEDED, Store
from launcher.store.records import Batch
from launcher.store.tally import CHUNK
from launcher.views import jobstatus

JOB = "tally-000001"
NODES, PER_NODE = 3, 4


def _received(record: MetricRecord, world_size: int) -> MetricRecord:
    """``record`` as the supervisor gets it: a rank's marked line, parsed and checked."""
    line = MARKER + json.dumps(record.to_wire(), separators=(",", ":"))
    parsed = parse_line(line, world_size=world_size, node=record.node, host=record.host, rank=record.rank)
    assert isinstance(parsed, MetricRecord), parsed
    return parsed


def _rounds(attempt: int, steps: int, rng: random.Random, gpu: bool) -> list[list[MetricRecord]]:
    """A round a step of the ranks' records, as a mixed job reports them: the first two records of each rank in
    warm-up, step times that vary by rank and step, a rank that reports from step 30 on only (its records all in
    warm-up until then), a missing step time, losses, memory peaks, GPU utilisation on GPU ranks, FLOPs a sample
    that is 0 on some records."""
    world = NODES * PER_NODE
    rounds = []
    for index in range(steps):
        step = (index + 1) * 5
        batch = []
        for rank in rng.sample(range(world), world):  # the ranks' lines arrive in any order
            if rank == 7 and step < 30:
                continue
            interval = 5 * (0.2 + 0.01 * rank + rng.uniform(-0.02, 0.05))
            samples = 5 * 16 * rng.choice((1, 1, 1, 2))
            batch.append(MetricRecord(
                node=rank // PER_NODE, rank=rank, local_rank=rank % PER_NODE, host=f"node{rank // PER_NODE}",
                step=step, t=1.7e9 + step, warmup=index < 2 or (rank == 7 and step == 30), steps=5, interval_s=interval,
                step_time_s=None if (rank, index) == (3, 9) else interval / 5, samples=samples, tokens=samples * 512,
                samples_per_sec=samples / interval, tokens_per_sec=samples * 512 / interval,
                loss=None if index % 7 == 3 else 4.0 / (1 + step) + rng.uniform(0, 0.01),
                mem_peak_bytes=1_000_000_000 + rng.randrange(50_000_000) + attempt,
                gpu_util=rng.uniform(0.6, 0.99) if gpu and rank % 2 == 0 else None,
                flops_per_sample=0.0 if index % 5 == 4 else 3.1e12, gpu_name="H100" if gpu else None))
        rounds.append([_received(record, world) for record in batch])
    return rounds


def _samples(attempt: int, count: int) -> list[ProcessSample]:
    return [ProcessSample(node=rank // PER_NODE, rank=rank, host=f"node{rank // PER_NODE}", t=1.7e9 + attempt, pid=100 + rank,
                          cpu_s=2.0 * rank, rss_bytes=3_000_000 + rank, rss_peak_bytes=4_000_000 + rank * 1000,
                          gpu_mem_bytes=None if rank % 3 else 5_000_000, gpu_util=None if rank % 3 else 0.5)
            for rank in range(count)]


@pytest.fixture
def running(home):
    """A RUNNING job of 3 nodes x 4 ranks: attempt 0 filed by the supervisor's loop and ended, attempt 1 partly
    imported (``add_metrics``) and then filed; process samples of both, one rank of attempt 1 known only from them."""
    spec = JobSpec(name="tally", entrypoint=["python", "t.py"], batch={"micro_batch": 2},
                   resources={"nodes": NODES, "nproc_per_node": PER_NODE})
    plan = plan_job(spec, cluster_spec(name="local"), JOB, rdzv_port=29500)
    store = Store()
    store.create_job(plan, {})
    store.transition(JOB, LAUNCHING, attempt=0)
    store.transition(JOB, RUNNING)
    store.update_job(JOB, created_at=time.time() - 7200)  # "2h ago" in the list, whenever it is drawn
    rng = random.Random(23)
    for records in _rounds(0, 12, rng, gpu=False):
        store.add_batch(JOB, 0, Batch(records=records, samples=_samples(0, NODES * PER_NODE)[:2]))
    store.transition(JOB, LAUNCHING, attempt=1)
    store.transition(JOB, RUNNING)
    rounds = _rounds(1, 90, rng, gpu=True)
    store.add_batch(JOB, 1, Batch(records=[record for records in rounds[:40] for record in records]))
    for records in rounds[40:]:
        store.add_batch(JOB, 1, Batch(records=records))
    store.add_batch(JOB, 1, Batch(samples=_samples(1, NODES * PER_NODE + 1)))
    return store


def _shown(capsys, *argv: str) -> str:
    main(list(argv))
    return capsys.readouterr().out


def test_a_running_jobs_summary_is_the_same_from_its_running_summary_and_from_its_records(running):
    from_records = summarize(running.metrics(JOB), running.samples(JOB))
    from_tally = running.running_summary(JOB)
    assert from_tally == from_records
    assert from_tally is not None and from_tally.records == 90 * 12 - 5 and len(from_tally.per_rank) == 13
    assert from_tally.tokens_per_sec and from_tally.gpu_util and from_tally.loss and from_tally.flops_per_sample
    for attempt in (0, 1):
        tally = running.tally(JOB, attempt)
        assert tally is not None
        assert summarize(running.metrics(JOB), running.samples(JOB), attempt=attempt) == summarize_tally(running, attempt)


def summarize_tally(store: Store, attempt: int):
    found = store.tally(JOB, attempt)
    assert found is not None
    return tally.summary(found, [u for u in store.samples(JOB) if u.attempt == attempt])


def _record(rank: int, step: int, warmup: bool, step_time_s: float | None = 0.25) -> MetricRecord:
    return MetricRecord(rank=rank, node=rank // 2, host=f"h{rank // 2}", step=step, warmup=warmup, steps=1,
                        interval_s=0.3 + 0.01 * step, step_time_s=step_time_s and step_time_s + 0.001 * step, samples=8,
                        tokens=0, loss=1.0 / step)


@pytest.mark.parametrize("records", [
    [],
    [_record(r, s, warmup=True) for s in (1, 2) for r in range(3)],
    [_record(r, s, warmup=s == 1 or r == 1) for s in (1, 2, 3) for r in range(3)],
    [_record(r, s, warmup=s == 1, step_time_s=None) for s in (1, 2, 3) for r in range(2)],
], ids=["none", "all in warm-up", "a rank only in warm-up", "no step times"])
def test_the_edges_of_warm_up_and_unknowns_are_summarised_alike(records):
    usage = [RankUsage(rank=rank, node=0, host="h0", rss_peak_bytes=4_000_000 + rank, gpu_util_mean=0.5) for rank in range(4)]
    assert tally.summary(tally.fold(records), usage) == summarize(records, usage)


def test_status_shows_the_same_from_the_running_summary_as_from_the_records(running, capsys, monkeypatch):
    """`status`, `status JOB` and their --json, character for character, with and without the running summary."""
    commands = (("status",), ("status", "--json"), ("status", JOB), ("status", "--json", JOB))
    shown = {argv: _shown(capsys, *argv) for argv in commands}
    monkeypatch.setattr(Store, "running_summary", lambda self, job_id: None)
    assert {argv: _shown(capsys, *argv) for argv in commands} == shown
    assert json.loads(shown[("status", "--json", JOB)])["metrics"]["steps"] == 450


def test_a_finished_jobs_stored_summary_is_what_status_shows(running, capsys):
    before = json.loads(_shown(capsys, "status", "--json", JOB))["metrics"]
    running.transition(JOB, SUCCEEDED, summary=summarize(running.metrics(JOB), running.samples(JOB)))
    running._execute("DELETE FROM tally_ranks")  # the stored summary is read, not the running one
    assert json.loads(_shown(capsys, "status", "--json", JOB))["metrics"] == before


def test_a_rank_tally_is_a_row_and_its_values_a_row_a_chunk(running):
    """Appending a batch rewrites a chunk of a rank's values, never all of them."""
    chunks = running._query("SELECT rank, warmup, count(*), max(length(interval_s)) FROM tally_values WHERE "
                            "job_id = ? AND attempt = 1 GROUP BY rank, warmup", (JOB,))
    steady = {row[0]: (row[2], row[3]) for row in chunks if row[1] == 0}
    assert steady[0] == (1, 88 * 8), "88 records past warm-up, one chunk"
    store = running
    store.add_batch(JOB, 1, Batch(records=[MetricRecord(rank=0, node=0, step=1000 + i, interval_s=0.5, samples=2)
                               for i in range(CHUNK)]))
    for i in range(2 * CHUNK):
        store.add_batch(JOB, 1, Batch(records=[MetricRecord(rank=0, node=0, step=2000 + i, interval_s=0.5, samples=2)]))
    rows = store._query("SELECT chunk, length(interval_s) / 8 FROM tally_values WHERE job_id = ? AND attempt = 1 "
                        "AND rank = 0 AND warmup = 0 ORDER BY chunk", (JOB,))
    assert [tuple(row) for row in rows] == [(0, 88 + CHUNK), (1, 168), (2, CHUNK), (3, 88)]
    assert store.running_summary(JOB) == summarize(store.metrics(JOB), store.samples(JOB))


def test_the_records_past_the_cap_are_not_tallied(home):
    store = Store()
    store._execute("INSERT INTO jobs (id, name, state, created_at, attempt) VALUES ('cap-1', 'c', 'RUNNING', 1.0, 0)")
    store.max_metric_records = 10
    store.add_batch("cap-1", 0, Batch(records=[MetricRecord(rank=0, step=i, interval_s=1.0, samples=i) for i in range(1, 8)]))
    store.add_batch("cap-1", 0, Batch(records=[MetricRecord(rank=r, step=9, interval_s=1.0, samples=1) for r in range(5)]))
    summary = store.running_summary("cap-1")
    assert summary is not None and summary.records == 10 and [r.rank for r in summary.per_rank] == [0, 1, 2]
    assert summary == summarize(store.metrics("cap-1"))


@pytest.mark.parametrize("damage", [
    "INSERT INTO metrics (job_id, attempt, rank, step, record) VALUES ('{job}', 1, 0, 9, '{{\"v\":1,\"rank\":0,\"step\":9}}')",
    "UPDATE tally_ranks SET node = 'x' WHERE job_id = '{job}' AND rank = 2",
    "UPDATE tally_values SET interval_s = x'00' WHERE job_id = '{job}' AND rank = 2",
    "UPDATE tally_ranks SET warmup_records = warmup_records + 1 WHERE job_id = '{job}' AND rank = 2",
])
def test_records_the_running_summary_does_not_count_or_a_damaged_row_are_summarised_from_the_records(running, damage):
    """A record stored without its tally (an older launch still running the job) or a row that does not read as
    written: the summary is made from the records, as before."""
    running._execute(damage.format(job=JOB))
    assert running.running_summary(JOB) is None
    assert jobstatus.job_summary(running, running.job(JOB)) == summarize(running.metrics(JOB), running.samples(JOB))


def test_a_figure_the_running_summary_does_not_keep_is_read_from_the_records(running, monkeypatch):
    column = Column("test_metric", job=maximum("test_metric"), rank=maximum("test_metric"))
    monkeypatch.setattr(columns, "COLUMNS", (*columns.COLUMNS, column))
    assert running.running_summary(JOB) is None
    assert jobstatus.job_summary(running, running.job(JOB)) == summarize(running.metrics(JOB), running.samples(JOB))
