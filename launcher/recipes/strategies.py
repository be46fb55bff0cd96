"""Wrap a recipe's model and optimizer for a strategy and run one optimizer step.

Which trainer runs a strategy is its ``Family`` in ``launcher.catalog.strategies``; ``TRAINERS``
maps each family to its class here.

``TorchTrainer`` (DDP, FSDP2): micro-batches accumulate with gradient sync suppressed on
all but the last (DDP ``no_sync``, FSDP2 ``set_requires_gradient_sync``), the loss is
divided by the accumulation count, fp16/bf16 use autocast (FSDP2: its
``MixedPrecisionPolicy``) and fp16 a GradScaler, and gradients are clipped by global norm
before the optimizer step. A compiling strategy compiles the wrapped model
(``torch.compile(DDP(model))``), the order PyTorch documents: dynamo's DDPOptimizer splits
the graph at bucket boundaries so gradient all-reduce still overlaps the backward pass.

``DataParallelTrainer``: the same loop around ``torch.nn.DataParallel``, one process driving
every GPU of its node (on CPU the module runs on the CPU). Autocast is entered inside each
replica, whose thread does not inherit the caller's autocast dtype.

``DeepSpeedTrainer`` goes through ``deepspeed.initialize``; the engine accumulates, scales,
clips and steps.

Every strategy uses the same optimizer for a recipe (Adam for the CNNs, AdamW for the
language models; DeepSpeedCPUAdam with the same update when the optimizer is offloaded),
so their losses are comparable.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn

from launcher.catalog.recipes import LANGUAGE_MODELS
from launcher.catalog.strategies import CheckpointFormat, Family, Strategy, get_strategy

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
WEIGHT_DECAY = 0.01  # AdamW decay for the language models; the CNNs use plain Adam
# DeepSpeed calls collectives torch 2.13 renamed; the warning repeats every step and is not the user's to fix.
DEEPSPEED_DEPRECATION = r"`torch\.distributed\.\w+` is deprecated"


@dataclass(frozen=True)
class TrainOptions:
    """What the strategy layer needs from the command line."""

    recipe: str
    strategy: str
    precision: str
    lr: float
    grad_clip: float
    compile_mode: str | None = None
    model_size: str | None = None
    num_layers: int | None = None
    ds_config: dict | None = None


def device_for(local_rank: int) -> torch.device:
    """This rank's device: its GPU when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def build_trainer(opts: TrainOptions, recipe: ModuleType, device: torch.device, seed: int) -> Trainer:
    """Build the model (seeded identically on every rank), wrap it and its optimizer.

    Afterwards the torch RNG is reseeded per rank, so dropout masks differ between ranks.
    """
    trainer = TRAINERS[get_strategy(opts.strategy).family](opts, recipe, device, seed)
    torch.manual_seed(seed + 1 + dist.get_rank())
    return trainer


