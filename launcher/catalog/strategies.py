"""The training strategies of the built-in recipes: each named once, with everything launch needs.

Spec validation, the planner, the memory fit, the DeepSpeed config, the recipes and
`launch bench` read this registry; none of them names a strategy. Adding a strategy is
adding its entry to ``REGISTRY`` (and a trainer in ``launcher/recipes/strategies.py`` when
its ``Family`` is new). Pure: no torch or deepspeed import, so the CLI stays light.

The memory models reproduce DeepSpeed's own estimators for ZeRO
(``estimate_zero2_model_states_mem_needs``, ``estimate_zero3_model_states_mem_needs``),
which assume mixed-precision Adam; fp32 variants follow the same bookkeeping with 4-byte
copies. Replicated strategies keep 4 B fp32 parameters + 4 B gradients + 8 B Adam moments
= 16 B/param, with or without AMP (autocast keeps fp32 master weights).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, get_args

from launcher.catalog.recipes import LANGUAGE_MODELS, RecipeInfo

PrecisionName = Literal["fp32", "fp16", "bf16"]
LauncherName = Literal["torchrun", "deepspeed"]
PRECISIONS: tuple[str, ...] = get_args(PrecisionName)
LAUNCHERS: tuple[str, ...] = get_args(LauncherName)
DEFAULT_STRATEGY = "ddp"
# DeepSpeed's default ``additional_buffer_factor`` for host-memory estimates.
ADDITIONAL_BUFFER_FACTOR = 1.5


class Family(str, Enum):
    """Which trainer runs a strategy (``launcher/recipes/strategies.py`` maps each to its class)."""

    DDP = "ddp"  # torch DistributedDataParallel, one process per GPU
    FSDP2 = "fsdp2"  # torch fully_shard, one process per GPU
    DEEPSPEED = "deepspeed"  # deepspeed.initialize (ZeRO), one process per GPU
    DATA_PARALLEL = "data_parallel"  # torch.nn.DataParallel, one process driving a node's GPUs


class CheckpointFormat(str, Enum):
    """How a strategy's checkpoints are written; a checkpoint resumes under any strategy of the same format."""

    DCP = "torch.distributed.checkpoint"
    DEEPSPEED = "deepspeed"


@dataclass(frozen=True)
class ModelStates:
    """Bytes of parameters, gradients and optimizer states: on the fullest GPU, and in one node's host memory."""

    gpu_bytes: int
    cpu_bytes_per_node: int


@dataclass(frozen=True)
class Strategy:
    """One strategy and its rules.

    ``memory`` computes the model states from (this strategy, recipe facts, precision,
    nodes, processes per node). ``gpu_only_precisions`` are refused on CPU ranks.
    ``recommended`` strategies are tried by the planner's recommendation in registry order.
    """

    name: str
    label: str
    description: str
    family: Family
    memory: Callable[[Strategy, RecipeInfo, str, int, int], ModelStates]
    launchers: tuple[str, ...] = ("torchrun",)
    zero_stage: int | None = None
    offload: bool = False
    compiles: bool = False
    gpu_only_precisions: tuple[str, ...] = ()
    checkpoint: CheckpointFormat = CheckpointFormat.DCP
    needs_gpus: bool = False
    single_node: bool = False
    one_process_per_node: bool = False
    recommended: bool = False

    @property
    def uses_deepspeed(self) -> bool:
        return self.family is Family.DEEPSPEED

    @property
    def shards_states(self) -> bool:
        """Whether model states are partitioned across processes (else every process holds them all)."""
        return self.family in (Family.DEEPSPEED, Family.FSDP2)

    def model_states(self, info: RecipeInfo, precision: str, nnodes: int, nproc_per_node: int) -> ModelStates:
        """Per-GPU and per-node host bytes of the model states of ``info`` under this strategy."""
        return self.memory(self, info, precision, nnodes, nproc_per_node)

    def launcher_problem(self, launcher: str) -> str | None:
        """Why ``launcher`` cannot start this strategy, or None."""
        if launcher in self.launchers:
            return None
        able = names(lambda s: launcher in s.launchers)
        return (f"launcher '{launcher}' runs the strategies {', '.join(able)}; "
                f"strategy '{self.name}' runs under {' or '.join(repr(n) for n in self.launchers)}")

    def resource_problems(self, nnodes: int, nproc_per_node: int) -> list[str]:
        """Why this strategy cannot run on ``nnodes`` x ``nproc_per_node`` processes ([] when it can)."""
        problems = []
        if self.single_node and nnodes > 1:
            problems.append(
                f"resources.nodes: strategy '{self.name}' ({self.label}) runs on one node; the job asks for "
                f"{nnodes}: set resources.nodes: 1, or use a multi-node strategy such as '{DEFAULT_STRATEGY}'"
            )
        if self.one_process_per_node and nproc_per_node > 1:
            problems.append(
                f"resources.nproc_per_node: strategy '{self.name}' ({self.label}) runs one process that drives all "
                f"of the node's GPUs; the job asks for {nproc_per_node} processes a node: set "
                "resources.nproc_per_node: 1"
            )
        return problems

    def device_problems(self, precision: str, cuda: bool) -> list[str]:
        """Why this strategy cannot run at ``precision`` on this device ([] when it can)."""
        if cuda:
            return []
        if self.needs_gpus:
            return [f"strategy '{self.name}' ({self.label}) needs GPUs; this rank has none"]
        if precision in self.gpu_only_precisions:
            able = [p for p in PRECISIONS if p not in self.gpu_only_precisions]
            return [f"strategy '{self.name}' ({self.label}) needs a GPU for {precision}; use {' or '.join(able)} "
                    "on CPU ranks"]
        return []

    def spec_settings(self, launcher: str, nnodes: int, nproc_per_node: int | str) -> dict[str, str]:
        """The spec values (``--set`` keys) that run a job with these settings under this strategy."""
        settings = {"strategy": self.name}
        if launcher not in self.launchers:
            settings["launcher"] = self.launchers[0]
        if self.single_node and nnodes > 1:
            settings["resources.nodes"] = "1"
        if self.one_process_per_node and nproc_per_node != 1:
            settings["resources.nproc_per_node"] = "1"
        return settings


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


