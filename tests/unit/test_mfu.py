"""MFU: the GPU peak table, the cluster spec's override, and the formula."""

from __future__ import annotations

import pytest

from launcher.metrics import mfu
from launcher.metrics.record import MetricRecord
from launcher.metrics.summary import JobSummary, RankSummary


def _spec(gpu: dict | None = None) -> dict:
    """A job's stored specs with this cluster ``gpu`` section."""
    return {"cluster": {"gpu": gpu or {}}}


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("a800-sxm4-80gb", 312.0),
        ("NVIDIA A800 80GB PCIe", 312.0),
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H200", 989.0),
        ("h200 nvl", 989.0),
    ],
)
def test_table_matches_gpu_names_case_insensitively(name: str, peak: float) -> None:
    assert mfu.table_peak_tflops(name) == peak


@pytest.mark.parametrize("name", [None, "", "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-32GB", "cpu"])
def test_unknown_gpus_have_no_peak(name: str | None) -> None:
    assert mfu.table_peak_tflops(name) is None


def test_cluster_peak_tflops_wins_over_the_table() -> None:
    assert mfu.peak_tflops(_spec({"name": "A100-SXM4-80GB", "peak_tflops": 400.0})) == 400.0


def test_peak_from_cluster_gpu_name_then_from_records() -> None:
    assert mfu.peak_tflops(_spec({"name": "A800-SXM4-80GB"})) == 312.0
    records = [MetricRecord(rank=0, step=10, gpu_name="NVIDIA H100 80GB HBM3")]
    assert mfu.peak_tflops(_spec(), records) == 989.0
    assert mfu.gpu_name(_spec({"name": "A800"}), records) == "A800"
    assert mfu.peak_tflops(_spec()) is None
    assert mfu.peak_tflops(None) is None


def test_mfu_formula() -> None:
    # 8 GPUs at 312 TFLOP/s = 2.496 PFLOP/s; 1000 samples/s of 1.2 TFLOP each = 1.2 PFLOP/s;
    # 1.2 / 2.496 = 0.48076923...
    assert mfu.mfu(1000.0, 1.2e12, 8, 312.0) == pytest.approx(0.48076923, rel=1e-7)


@pytest.mark.parametrize(
    "args", [(None, 1e9, 8, 312.0), (10.0, None, 8, 312.0), (10.0, 1e9, None, 312.0), (10.0, 1e9, 8, None), (0.0, 1e9, 8, 312.0)]
)
def test_mfu_is_none_when_anything_is_unknown(args) -> None:
    assert mfu.mfu(*args) is None


def test_job_mfu_uses_the_whole_job_throughput_over_all_gpus() -> None:
    summary = JobSummary(samples_per_sec=2000.0, flops_per_sample=5e11, per_rank=tuple(RankSummary(rank=r) for r in range(4)))
    # 2000 samples/s x 5e11 FLOP = 1.0e15 FLOP/s over 4 x 989 TFLOP/s = 3.956e15: 1 / 3.956 = 0.25278058...
    assert mfu.job_mfu(4, _spec({"name": "NVIDIA H100 80GB HBM3"}), summary) == pytest.approx(0.25278058, rel=1e-7)


def test_job_mfu_falls_back_to_the_rank_count_for_the_world_size() -> None:
    summary = JobSummary(samples_per_sec=100.0, flops_per_sample=1e12, per_rank=(RankSummary(rank=0), RankSummary(rank=1)))
    assert mfu.job_mfu(None, _spec({"peak_tflops": 100.0}), summary) == pytest.approx(0.5)


def test_rank_mfu_is_one_rank_on_one_gpu() -> None:
    assert mfu.rank_mfu(50.0, 2e12, 100.0) == pytest.approx(1.0)
    assert mfu.rank_mfu(50.0, None, 100.0) is None
    assert mfu.rank_mfu(None, 2e12, 100.0) is None
