"""Per-GPU memory estimates for a recipe under each strategy, and a recommendation.

Pure arithmetic, no torch or deepspeed import. Model-state formulas for the
ZeRO strategies reproduce DeepSpeed's own estimators
(``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs``
and ``deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs``),
which assume mixed-precision Adam; fp32 variants follow the same bookkeeping
with 4-byte copies. DDP keeps everything replicated: 4 B fp32 parameters +
4 B gradients + 8 B Adam moments = 16 B/param, with or without AMP (autocast
keeps fp32 master weights). Activations come from the recipe's analytic
per-sample estimate (16-bit; doubled for fp32) times the micro batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.recipes import RecipeInfo

GIB = 2**30
# Share of the card kept free for the CUDA context, NCCL buffers and fragmentation.
RESERVED_FRACTION = 0.10
# DeepSpeed's default ``additional_buffer_factor`` for host-memory estimates.
ADDITIONAL_BUFFER_FACTOR = 1.5
# The order ``recommend`` tries, cheapest (fastest, least communication) first.
RECOMMEND_ORDER = ("ddp_compile", "ddp", "zero2", "zero3", "zero3_offload")
STRATEGIES = RECOMMEND_ORDER + ("fsdp2",)
PRECISIONS = ("fp32", "fp16", "bf16")
TRANSFORMER_RECIPES = ("bert", "gpt2")


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


def zero2_model_states(
    total_params: int, num_gpus_per_node: int, num_nodes: int, cpu_offload: bool,
    additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR,
) -> tuple[int, int]:
    """(cpu_bytes_per_node, gpu_bytes): DeepSpeed's ZeRO-2 model-state estimate, same arithmetic."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def zero3_model_states(
    total_params: int, largest_layer_params: int, num_gpus_per_node: int, num_nodes: int,
    cpu_offload: bool, cpu_offload_params: bool, zero_init: bool,
    additional_buffer_factor: float = ADDITIONAL_BUFFER_FACTOR,
) -> tuple[int, int, int]:
    """(cpu_bytes_per_node, gpu_bytes, largest_layer_bytes): DeepSpeed's ZeRO-3 estimate, same arithmetic."""
    total_gpus = num_nodes * num_gpus_per_node
    gpus_factor = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            per_param = 18 * gpus_factor if zero_init else max(4 * num_gpus_per_node, 18 * gpus_factor)
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            per_param = 16 * gpus_factor if zero_init else max(4 * num_gpus_per_node, 16 * gpus_factor)
        cpu_mem = total_params * per_param * additional_buffer_factor
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        if zero_init:
            cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


def model_states(info: RecipeInfo, strategy: str, precision: str, nnodes: int, nproc_per_node: int) -> tuple[int, int]:
    """(gpu_bytes, cpu_bytes_per_node) for parameters, gradients and Adam states."""
    params, largest = info.params, info.largest_layer_params
    world = nnodes * nproc_per_node
    fp32 = precision == "fp32"
    load_copy = int(params * 4 * nproc_per_node * ADDITIONAL_BUFFER_FACTOR)
    if strategy in ("ddp", "ddp_compile"):
        return 16 * params, load_copy
    if strategy == "fsdp2":
        # Sharded fp32 params + grads + Adam moments, one unsharded unit in flight.
        return int(16 * params / world) + 4 * largest * (2 if fp32 else 1), load_copy
    if strategy == "zero2":
        cpu, gpu = zero2_model_states(params, nproc_per_node, nnodes, cpu_offload=False)
        if fp32:  # 4 B replicated params; 4 B grads + 4 B master + 8 B moments partitioned
            gpu = 4 * params + int(16 * params / world)
        return gpu, cpu
    if strategy in ("zero3", "zero3_offload"):
        offload = strategy == "zero3_offload"
        cpu, gpu, largest_bytes = zero3_model_states(
            params, largest, nproc_per_node, nnodes, cpu_offload=offload, cpu_offload_params=offload,
            zero_init=info.name in TRANSFORMER_RECIPES,
        )
        if fp32:  # gathered layer in 4 B; partitions hold 4+4+4+8 B per param
            gpu = 2 * largest_bytes + (0 if offload else int(20 * params / world))
        return gpu, cpu
    raise ValueError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")


def estimate(
    recipe_info: RecipeInfo, strategy: str, precision: str, micro_batch: int,
    nnodes: int, nproc_per_node: int, gpu_memory_gb: float,
) -> MemoryEstimate:
    """Estimate per-GPU memory for ``recipe_info`` trained with ``strategy``.

    ``gpu_memory_gb`` is the card's capacity in GiB (an "80GB" A800 has 80 GiB).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if micro_batch < 1 or nnodes < 1 or nproc_per_node < 1:
        raise ValueError("micro_batch, nnodes and nproc_per_node must be >= 1")
    states, cpu_bytes = model_states(recipe_info, strategy, precision, nnodes, nproc_per_node)
    activation_scale = 2 if precision == "fp32" else 1
    activations = recipe_info.activation_bytes_per_sample * micro_batch * activation_scale
    total = states + activations
    usable = int(gpu_memory_gb * GIB * (1 - RESERVED_FRACTION))
    return MemoryEstimate(
        strategy=strategy,
        precision=precision,
        model_states_bytes=states,
        activation_bytes=activations,
        total_bytes=total,
        usable_bytes=usable,
        fits=total <= usable,
        headroom=usable - total,
        cpu_bytes_per_node=cpu_bytes,
    )


def recommend(
    recipe_info: RecipeInfo, precision: str, micro_batch: int,
    nnodes: int, nproc_per_node: int, gpu_memory_gb: float,
) -> Recommendation:
    """The first strategy of ``RECOMMEND_ORDER`` whose estimate fits, with the reason.

    DDP (+ torch.compile) whenever the replicated model states fit; ZeRO-2,
    then ZeRO-3, then ZeRO-3 with CPU offload as memory demands. When nothing
    fits, ``strategy`` is None and the estimate is ZeRO-3 offload's.
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
        f"nothing fits: even ZeRO-3 with CPU offload needs {need:.1f} GiB a GPU; "
        "lower micro_batch (raise grad_accum) or add GPUs",
    )


def _reason(est: MemoryEstimate, precision: str, nnodes: int, nproc_per_node: int) -> str:
    size = f"{est.total_bytes / GIB:.1f} of {est.usable_bytes / GIB:.1f} GiB usable"
    if est.strategy in ("ddp", "ddp_compile"):
        if nnodes * nproc_per_node == 1:
            advice = "prototype on one GPU: DDP + torch.compile"
        elif nnodes == 1:
            advice = "one node: DDP + torch.compile"
        else:
            advice = "several nodes: DDP + torch.compile with gradient accumulation to cut inter-node all-reduces"
        if precision == "fp32":
            advice += " (bf16 AMP would be faster)"
        return f"{advice}; model states replicated ({size})"
    if est.strategy == "zero3_offload":
        cpu = est.cpu_bytes_per_node / GIB
        return f"model states fit only offloaded: ZeRO-3 + CPU offload ({size}; {cpu:.0f} GiB host memory a node)"
    labels = {"zero2": "ZeRO-2", "zero3": "ZeRO-3"}
    return f"replicated states do not fit: {labels[est.strategy]} ({size})"
