"""Will it fit? Per-GPU memory of a recipe job under each strategy, against the cluster's GPUs.

Pure: built on ``launcher.plan.memory`` (DeepSpeed's estimator formulas) and the
recipes' analytic model facts, so the planner and `launch plan` can use it
without torch or deepspeed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from launcher.catalog.recipes import RecipeInfo, recipe_info
from launcher.catalog.strategies import STRATEGIES
from launcher.plan.memory import GIB, MemoryEstimate, estimate, recommend
from launcher.spec.job import JobSpec

# Without a known GPU size (CPU nodes, or gpu.memory_gb unset) estimates are shown, never enforced.
UNKNOWN_GPU_GB = 1e9


def _info(job: JobSpec) -> RecipeInfo:
    if job.recipe is None:  # callers ask for recipes only
        raise ValueError("an entrypoint job's model is unknown: memory is estimated for built-in recipes")
    return recipe_info(job.recipe, size=job.model.size, seq_len=job.model.seq_len, num_layers=job.model.num_layers)


def strategy_estimates(job: JobSpec, micro_batch: int, nnodes: int, nproc: int, gpu_gb: float | None) -> list[MemoryEstimate]:
    """The estimate of every strategy for this job's model, precision and micro batch."""
    info = _info(job)
    return [estimate(info, s, job.precision, micro_batch, nnodes, nproc, gpu_gb or UNKNOWN_GPU_GB) for s in STRATEGIES]


class MemoryFit(BaseModel):
    """The chosen strategy's per-GPU estimate and the recommendation, as the plan carries it.

    ``fits`` is None when the GPU size is unknown (CPU ranks, or gpu.memory_gb unset).
    """

    model_config = ConfigDict(frozen=True)

    params: int
    strategy: str
    model_states_gib: float
    activations_gib: float
    total_gib: float
    gpu_memory_gib: float | None
    usable_gib: float | None
    fits: bool | None
    cpu_gib_per_node: float
    recommended: str | None = None
    reason: str | None = None


def memory_fit(job: JobSpec, micro_batch: int, nnodes: int, nproc: int, gpu_gb: float | None) -> MemoryFit | None:
    """The chosen strategy's estimate and the recommendation; None for entrypoints."""
    if job.recipe is None:
        return None
    info = _info(job)
    chosen = estimate(info, job.strategy, job.precision, micro_batch, nnodes, nproc, gpu_gb or UNKNOWN_GPU_GB)
    rec = recommend(info, job.precision, micro_batch, nnodes, nproc, gpu_gb) if gpu_gb else None
    return MemoryFit(
        params=info.params,
        strategy=job.strategy,
        model_states_gib=round(chosen.model_states_bytes / GIB, 3),
        activations_gib=round(chosen.activation_bytes / GIB, 3),
        total_gib=round(chosen.total_bytes / GIB, 3),
        gpu_memory_gib=gpu_gb,
        usable_gib=round(chosen.usable_bytes / GIB, 3) if gpu_gb else None,
        fits=chosen.fits if gpu_gb else None,
        cpu_gib_per_node=round(chosen.cpu_bytes_per_node / GIB, 3),
        recommended=rec.strategy if rec else None,
        reason=rec.reason if rec else None,
    )


def misfit_problem(fit: MemoryFit | None) -> str | None:
    """A planning problem when the chosen strategy does not fit the GPUs, else None."""
    if fit is None or fit.fits is not False:
        return None
    advice = f"use strategy '{fit.recommended}' ({fit.reason})" if fit.recommended else (fit.reason or "")
    return (
        f"strategy: '{fit.strategy}' needs about {fit.total_gib:.1f} GiB a GPU (model states "
        f"{fit.model_states_gib:.1f} + activations {fit.activations_gib:.1f}) but {fit.usable_gib:.1f} GiB "
        f"of {fit.gpu_memory_gib:g} are usable; {advice}"
    )