def _load_copy(info: RecipeInfo, nproc_per_node: int) -> int:
    """Host memory while every process of a node builds its full fp32 model."""
    return int(info.params * 4 * nproc_per_node * ADDITIONAL_BUFFER_FACTOR)


def _replicated(strategy: Strategy, info: RecipeInfo, precision: str, nnodes: int, nproc: int) -> ModelStates:
    """DDP, and DataParallel's GPU 0 (which keeps the optimizer; replicas hold 4 B params + 4 B grads)."""
    return ModelStates(16 * info.params, _load_copy(info, nproc))


def _fully_sharded(strategy: Strategy, info: RecipeInfo, precision: str, nnodes: int, nproc: int) -> ModelStates:
    """Sharded fp32 params + grads + Adam moments, one unsharded unit in flight."""
    in_flight = 4 * info.largest_layer_params * (2 if precision == "fp32" else 1)
    return ModelStates(int(16 * info.params / (nnodes * nproc)) + in_flight, _load_copy(info, nproc))


def _zero2(strategy: Strategy, info: RecipeInfo, precision: str, nnodes: int, nproc: int) -> ModelStates:
    """DeepSpeed's ZeRO-2 estimator (with the strategy's offload); 4-byte copies at fp32."""
    params, world = info.params, nnodes * nproc
    cpu, gpu = zero2_model_states(params, nproc, nnodes, cpu_offload=strategy.offload)
    if precision == "fp32" and not strategy.offload:  # 4 B replicated params; 4+4+8 B partitioned
        gpu = 4 * params + int(16 * params / world)
    return ModelStates(gpu, cpu)


def _zero3(strategy: Strategy, info: RecipeInfo, precision: str, nnodes: int, nproc: int) -> ModelStates:
    """DeepSpeed's ZeRO-3 estimator (offload: optimizer and parameters); 4-byte copies at fp32."""
    params, world = info.params, nnodes * nproc
    cpu, gpu, largest_bytes = zero3_model_states(
        params, info.largest_layer_params, nproc, nnodes, cpu_offload=strategy.offload,
        cpu_offload_params=strategy.offload, zero_init=info.name in LANGUAGE_MODELS,
    )
    if precision == "fp32":  # gathered layer in 4 B; partitions hold 4+4+4+8 B per param
        gpu = 2 * largest_bytes + (0 if strategy.offload else int(20 * params / world))
    return ModelStates(gpu, cpu)


_DEEPSPEED: dict[str, Any] = {
    "family": Family.DEEPSPEED, "launchers": ("torchrun", "deepspeed"),
    "gpu_only_precisions": ("fp16",), "checkpoint": CheckpointFormat.DEEPSPEED,
}

# Definition order: the order of `launch plan`'s table, and of the planner's recommendation
# (cheapest, least communication first) among the ``recommended`` ones.
REGISTRY: dict[str, Strategy] = {s.name: s for s in (
    Strategy("ddp_compile", "DDP + torch.compile",
             "torch.compile(DDP(model)): compiled kernels, all-reduce still overlapping backward",
             Family.DDP, _replicated, compiles=True, recommended=True),
    Strategy("ddp", "DDP",
             "DistributedDataParallel: one process per GPU, bucketed all-reduce during backward",
             Family.DDP, _replicated, recommended=True),
    Strategy("zero2", "ZeRO-2", "DeepSpeed ZeRO-2: optimizer states and gradients partitioned",
             memory=_zero2, zero_stage=2, recommended=True, **_DEEPSPEED),
    Strategy("zero3", "ZeRO-3", "DeepSpeed ZeRO-3: parameters partitioned too, gathered layer by layer",
             memory=_zero3, zero_stage=3, recommended=True, **_DEEPSPEED),
    Strategy("zero3_offload", "ZeRO-3 + CPU offload",
             "ZeRO-3 with optimizer states and parameters in host memory",
             memory=_zero3, zero_stage=3, offload=True, recommended=True, **_DEEPSPEED),
    Strategy("fsdp2", "FSDP2", "torch fully_shard per block: parameters, gradients, optimizer states sharded",
             Family.FSDP2, _fully_sharded),
    Strategy("dp", "DataParallel",
             "nn.DataParallel: one process drives a node's GPUs; one node; GIL-bound, slower than DDP",
             Family.DATA_PARALLEL, _replicated, single_node=True, one_process_per_node=True),
)}
STRATEGIES: tuple[str, ...] = tuple(REGISTRY)
# What `launch bench` compares when not told (the first is the baseline of its ratios).
BENCH_DEFAULT: tuple[str, ...] = ("ddp", "ddp_compile", "zero2", "zero3")


def names(where: Callable[[Strategy], bool] = lambda s: True) -> list[str]:
    """The names of the strategies ``where`` accepts, in registry order."""
    return [s.name for s in REGISTRY.values() if where(s)]


def find_strategy(name: str) -> Strategy | None:
    """The strategy called ``name``, or None."""
    return REGISTRY.get(name)


def get_strategy(name: str) -> Strategy:
    """The strategy called ``name``; ValueError listing the valid names when there is none."""
    strategy = REGISTRY.get(name)
    if strategy is None:
        raise ValueError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
    return strategy


def check_precision(precision: str) -> str:
    """``precision`` when known; ValueError listing the valid ones otherwise."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return precision
