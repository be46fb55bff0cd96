"""Save and resume training state, step included.

Layout in ``--checkpoint-dir`` (``launcher.catalog.checkpoints``): one folder per saved step (``step_00000500``)
and a ``latest`` file naming the newest complete one (written last, by rank 0,
atomically), the convention DeepSpeed uses for its own checkpoints.

The format is the strategy's (``launcher.catalog.strategies``): DeepSpeed's
``save_checkpoint``/``load_checkpoint`` (the step travels in ``client_state``),
or ``torch.distributed.checkpoint`` with ``get_state_dict``/``set_state_dict`` of
the bare module, so every rank writes its own shard, FSDP2 never gathers a full
model, and DDP, DataParallel and FSDP2 checkpoints resume under one another and
at another world size (DCP reshards on load). With the step goes the data
position in global samples consumed (``Position``), which does not depend on
the world size. A DeepSpeed checkpoint saved at another data-parallel world size
(ZeRO-2, ZeRO-3, with or without offload) is converted once, by rank 0, with
DeepSpeed's ``ds_to_universal`` into ``<tag>_universal`` and loaded from there
(fp32 weights and Adam moments resliced for this world size).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from launcher.catalog.checkpoints import LATEST, latest_tag, tag_for, write_owner
from launcher.catalog.strategies import CheckpointFormat, names
from launcher.recipes.strategies import DeepSpeedTrainer, TorchTrainer, Trainer

LATEST_UNIVERSAL = "latest_universal"  # DeepSpeed's pointer to the newest universal checkpoint
DEEPSPEED_MARKER = "*model_states.pt"
DCP_MARKER = ".metadata"
ZERO_OPTIM_FILES = "*zero_pp_rank_*_mp_rank_00_optim_states.pt"  # one a data-parallel rank
UNIVERSAL_SUFFIX = "_universal"


class CheckpointError(RuntimeError):
    """A checkpoint that exists but cannot be resumed from (the message says why)."""


@dataclass(frozen=True)
class Position:
    """Where a checkpoint leaves training: optimizer steps done and global samples consumed (None: an older
    checkpoint that did not count them)."""

    step: int
    samples: int | None


def save(trainer: Trainer, directory: str | os.PathLike, at: Position) -> None:
    """Save model, optimizer (and loss scaler) state with the position; every rank calls this."""
    directory = Path(directory)
    tag = tag_for(at.step)
    if trainer.checkpoint_format is CheckpointFormat.DEEPSPEED:
        assert isinstance(trainer, DeepSpeedTrainer)  # the catalog gives this format to DeepSpeed strategies only
        trainer.engine.save_checkpoint(str(directory), tag=tag, client_state={"step": at.step, "samples": at.samples})
        _record_owner(directory, tag)
        return
    assert isinstance(trainer, TorchTrainer)  # every other strategy is DDP, FSDP2 or DataParallel
    model_state, optim_state = get_state_dict(trainer.module, trainer.optimizer)
    state = {"model": model_state, "optim": optim_state, "meta": _meta(trainer, at)}
    dcp.save(state, checkpoint_id=str(directory / tag))
    dist.barrier()
    if dist.get_rank() == 0:
        _write_latest(directory, tag)
    _record_owner(directory, tag)
    dist.barrier()


def _record_owner(directory: Path, tag: str) -> None:
    """Rank 0 records which job saved ``tag`` (``catalog.checkpoints``), once ``latest`` names it."""
    job = os.environ.get("LAUNCH_JOB_ID")
    if job and dist.get_rank() == 0:
        write_owner(directory, job, tag)


def load_latest(trainer: Trainer, directory: str | os.PathLike) -> Position | None:
    """Restore the newest checkpoint in ``directory``; returns its position, or None if there is none."""
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
        loaded, client_state = trainer.engine.load_checkpoint(str(directory), tag=_at_this_world_size(trainer, path))
        if loaded is None or "step" not in (client_state or {}):
            raise CheckpointError(f"{path}: DeepSpeed could not load this checkpoint")
        return _position(client_state)
    if is_deepspeed or not (path / DCP_MARKER).exists():
        raise CheckpointError(f"{path}: not a torch.distributed.checkpoint folder; resume it with "
                              f"{_able(CheckpointFormat.DEEPSPEED)}")
    assert isinstance(trainer, TorchTrainer)  # every other strategy is DDP, FSDP2 or DataParallel
    model_state, optim_state = get_state_dict(trainer.module, trainer.optimizer)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state, "meta": _meta(trainer, Position(0, 0))}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(trainer.module, trainer.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    meta = state["meta"]
    if trainer.scaler is not None and meta.get("scaler"):
        trainer.scaler.load_state_dict(meta["scaler"])
    return _position(meta)


def _position(saved: dict) -> Position:
    samples = saved.get("samples")
    return Position(int(saved["step"]), None if samples is None else int(samples))


def _at_this_world_size(trainer: DeepSpeedTrainer, path: Path) -> str:
    """The tag to load: the checkpoint's own when it was saved at this data-parallel world size, else its
    universal form (DeepSpeed's ds_to_universal, made once by rank 0), which loads at any world size."""
    saved = len(list(path.glob(ZERO_OPTIM_FILES)))
    if not saved or saved == dist.get_world_size():
        return path.name
    universal = path.with_name(path.name + UNIVERSAL_SUFFIX)
    if dist.get_rank() == 0 and not universal.is_dir():
        partial = path.with_name(f".{universal.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        done = subprocess.run(
            [sys.executable, "-P", "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(path),
             "--output_folder", str(partial), "--inject_missing_state"], capture_output=True, text=True)
        if done.returncode:
            raise CheckpointError(f"{path}: saved at a data-parallel world size of {saved}, and DeepSpeed's "
                                  f"ds_to_universal could not convert it for {dist.get_world_size()}: "
                                  f"{(done.stderr or done.stdout).strip()[-500:]}")
        os.replace(partial, universal)
        # ds_to_universal points latest_universal at the folder it wrote, the partial one renamed just now
        _write_latest(path.parent, universal.name, LATEST_UNIVERSAL)
    dist.barrier()
    trainer.engine._config.load_universal_checkpoint = True  # DeepSpeed reads this flag when it loads
    return universal.name


def _able(checkpoint: CheckpointFormat) -> str:
    """The strategies that read ``checkpoint``, for a message."""
    return "/".join(names(lambda s: s.checkpoint is checkpoint))


def _meta(trainer: TorchTrainer, at: Position) -> dict:
    scaler = trainer.scaler
    return {"step": at.step, "samples": at.samples, "scaler": scaler.state_dict() if scaler is not None else {}}


def _write_latest(directory: Path, tag: str, name: str = LATEST) -> None:
    temporary = directory / f".{name}.tmp"
    temporary.write_text(tag + "\n")
    os.replace(temporary, directory / name)
