"""Batch arithmetic: global batch = micro batch x accumulation steps x world size."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from launcher.errors import PlanError
from launcher.spec.job import BatchSpec


class BatchPlan(BaseModel):
    """The resolved batch sizes of a run."""

    model_config = ConfigDict(frozen=True)

    micro_batch: int
    grad_accum: int
    global_batch: int
    world_size: int


def resolve_batch(batch: BatchSpec, world_size: int) -> BatchPlan:
    """Derive the missing batch number; refuse combinations that do not divide."""
    micro, accum, total = batch.micro_batch, batch.grad_accum, batch.global_batch
    if total is None:
        if micro is None:
            raise _two_of_three()
        accum = accum or 1
        total = micro * accum * world_size
    elif micro is None:
        if accum is None:
            raise _two_of_three()
        per_step = accum * world_size
        if total % per_step:
            raise PlanError(
                f"batch: global_batch {total} is not divisible by grad_accum {accum} x world size "
                f"{world_size} = {per_step}; choose a global_batch that is a multiple of {per_step}"
            )
        micro = total // per_step
    elif accum is None:
        per_accum = micro * world_size
        if total % per_accum:
            raise PlanError(
                f"batch: global_batch {total} is not divisible by micro_batch {micro} x world size "
                f"{world_size} = {per_accum}; choose a global_batch that is a multiple of {per_accum}, "
                f"e.g. {max(1, round(total / per_accum)) * per_accum}"
            )
        accum = total // per_accum
    elif micro * accum * world_size != total:
        raise PlanError(
            f"batch: micro_batch {micro} x grad_accum {accum} x world size {world_size} = "
            f"{micro * accum * world_size}, not global_batch {total}; give only two of the three"
        )
    return BatchPlan(micro_batch=micro, grad_accum=accum, global_batch=total, world_size=world_size)


def _two_of_three() -> PlanError:
    """What BatchSpec's own validator refuses already: fewer than two numbers and no micro_batch."""
    return PlanError("batch: give at least two of global_batch, micro_batch, grad_accum (or micro_batch alone)")
