"""Save and resume training state, step included.

Layout in ``--checkpoint-dir``: one folder per saved step (``step_00000500``)
and a ``latest`` file naming the newest complete one (written last, by rank 0,
atomically), the convention DeepSpeed uses for its own checkpoints.

The format is the strategy's (``launcher.catalog.strategies``): DeepSpeed's
``save_checkpoint``/``load_checkpoint`` (the step travels in ``client_state``),
or ``torch.distributed.checkpoint`` with ``get_state_dict``/``set_state_dict`` of
the bare module, so every rank writes its own shard, FSDP2 never gathers a full
model, and DDP, DataParallel and FSDP2 checkpoints resume under one another.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from launcher.catalog.strategies import CheckpointFormat, names
from launcher.recipes.strategies import DeepSpeedTrainer, TorchTrainer, Trainer

LATEST = "latest"
DEEPSPEED_MARKER = "*model_states.pt"
DCP_MARKER = ".metadata"


class CheckpointError(RuntimeError):
    """A checkpoint that exists but cannot be resumed from (the message says why)."""


def tag_for(step: int) -> str:
    """The folder name of the checkpoint taken after ``step`` optimizer steps."""
    return f"step_{step:08d}"


def latest_tag(directory: str | os.PathLike) -> str | None:
    """The newest complete checkpoint's tag in ``directory``, or None when there is none."""
    marker = Path(directory) / LATEST
    if not marker.is_file():
        return None
    tag = marker.read_text().strip()
    return tag or None


def save(trainer: Trainer, directory: str | os.PathLike, step: int) -> None:
    """Save model, optimizer (and loss scaler) state with ``step``; every rank calls this."""
    directory = Path(directory)
    tag = tag_for(step)
    if trainer.checkpoint_format is CheckpointFormat.DEEPSPEED:
        assert isinstance(trainer, DeepSpeedTrainer)  # the catalog gives this format to DeepSpeed strategies only
        trainer.engine.save_checkpoint(str(directory), tag=tag, client_state={"step": step})
        return
    assert isinstance(trainer, TorchTrainer)  # every other strategy is DDP, FSDP2 or DataParallel
    model_state, optim_state = get_state_dict(trainer.module, trainer.optimizer)
    state = {"model": model_state, "optim": optim_state, "meta": _meta(trainer, step)}
    dcp.save(state, checkpoint_id=str(directory / tag))
    dist.barrier()
    if dist.get_rank() == 0:
        _write_latest(directory, tag)
    dist.barrier()


def load_latest(trainer: Trainer, directory: str | os.PathLike) -> int | None:
    """Restore the newest checkpoint in ``directory``; returns its step, or None if there is none."""
    directory = Path(directory)
    tag = latest_tag(directory)
    if tag is None:
        return None
    path = directory / tag
    is_deepspeed = any(path.glob(DEEPSPEED_MARKER))
    if trainer.checkpoint_format is CheckpointFormat.DEEPSPEED:
        if not is_deepspeed:
            raise CheckpointError(f"{path}: not a DeepSpeed checkpoint; resume it with {_able(CheckpointFormat.DCP)} "
                                  "or use a new dir")
        assert isinstance(trainer, DeepSpeedTrainer)  # the catalog gives this format to DeepSpeed strategies only
        loaded, client_state = trainer.engine.load_checkpoint(str(directory), tag=tag)
        if loaded is None or "step" not in (client_state or {}):
            raise CheckpointError(f"{path}: DeepSpeed could not load this checkpoint")
        return int(client_state["step"])
    if is_deepspeed or not (path / DCP_MARKER).exists():
        raise CheckpointError(f"{path}: not a torch.distributed.checkpoint folder; resume it with "
                              f"{_able(CheckpointFormat.DEEPSPEED)}")
    assert isinstance(trainer, TorchTrainer)  # every other strategy is DDP, FSDP2 or DataParallel
    model_state, optim_state = get_state_dict(trainer.module, trainer.optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state, "meta": _meta(trainer, 0)}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(trainer.module, trainer.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    meta = state["meta"]
    if trainer.scaler is not None and meta.get("scaler"):
        trainer.scaler.load_state_dict(meta["scaler"])
    return int(meta["step"])


def _able(checkpoint: CheckpointFormat) -> str:
    """The strategies that read ``checkpoint``, for a message."""
    return "/".join(names(lambda s: s.checkpoint is checkpoint))


def _meta(trainer: TorchTrainer, step: int) -> dict:
    scaler = trainer.scaler
    return {"step": step, "scaler": scaler.state_dict() if scaler is not None else {}}


def _write_latest(directory: Path, tag: str) -> None:
    temporary = directory / f".{LATEST}.tmp"
    temporary.write_text(tag + "\n")
    os.replace(temporary, directory / LATEST)
