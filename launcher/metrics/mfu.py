"""Model FLOPs utilisation: achieved training FLOP/s over the GPUs' dense bf16 peak.

MFU = samples/s x FLOPs per sample / (world size x peak FLOP/s per GPU).

FLOPs per sample come from the records (a recipe that knows its model sets
``flops_per_sample`` on the Reporter). The peak comes from the cluster spec's
``gpu.peak_tflops`` when given, else from a small table matched against the
GPU's name: the cluster spec's ``gpu.name`` or a ``gpu_name`` the rank put
in its records. Unknown GPUs (and CPU runs) have no MFU.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.metrics.record import MetricRecord
    from launcher.metrics.summary import JobSummary

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from the vendor data sheets.
# Matched in order, case-insensitively, as substrings of the GPU name.
PEAK_TFLOPS_BF16: tuple[tuple[str, float], ...] = (
    ("h200", 989.0),
    ("h100", 989.0),
    ("h800", 989.0),
    ("a800", 312.0),
    ("a100", 312.0),
)


def table_peak_tflops(gpu_name: str | None) -> float | None:
    """The dense bf16 peak (TFLOP/s) of a GPU named like ``NVIDIA A800-SXM4-80GB``; None if unknown."""
    if not gpu_name:
        return None
    name = gpu_name.lower()
    for key, peak in PEAK_TFLOPS_BF16:
        if key in name:
            return peak
    return None


def cluster_gpu(spec: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """The ``gpu`` section of the cluster spec in a job's stored specs ({} when absent or not a mapping)."""
    section: Any = spec
    for key in ("cluster", "gpu"):
        section = section.get(key) if isinstance(section, Mapping) else None
    return section if isinstance(section, Mapping) else {}


def gpu_name(spec: Mapping[str, Any] | None, records: Sequence[MetricRecord] = ()) -> str | None:
    """The GPU's name: the cluster spec's ``gpu.name`` (``spec``: a job's stored specs), else one reported by a rank."""
    name = cluster_gpu(spec).get("name")
    if isinstance(name, str) and name:
        return name
    return next((r.gpu_name for r in reversed(records) if r.gpu_name), None)


def peak_tflops(spec: Mapping[str, Any] | None, records: Sequence[MetricRecord] = ()) -> float | None:
    """Peak TFLOP/s per GPU for a job: ``gpu.peak_tflops`` from its cluster spec wins, else the table."""
    override = cluster_gpu(spec).get("peak_tflops")
    if isinstance(override, (int, float)) and not isinstance(override, bool) and math.isfinite(override) and override > 0:
        return float(override)
    return table_peak_tflops(gpu_name(spec, records))


def mfu(
    samples_per_sec: float | None,
    flops_per_sample: float | None,
    world_size: int | None,
    peak_tflops_per_gpu: float | None,
) -> float | None:
    """MFU as a fraction (0.45 = 45%); None when any input is unknown."""
    if not (samples_per_sec and flops_per_sample and world_size and peak_tflops_per_gpu):
        return None
    return samples_per_sec * flops_per_sample / (world_size * peak_tflops_per_gpu * 1e12)


def job_mfu(world_size: int | None, spec: Mapping[str, Any] | None, summary: JobSummary,
            records: Sequence[MetricRecord] = ()) -> float | None:
    """The MFU of a job from its summary (whole-job samples/s over all its ranks; ``spec``: its stored specs)."""
    world = world_size if isinstance(world_size, int) and world_size > 0 else len(summary.per_rank) or None
    return mfu(summary.samples_per_sec, summary.flops_per_sample, world, peak_tflops(spec, records))


def rank_mfu(samples_per_sec: float | None, flops_per_sample: float | None, peak: float | None) -> float | None:
    """The MFU of one rank (its own samples/s on its one GPU)."""
    return mfu(samples_per_sec, flops_per_sample, 1, peak)
