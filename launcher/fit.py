"""Will it fit? Per-GPU memory of a recipe job under each strategy, against the cluster's GPUs.

Pure: built on ``launcher.memory`` (DeepSpeed's estimator formulas) and the
recipes' analytic model facts, so the planner and `launch plan` can use it
without torch or deepspeed.
"""

from __future__ import annotations

from typing import Any

from launcher.memory import GIB, MemoryEstimate, estimate, recommend
from launcher.recipes import recipe_info
from launcher.spec.job import JobSpec
from launcher.strategies import STRATEGIES

# Without a known GPU size (CPU nodes, or gpu.memory_gb unset) estimates are shown, never enforced.
UNKNOWN_GPU_GB = 1e9


def _info(job: JobSpec):
    return recipe_info(job.recipe, size=job.model.size, seq_len=job.model.seq_len, num_layers=job.model.num_layers)


def strategy_estimates(job: JobSpec, micro_batch: int, nnodes: int, nproc: int, gpu_gb: float | None) -> list[MemoryEstimate]:
    """The estimate of every strategy for this job's model, precision and micro batch."""
    info = _info(job)
    return [estimate(info, s, job.precision, micro_batch, nnodes, nproc, gpu_gb or UNKNOWN_GPU_GB) for s in STRATEGIES]


def memory_fit(job: JobSpec, micro_batch: int, nnodes: int, nproc: int, gpu_gb: float | None) -> dict[str, Any] | None:
    """The chosen strategy's estimate and the recommendation, as plan data; None for entrypoints.

    ``fits`` is None when the GPU size is unknown.
    """
    if job.recipe is None:
        return None
    info = _info(job)
    chosen = estimate(info, job.strategy, job.precision, micro_batch, nnodes, nproc, gpu_gb or UNKNOWN_GPU_GB)
    data: dict[str, Any] = {
        "params": info.params,
        "strategy": job.strategy,
        "model_states_gib": round(chosen.model_states_bytes / GIB, 3),
        "activations_gib": round(chosen.activation_bytes / GIB, 3),
        "total_gib": round(chosen.total_bytes / GIB, 3),
        "gpu_memory_gib": gpu_gb,
        "usable_gib": round(chosen.usable_bytes / GIB, 3) if gpu_gb else None,
        "fits": chosen.fits if gpu_gb else None,
        "cpu_gib_per_node": round(chosen.cpu_bytes_per_node / GIB, 3),
    }
    if gpu_gb:
        rec = recommend(info, job.precision, micro_batch, nnodes, nproc, gpu_gb)
        data["recommended"] = rec.strategy
        data["reason"] = rec.reason
    return data


def misfit_problem(fit: dict[str, Any] | None) -> str | None:
    """A planning problem when the chosen strategy does not fit the GPUs, else None."""
    if not fit or fit["fits"] is not False:
        return None
    advice = f"use strategy '{fit['recommended']}' ({fit['reason']})" if fit.get("recommended") else fit.get("reason", "")
    return (
        f"strategy: '{fit['strategy']}' needs about {fit['total_gib']:.1f} GiB a GPU (model states "
        f"{fit['model_states_gib']:.1f} + activations {fit['activations_gib']:.1f}) but {fit['usable_gib']:.1f} GiB "
        f"of {fit['gpu_memory_gib']:g} are usable; {advice}"
    )
