"""Job summaries: figures from the Reporter's records, memory from the node agent's samples, stored summaries read back."""

from __future__ import annotations

import json

import pytest

from launcher.metrics.aggregate import summarize
from launcher.metrics.record import MetricRecord, RankUsage
from launcher.metrics.summary import JobSummary

MB = 1024 * 1024


def _record(rank: int, step: int, *, mem_mb: float | None = 100.0, attempt: int = 0, warmup: bool = False,
            gpu_util: float | None = None) -> MetricRecord:
    return MetricRecord(rank=rank, node=0, host="h0", step=step, attempt=attempt, steps=10, interval_s=1.0,
                        step_time_s=0.1, samples=80, tokens=0, warmup=warmup, gpu_util=gpu_util,
                        mem_peak_bytes=None if mem_mb is None else int(mem_mb * MB))


def _usage(rank: int, *, rss_mb: float, gpu_mb: float | None = None, util: float | None = None,
           attempt: int = 0) -> RankUsage:
    return RankUsage(attempt=attempt, node=1, rank=rank, host="h1", pid=1000 + rank, cpu_s=5.0, rss_bytes=int(rss_mb * MB),
                     rss_peak_bytes=int(rss_mb * MB), gpu_mem_peak_bytes=None if gpu_mb is None else int(gpu_mb * MB),
                     gpu_util_mean=util, samples=3)


def test_a_program_without_the_reporter_gets_per_rank_entries_and_peak_memory_from_samples():
    summary = summarize([], [_usage(0, rss_mb=300), _usage(1, rss_mb=500)])
    assert [r.rank for r in summary.per_rank] == [0, 1]
    assert [r.peak_mem_mb for r in summary.per_rank] == [300.0, 500.0]
    assert [(r.node, r.host, r.steps) for r in summary.per_rank] == [(1, "h1", 0), (1, "h1", 0)]
    assert summary.peak_mem_mb == 500.0
    assert summary.samples_per_sec is None and summary.tokens_per_sec is None and summary.step_time_ms_p50 is None
    assert all(r.samples_per_sec is None for r in summary.per_rank)


def test_the_reporters_peak_wins_over_the_sampled_one_and_gpu_memory_is_sampled_on_gpus():
    records = [_record(0, 10, mem_mb=100.0), _record(0, 20, mem_mb=120.0)]
    summary = summarize(records, [_usage(0, rss_mb=900), _usage(1, rss_mb=900, gpu_mb=700)])
    by_rank = {r.rank: r for r in summary.per_rank}
    assert by_rank[0].peak_mem_mb == 120.0, "rank 0 reported through the Reporter"
    assert by_rank[1].peak_mem_mb == 700.0, "rank 1 only sampled, on a GPU: the GPU memory it used"
    assert summary.peak_mem_mb == 700.0


def test_gpu_util_from_the_reporter_else_from_samples():
    assert summarize([], [_usage(0, rss_mb=1, util=0.5), _usage(1, rss_mb=1, util=0.7)]).gpu_util == pytest.approx(0.6)
    records = [_record(0, 10, gpu_util=0.9)]
    assert summarize(records, [_usage(0, rss_mb=1, util=0.1)]).gpu_util == pytest.approx(0.9)


def test_the_latest_attempt_is_summarised_across_records_and_samples():
    records = [_record(0, 10, attempt=0), _record(0, 20, attempt=0)]
    summary = summarize(records, [_usage(0, rss_mb=50, attempt=1)])
    assert summary.records == 0 and summary.peak_mem_mb == 50.0
    assert summarize(records, [_usage(0, rss_mb=50, attempt=1)], attempt=0).steps == 20


def test_reporter_figures_are_unchanged():
    records = [_record(r, s, warmup=s == 10) for r in range(2) for s in (10, 20, 30)]
    summary = summarize(records)
    assert summary.steps == 30 and summary.records == 6
    assert summary.samples_per_sec == pytest.approx(2 * 80.0)
    assert summary.step_time_ms_p50 == pytest.approx(100.0) and summary.steps_per_sec == pytest.approx(10.0)
    assert summary.tokens_per_sec is None, "no tokens reported: unknown, not 0"


def test_a_zero_step_time_does_not_divide_by_zero():
    record = MetricRecord(rank=0, step=1, steps=1, interval_s=0.0, step_time_s=0.0, samples=1)
    summary = summarize([record])
    assert summary.steps_per_sec is None and summary.step_time_ms_p50 == 0.0
    json.dumps(summary.as_json(), allow_nan=False)


@pytest.mark.parametrize(
    "stored",
    [
        None, "a string", [1, 2], 7,
        {"steps": "many", "samples_per_sec": "fast", "peak_mem_mb": float("nan"), "loss": float("inf"), "per_rank": "x"},
        {"per_rank": [1, None, {"rank": "x"}, {"rank": 0, "peak_mem_mb": float("-inf"), "host": ["h"]}]},
        {"gpu_util": {"nested": 1}, "records": -3, "per_rank": [{"rank": 2, "samples_per_sec": 10.0, "steps": 4}]},
    ],
)
def test_any_stored_summary_reads_as_finite_figures(stored):
    summary = JobSummary.from_stored(stored)
    data = summary.as_json()
    json.dumps(data, allow_nan=False)
    assert isinstance(summary.steps, int) and summary.steps >= 0 and summary.records >= 0
    assert all(isinstance(r.rank, int) for r in summary.per_rank)


def test_a_stored_summary_round_trips():
    summary = summarize([_record(r, s) for r in range(2) for s in (10, 20)], [_usage(2, rss_mb=10)])
    assert JobSummary.from_stored(json.loads(json.dumps(summary.as_json()))) == summary
