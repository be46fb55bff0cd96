"""Comparison table data and straggler detection (pure: records built in the test)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from launcher.store.rows import JobRow
from launcher.store.states import JobState
from launcher.views import compare

MB = 1024 * 1024


def _records(rank: int, step_time_s: float, samples: int = 32, mem_mb: float = 100.0, steps: int = 40,
             every: int = 10, flops: float | None = 1e9, loss: float = 1.0) -> list[dict]:
    """Reporter-shaped records of one rank: one per interval, the first flagged warm-up."""
    out = []
    for step in range(every, steps + 1, every):
        interval = step_time_s * every
        out.append({
            "v": 1, "job": "j", "node": rank // 8, "rank": rank, "host": f"h{rank // 8}", "step": step,
            "t": 1000.0 + step, "steps": every, "interval_s": interval, "step_time_s": step_time_s,
            "samples": samples * every, "tokens": 0, "samples_per_sec": samples * every / interval,
            "tokens_per_sec": 0.0, "loss": loss / step, "mem_peak_bytes": int(mem_mb * MB),
            "warmup": step <= every, "attempt": 0, **({"flops_per_sample": flops} if flops else {}),
        })
    return out


def _job(job_id: str, strategy: str = "ddp", world: int = 4, gpu: dict | None = None,
         state: JobState = JobState.SUCCEEDED, dist_backend: str = "nccl") -> JobRow:
    return JobRow(
        id=job_id, name=job_id, state=state, reason=None, strategy=strategy, precision="bf16", world_size=world,
        grad_accum=1, nnodes=1, nproc_per_node=world, global_batch=32 * world, micro_batch=32, max_steps=40,
        spec={"cluster": {"gpu": gpu or {}}}, plan={"dist_backend": dist_backend},
    )


def test_rank_more_than_ten_percent_slower_than_the_median_is_a_straggler() -> None:
    per_rank = [{"rank": r, "step_time_ms_p50": t} for r, t in enumerate([100.0, 101.0, 99.0, 112.0])]
    assert compare.stragglers(per_rank) == [3]
    assert compare.rank_slowdowns(per_rank)[3] == pytest.approx(112.0 / 100.5)


def test_exactly_ten_percent_slower_is_not_a_straggler() -> None:
    per_rank = [{"rank": 0, "step_time_ms_p50": 100.0}, {"rank": 1, "step_time_ms_p50": 100.0},
                {"rank": 2, "step_time_ms_p50": 110.0}]
    assert compare.stragglers(per_rank) == []


def test_stragglers_by_throughput_when_step_times_are_missing() -> None:
    per_rank = [{"rank": r, "step_time_ms_p50": None, "samples_per_sec": s} for r, s in enumerate([100.0, 100.0, 80.0])]
    assert compare.stragglers(per_rank) == [2]


def test_one_rank_or_none_has_no_stragglers() -> None:
    assert compare.stragglers([]) == []
    assert compare.stragglers([{"rank": 0, "step_time_ms_p50": 500.0}]) == []


def test_job_metrics_flags_the_slow_rank_and_keeps_summary_keys() -> None:
    records = [r for rank in range(4) for r in _records(rank, 0.25 if rank == 2 else 0.2)]
    metrics = compare.job_metrics(_job("a"), records)
    for key in ("steps", "samples_per_sec", "step_time_ms_p50", "step_time_ms_p95", "peak_mem_mb", "per_rank", "loss"):
        assert key in metrics
    assert metrics["stragglers"] == [2]
    flags = {r["rank"]: r["straggler"] for r in metrics["per_rank"]}
    assert flags == {0: False, 1: False, 2: True, 3: False}
    assert metrics["per_rank"][2]["slowdown"] == pytest.approx(1.25)


def test_job_metrics_mfu_needs_a_known_peak() -> None:
    records = [r for rank in range(4) for r in _records(rank, 0.2, flops=1e12)]
    assert compare.job_metrics(_job("a"), records)["mfu"] is None
    metrics = compare.job_metrics(_job("a", gpu={"name": "A800-SXM4-80GB"}), records)
    # 4 ranks x 160 samples/s x 1e12 FLOP over 4 x 312 TFLOP/s
    assert metrics["mfu"] == pytest.approx(4 * 160.0 * 1e12 / (4 * 312e12))
    assert metrics["per_rank"][0]["mfu"] == pytest.approx(160.0 * 1e12 / 312e12)
    assert metrics["peak_tflops"] == 312.0


def test_comparison_ratios_are_against_the_first_job() -> None:
    base = _job("ddp", "ddp")
    zero3 = _job("zero3", "zero3")
    rows = compare.comparison([
        (base, compare.job_metrics(base, [r for k in range(4) for r in _records(k, 0.2, mem_mb=1000)])),
        (zero3, compare.job_metrics(zero3, [r for k in range(4) for r in _records(k, 0.25, mem_mb=400)])),
    ])
    assert [r["strategy"] for r in rows] == ["ddp", "zero3"]
    assert rows[0]["baseline"] and not rows[1]["baseline"]
    assert rows[0]["speedup"] == pytest.approx(1.0)
    assert rows[1]["speedup"] == pytest.approx(0.8)
    assert rows[1]["mem_ratio"] == pytest.approx(0.4)
    assert rows[1]["step_time_ms"] == pytest.approx(250.0)
    assert rows[1]["steps_per_sec"] == pytest.approx(4.0)
    assert rows[1]["world_size"] == 4 and rows[1]["precision"] == "bf16"


def test_failed_rows_stay_and_the_baseline_is_the_first_with_metrics() -> None:
    ok = _job("ok", "zero2")
    rows = compare.with_ratios([
        compare.failed_row("ddp", "preflight failed: no GPU"),
        compare.compare_row(ok, compare.job_metrics(ok, _records(0, 0.1))),
    ])
    assert rows[0]["state"] == "FAILED" and rows[0]["speedup"] is None and not rows[0]["baseline"]
    assert rows[1]["baseline"] and rows[1]["speedup"] == pytest.approx(1.0)


def test_a_job_without_records_has_empty_figures() -> None:
    metrics = compare.job_metrics(_job("empty", state=JobState.FAILED), [])
    row = compare.with_ratios([compare.compare_row(_job("empty", state=JobState.FAILED), metrics)])[0]
    assert row["samples_per_sec"] is None and row["speedup"] is None and metrics["stragglers"] == []


def _text(renderable) -> str:
    out = io.StringIO()
    Console(file=out, width=250, highlight=False).print(renderable)
    return out.getvalue()


def test_comparison_table_shows_failures_with_reasons_and_stragglers() -> None:
    ok = _job("ok", "ddp")
    records = [r for rank in range(4) for r in _records(rank, 0.3 if rank == 1 else 0.2)]
    rows = compare.with_ratios([
        compare.compare_row(ok, compare.job_metrics(ok, records)),
        compare.failed_row("zero3", "exit code 1 on node 0 [rank 3]"),
    ])
    text = _text(compare.comparison_table(rows))
    for header in ("STRATEGY", "PRECISION", "WORLD", "STEP MS", "STEPS/S", "SAMPLES/S", "TOKENS/S", "MEM/GPU",
                   "GPU UTIL", "MFU", "SPEED-UP", "MEM RATIO"):
        assert header in text
    assert "zero3: failed: exit code 1 on node 0 [rank 3]" in text
    assert "ok: straggler rank(s) 1" in text


def test_unlike_jobs_are_warned_and_each_shows_its_global_batch_wall_time_first_step_and_timed_steps() -> None:
    """A speed-up of jobs with another global batch or world size is no speed-up: the comparison says so."""
    import dataclasses

    big = dataclasses.replace(_job("big", world=3), started_at=1000.0, ended_at=1100.0)
    small = dataclasses.replace(_job("small", world=2), started_at=1000.0, ended_at=1040.0)
    rows = compare.comparison([(job, compare.job_metrics(job, [r for rank in range(job.world_size or 0)
                                                               for r in _records(rank, 0.2)])) for job in (big, small)])
    assert (rows[0]["wall_s"], rows[0]["timed_steps"], rows[0]["global_batch"]) == (100.0, 30, 96)
    assert rows[0]["first_step_s"] == pytest.approx(10 - 0.2 * 9)  # the first record at 1010, its 10 steps 0.2 s each
    text = _text(compare.comparison_table(rows))
    assert "warning: the jobs differ in global batch (big 96, small 64)" in text
    assert "warning: the jobs differ in world size (big 3, small 2)" in text and "differ in precision" not in text
    for header in ("GLOBAL BATCH", "WALL", "1ST STEP", "TIMED STEPS"):
        assert header in text
    assert not compare.unlike(compare.comparison([(big, {}), (dataclasses.replace(big, id="again"), {})]))


def test_a_job_restarted_once_shows_its_two_attempts_and_goodput_beside_a_job_of_one() -> None:
    """compare tells a job's story in attempts: the restarted job's row says 2 attempts and its goodput (the time lost
    between its attempts counts against it), the other job 1 attempt and every second kept."""
    import dataclasses

    once = dataclasses.replace(_job("once", world=2), started_at=1000.0, ended_at=1040.0)
    twice = dataclasses.replace(_job("twice", world=2), started_at=1000.0, ended_at=1100.0)
    # attempt 0 reports steps 10-40 at t 1010-1040; attempt 1 resumes at step 30 (10 steps redone) 20 s later
    second = [dict(r, attempt=1, t=r["t"] + 50.0) for rank in range(2) for r in _records(rank, 0.2) if r["step"] > 20]
    first = [r for rank in range(2) for r in _records(rank, 0.2)]
    rows = compare.comparison([(once, compare.job_metrics(once, first)),
                               (twice, compare.job_metrics(twice, first + [dict(r, step=r["step"] + 10) for r in second]))])
    assert (rows[0]["attempts"], rows[1]["attempts"]) == (1, 2)
    assert rows[0]["goodput"] == 1.0 and rows[1]["steps_redone"] == 10
    # lost: 10 steps redone at 0.2 s, and 38 s from attempt 0's last record (1040) to attempt 1's first step (1078)
    assert rows[1]["goodput"] == pytest.approx(1 - (10 * 0.2 + 38) / 100)
    text = _text(compare.comparison_table(rows))
    assert "ATTEMPTS" in text and "GOODPUT" in text
    assert "twice: 2 attempts, goodput" in text and "(10 step(s) redone)" in text and "once: 1 attempts" not in text


def test_metrics_renderables_name_the_straggler() -> None:
    records = [r for rank in range(3) for r in _records(rank, 0.3 if rank == 0 else 0.2)]
    parts = compare.metrics_renderables(_job("j", world=3), compare.job_metrics(_job("j", world=3), records))
    text = "".join(_text(p) for p in parts)
    assert "STRAGGLER" in text
    assert "straggler: rank 0 on h0 (node 0) is 50% slower than the median rank" in text
    assert "set gpu.name or gpu.peak_tflops" in text and "per GPU (max over ranks)" in text


def test_metrics_of_a_job_on_cpu_slots_say_per_rank_and_ask_for_no_gpu_name() -> None:
    cpu = _job("j", world=2, dist_backend="gloo")
    records = [r for rank in range(2) for r in _records(rank, 0.2)]
    text = "".join(_text(p) for p in compare.metrics_renderables(cpu, compare.job_metrics(cpu, records)))
    assert "peak 100 MB per rank (max over ranks)" in text and "per GPU" not in text
    assert "gpu.name" not in text and "CPU ranks: MFU is measured against a GPU's peak" in text


@pytest.mark.parametrize(("value", "text"), [(None, "-"), (0.4512, "45.1%"), (2.49e-6, "0.000249%")])
def test_percentages_keep_three_significant_digits(value, text) -> None:
    assert compare.fmt_pct(value) == text


@pytest.mark.parametrize(("mb", "text"), [(None, "-"), (359.3, "359 MB"), (20480.0, "20.0 GB")])
def test_memory_cells(mb, text) -> None:
    assert compare.fmt_mem(mb) == text