def _build_model(opts: TrainOptions, recipe: ModuleType, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    if opts.recipe in LANGUAGE_MODELS:
        return recipe.build_model(opts.model_size, opts.num_layers)
    return recipe.build_model()


def _optimizer_kwargs(opts: TrainOptions) -> dict[str, Any]:
    decay = WEIGHT_DECAY if opts.recipe in LANGUAGE_MODELS else 0.0
    return {"lr": opts.lr, "weight_decay": decay, "betas": (0.9, 0.999), "eps": 1e-8}


def _make_optimizer(opts: TrainOptions, params) -> torch.optim.Optimizer:
    kwargs = _optimizer_kwargs(opts)
    if opts.recipe in LANGUAGE_MODELS:
        return torch.optim.AdamW(params, **kwargs)
    return torch.optim.Adam(params, **kwargs)


class Trainer:
    """One optimizer step over a list of micro-batches; subclasses per strategy family."""

    device: torch.device
    strategy: Strategy

    def step(self, micro_batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """Run forward/backward on every micro-batch and one optimizer update.

        Returns the mean micro-batch loss as a detached tensor (no host sync).
        """
        raise NotImplementedError

    @property
    def checkpoint_format(self) -> CheckpointFormat:
        return self.strategy.checkpoint

    def close(self) -> None:
        """Release what the strategy holds beyond Python objects (before the process group goes)."""

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Move a batch to this rank's device without blocking."""
        return {key: value.to(self.device, non_blocking=True) for key, value in batch.items()}


class TorchTrainer(Trainer):
    """DDP or FSDP2 (compiled when the strategy compiles), with autocast/GradScaler and accumulation."""

    def __init__(self, opts: TrainOptions, recipe: ModuleType, device: torch.device, seed: int) -> None:
        self.opts = opts
        self.strategy = get_strategy(opts.strategy)
        self.device = device
        self._compute_loss = recipe.compute_loss
        self.module = _build_model(opts, recipe, seed).to(device)
        self._ddp: nn.parallel.DistributedDataParallel | None = None
        self._fsdp = self.strategy.family is Family.FSDP2
        dtype = DTYPES[opts.precision]
        self._autocast_dtype = None if self._fsdp or dtype == torch.float32 else dtype
        self.model: nn.Module = self._wrap(recipe, dtype)
        if self.strategy.compiles:
            # A module compiles to an OptimizedModule (an nn.Module); torch's stub says only Callable.
            self.model = cast(nn.Module, torch.compile(self.model, mode=opts.compile_mode))
        self.optimizer = _make_optimizer(opts, self.model.parameters())
        self.scaler = torch.amp.GradScaler(device.type) if opts.precision == "fp16" else None

    def _wrap(self, recipe: ModuleType, dtype: torch.dtype) -> nn.Module:
        if self._fsdp:
            return self._fully_shard(recipe, dtype)
        ids = [self.device.index] if self.device.type == "cuda" else None
        self._ddp = nn.parallel.DistributedDataParallel(self.module, device_ids=ids)
        return self._ddp

    def _fully_shard(self, recipe: ModuleType, dtype: torch.dtype) -> nn.Module:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for unit in recipe.shard_units(self.module):
            fully_shard(unit, mp_policy=policy)
        # fully_shard returns self.module itself, its class swapped for one that is also an FSDPModule.
        return cast(nn.Module, fully_shard(self.module, mp_policy=policy))

    def _sync_context(self, last: bool):
        if self._fsdp:
            cast("FSDPModule", self.module).set_requires_gradient_sync(last)  # sharded in place by _fully_shard
            return contextlib.nullcontext()
        assert self._ddp is not None  # set by _wrap when not FSDP2 (DataParallelTrainer overrides this method)
        return contextlib.nullcontext() if last else self._ddp.no_sync()

    def _autocast(self):
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self._autocast_dtype)

    def step(self, micro_batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        count = len(micro_batches)
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for index, batch in enumerate(micro_batches):
            with self._sync_context(last=index == count - 1):
                with self._autocast():
                    loss = self._compute_loss(self.model, self.to_device(batch))
                scaled = loss / count
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            total += loss.detach().float()
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.opts.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.opts.grad_clip)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        return total / count


class _AutocastForward(nn.Module):
    """Runs the wrapped module's forward under autocast in whichever thread calls it.

    DataParallel runs each replica in a thread of its own and only passes on whether
    autocast is on, not its dtype (bf16 would become fp16 there).
    """

    def __init__(self, module: nn.Module, device_type: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.module = module
        self.device_type = device_type
        self.dtype = dtype

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.module(*args, **kwargs)


class DataParallelTrainer(TorchTrainer):
    """``torch.nn.DataParallel`` over every GPU of the node: each micro batch is split between them.

    Gradients reach the module on GPU 0 through DataParallel's own backward, so there is
    no sync to suppress while accumulating. A model returning its own loss (the language
    models) yields one loss per replica; their mean is the micro batch's loss.
    """

    def __init__(self, opts: TrainOptions, recipe: ModuleType, device: torch.device, seed: int) -> None:
        super().__init__(opts, recipe, device, seed)
        self._compute_loss = lambda model, batch: recipe.compute_loss(model, batch).mean()

    def _wrap(self, recipe: ModuleType, dtype: torch.dtype) -> nn.Module:
        inner = self.module
        if self._autocast_dtype is not None:
            inner = _AutocastForward(self.module, self.device.type, self._autocast_dtype)
        gpus = list(range(torch.cuda.device_count())) if self.device.type == "cuda" else None
        return nn.DataParallel(inner, device_ids=gpus)

    def _sync_context(self, last: bool):
        return contextlib.nullcontext()


class DeepSpeedTrainer(Trainer):
    """A DeepSpeed ZeRO engine: it accumulates over micro-batches and steps at the boundary."""

    def __init__(self, opts: TrainOptions, recipe: ModuleType, device: torch.device, seed: int) -> None:
        import deepspeed

        self.opts = opts
        self.strategy = get_strategy(opts.strategy)
        self.device = device
        self._compute_loss = recipe.compute_loss
        config = opts.ds_config
        assert config is not None, "a DeepSpeed strategy needs ds_config (train.check_args always builds one)"
        self._zero_init_config = None
        if config["zero_optimization"]["stage"] == 3 and opts.recipe in LANGUAGE_MODELS:
            from transformers.integrations import HfDeepSpeedConfig

            # Must stay alive: transformers reads it (by weakref) while building the model.
            self._zero_init_config = HfDeepSpeedConfig(config)
        module = _build_model(opts, recipe, seed)
        optimizer = None if "optimizer" in config else self._client_optimizer(module, config)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=module, optimizer=optimizer, model_parameters=module.parameters(), config=config,
        )
        self.model = self.engine
        self._input_dtype = DTYPES[opts.precision]

    def _client_optimizer(self, module: nn.Module, config: dict) -> torch.optim.Optimizer:
        offload = config["zero_optimization"].get("offload_optimizer", {}).get("device", "none")
        if offload == "none":
            return _make_optimizer(self.opts, module.parameters())
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(
            module.parameters(), adamw_mode=self.opts.recipe in LANGUAGE_MODELS, **_optimizer_kwargs(self.opts),
        )

    def to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Move a batch to the device, casting float inputs to the engine's dtype."""
        return {
            key: value.to(self.device, dtype=self._input_dtype if value.is_floating_point() else None,
                          non_blocking=True)
            for key, value in batch.items()
        }

    def close(self) -> None:
        """Remove ZeRO's hooks and free its optimizer state (DeepSpeed's ``engine.destroy``)."""
        self.engine.destroy()

    def step(self, micro_batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        total = torch.zeros((), device=self.device)
        for batch in micro_batches:
            loss = self._compute_loss(self.engine, self.to_device(batch))
            self.engine.backward(loss)
            self.engine.step()
            total += loss.detach().float()
        return total / len(micro_batches)


def init_distributed(strategy: Strategy) -> None:
    """Join the job's process group: nccl on GPUs, gloo on CPUs (DeepSpeed's own init for ZeRO).

    DataParallel moves tensors between its node's GPUs itself; its one process still joins a
    one-member gloo group (from torchrun's environment, no traffic), so the training loop's
    rank, barrier and checkpoint code is the same for every strategy.
    """
    cuda = torch.cuda.is_available()
    if cuda:
        torch.set_float32_matmul_precision("high")
    if strategy.uses_deepspeed:
        import deepspeed

        warnings.filterwarnings("ignore", message=DEEPSPEED_DEPRECATION, category=FutureWarning)
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    elif not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda and strategy.family is not Family.DATA_PARALLEL else "gloo")


# Each family's trainer class, called with the constructor arguments every subclass takes.
TRAINERS: dict[Family, Callable[[TrainOptions, ModuleType, torch.device, int], Trainer]] = {
    Family.DDP: TorchTrainer,
    Family.FSDP2: TorchTrainer,
    Family.DEEPSPEED: DeepSpeedTrainer,
    Family.DATA_PARALLEL: DataParallelTrainer,
}
