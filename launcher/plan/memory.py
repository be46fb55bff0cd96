"""Per-GPU memory estimates for a recipe under each strategy, and a recommendation.

Pure arithmetic, no torch or deepspeed import. Each strategy's model-state
formula is its memory model in ``launcher.catalog.strategies`` (DeepSpeed's own
estimators for ZeRO; 16 B/param for replicated states). Activations come from
the recipe's analytic per-sample estimate (16-bit; doubled for fp32) times the
micro batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.catalog.recipes import RecipeInfo
from launcher.catalog.strategies import REGISTRY, check_precision, get_strategy

GIB = 2**30
# Share of the card kept free for the CUDA context, NCCL buffers and fragmentation.
RESERVED_FRACTION = 0.10
# The order ``recommend`` tries, cheapest (fastest, least communication) first.
RECOMMEND_ORDER = tuple(s.name for s in REGISTRY.values() if s.recommended)


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated memory for one strategy, per GPU unless named otherwise.

    ``headroom`` is the usable GPU memory (capacity less ``RESERVED_FRACTION``)
    minus ``total_bytes``; negative when it does not fit. ``cpu_bytes_per_node``
    is DeepSpeed's host-memory estimate (ZeRO offload keeps states there).
    """

    strategy: str
    precision: str
    model_states_bytes: int
    activation_bytes: int
    total_bytes: int
    usable_bytes: int
    fits: bool
    headroom: int
    cpu_bytes_per_node: int


@dataclass(frozen=True)
class Recommendation:
    """The cheapest strategy that fits (None when none does), its estimate, and why."""

    strategy: str | None
    estimate: MemoryEstimate
    reason: str


def estimate(
    recipe_info: RecipeInfo, strategy: str, precision: str, micro_batch: int,
    nnodes: int, nproc_per_node: int, gpu_memory_gb: float,
) -> MemoryEstimate:
    """Estimate per-GPU memory for ``recipe_info`` trained with ``strategy``.

    ``gpu_memory_gb`` is the card's capacity in GiB (an "80GB" A800 has 80 GiB).
    """
    check_precision(precision)
    if micro_batch < 1 or nnodes < 1 or nproc_per_node < 1:
        raise ValueError("micro_batch, nnodes and nproc_per_node must be >= 1")
    states = get_strategy(strategy).model_states(recipe_info, precision, nnodes, nproc_per_node)
    activation_scale = 2 if precision == "fp32" else 1
    activations = recipe_info.activation_bytes_per_sample * micro_batch * activation_scale
    total = states.gpu_bytes + activations
    usable = int(gpu_memory_gb * GIB * (1 - RESERVED_FRACTION))
    return MemoryEstimate(
        strategy=strategy,
        precision=precision,
        model_states_bytes=states.gpu_bytes,
        activation_bytes=activations,
        total_bytes=total,
        usable_bytes=usable,
        fits=total <= usable,
        headroom=usable - total,
        cpu_bytes_per_node=states.cpu_bytes_per_node,
    )


def recommend(
    recipe_info: RecipeInfo, precision: str, micro_batch: int,
    nnodes: int, nproc_per_node: int, gpu_memory_gb: float,
) -> Recommendation:
    """The first strategy of ``RECOMMEND_ORDER`` whose estimate fits, with the reason.

    DDP (+ torch.compile) whenever the replicated model states fit; ZeRO-2,
    then ZeRO-3, then ZeRO-3 with CPU offload as memory demands. When nothing
    fits, ``strategy`` is None and the estimate is the last one tried.
    """
    estimates = [
        estimate(recipe_info, s, precision, micro_batch, nnodes, nproc_per_node, gpu_memory_gb)
        for s in RECOMMEND_ORDER
    ]
    for est in estimates:
        if est.fits:
            return Recommendation(est.strategy, est, _reason(est, precision, nnodes, nproc_per_node))
    last = estimates[-1]
    need = last.total_bytes / GIB
    return Recommendation(
        None, last,
        f"nothing fits: even {get_strategy(last.strategy).label} needs {need:.1f} GiB a GPU; "
        "lower micro_batch (raise grad_accum) or add GPUs",
    )


def _reason(est: MemoryEstimate, precision: str, nnodes: int, nproc_per_node: int) -> str:
    size = f"{est.total_bytes / GIB:.1f} of {est.usable_bytes / GIB:.1f} GiB usable"
    strategy = get_strategy(est.strategy)
    if not strategy.shards_states:
        if nnodes * nproc_per_node == 1:
            advice = f"prototype on one GPU: {strategy.label}"
        elif nnodes == 1:
            advice = f"one node: {strategy.label}"
        else:
            advice = f"several nodes: {strategy.label} with gradient accumulation to cut inter-node all-reduces"
        if precision == "fp32":
            advice += " (bf16 AMP would be faster)"
        return f"{advice}; model states replicated ({size})"
    if strategy.offload:
        cpu = est.cpu_bytes_per_node / GIB
        return f"model states fit only offloaded: {strategy.label} ({size}; {cpu:.0f} GiB host memory a node)"
    return f"replicated states do not fit: {strategy.label} ({size})"
