"""Rank entry point: ``python -m launcher.recipes.train --recipe ... --strategy ...``.

Started once per rank by torchrun or the deepspeed launcher (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT come from them). Builds
the recipe's model for the strategy, resumes from ``--checkpoint-dir`` when a
checkpoint is there, trains to ``--max-steps`` optimizer steps and reports
metrics through ``launcher.metrics.reporter.Reporter``. Bad arguments end the
process with one ``train: error: ...`` line and exit status 2.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
import time
from typing import NoReturn

from launcher.catalog.recipes import DEFAULT_SEQ_LEN, LANGUAGE_MODELS, RECIPES, recipe_info
from launcher.catalog.strategies import (
    DEFAULT_STRATEGY,
    PRECISIONS,
    STRATEGIES,
    get_strategy,
    names,
)

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
RECIPE_MODULES = {"convnet": "convnet", "resnet50": "resnet", "bert": "bert", "gpt2": "gpt2"}
DEFAULT_LR = {"convnet": 1e-3, "resnet50": 1e-3, "bert": 1e-4, "gpt2": 3e-4}
EXIT_USAGE = 2


class UsageError(Exception):
    """A bad argument combination; reported as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage block
        sys.stderr.write(f"train: error: {message}\n")
        sys.exit(EXIT_USAGE)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The rank's command line (the flags the launcher's planner emits)."""
    p = _Parser(prog="train", description=__doc__.splitlines()[0])
    p.add_argument("--recipe", required=True, choices=RECIPES)
    p.add_argument("--strategy", default=DEFAULT_STRATEGY, choices=STRATEGIES)
    p.add_argument("--precision", default="fp32", choices=PRECISIONS)
    p.add_argument("--micro-batch", type=_positive, default=32)
    p.add_argument("--grad-accum", type=_positive, default=1)
    p.add_argument("--max-steps", type=_non_negative, default=100)
    p.add_argument("--model-size", default=None)
    p.add_argument("--seq-len", type=_positive, default=None)
    p.add_argument("--num-layers", type=_positive, default=None)
    p.add_argument("--data-path", default=None)
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-every", type=_non_negative, default=0, help="0: only at the end")
    p.add_argument("--resume", action="store_true",
                   help="continue another job's run from its newest checkpoint in --checkpoint-dir (default: refused)")
    p.add_argument("--compile-mode", default=None, choices=COMPILE_MODES)
    p.add_argument("--ds-config-json", default=None, help="the full DeepSpeed config (DeepSpeed strategies)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=None, help="default: per recipe")
    p.add_argument("--grad-clip", type=float, default=1.0,
                   help="max global grad norm for the torch strategies (0: off); "
                        "DeepSpeed takes gradient_clipping from its config")
    p.add_argument("--metrics-every", type=_positive, default=10)
    # The deepspeed launcher appends --local_rank=N unless told --no_local_rank; LOCAL_RANK is read instead.
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    return p


def check_args(args: argparse.Namespace, world_size: int, local_world_size: int, cuda: bool) -> dict | None:
    """Reject contradictory arguments; return the DeepSpeed config for DeepSpeed strategies."""
    strategy = get_strategy(args.strategy)
    problems = strategy.resource_problems(world_size // local_world_size, local_world_size)
    problems += strategy.device_problems(args.precision, cuda)
    if problems:
        raise UsageError(problems[0])
    if args.recipe not in LANGUAGE_MODELS:
        for flag, value in (("--model-size", args.model_size), ("--seq-len", args.seq_len),
                            ("--num-layers", args.num_layers)):
            if value is not None:
                raise UsageError(f"{flag} does not apply to recipe {args.recipe}")
    try:
        recipe_info(args.recipe, args.model_size, args.seq_len, args.num_layers)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.compile_mode is not None and not strategy.compiles:
        raise UsageError(f"--compile-mode applies to {', '.join(names(lambda s: s.compiles))}, not {args.strategy}")
    if args.checkpoint_every and not args.checkpoint_dir:
        raise UsageError("--checkpoint-every needs --checkpoint-dir")
    if args.data_path is not None and not os.path.exists(args.data_path):
        raise UsageError(f"--data-path {args.data_path}: no such file or directory")
    if args.grad_clip < 0:
        raise UsageError(f"--grad-clip must be >= 0, got {args.grad_clip}")
    if not strategy.uses_deepspeed:
        if args.ds_config_json is not None:
            raise UsageError(f"--ds-config-json applies to {', '.join(names(lambda s: s.uses_deepspeed))}, "
                             f"not {args.strategy}")
        return None
    return _ds_config(args, world_size)


def _ds_config(args: argparse.Namespace, world_size: int) -> dict:
    from launcher.plan.dsconfig import DSConfigError, make_ds_config

    user = None
    if args.ds_config_json is not None:
        try:
            user = json.loads(args.ds_config_json)
        except ValueError as exc:
            raise UsageError(f"--ds-config-json is not valid JSON: {exc}") from None
        if not isinstance(user, dict):
            raise UsageError("--ds-config-json must be a JSON object")
    try:
        return make_ds_config(args.strategy, args.precision, args.micro_batch, args.grad_accum, world_size,
                              user_config=user)
    except DSConfigError as exc:
        raise UsageError(str(exc)) from None


def main(argv: list[str] | None = None) -> int:
    """Parse, check, then train; returns the process exit status."""
    args = build_parser().parse_args(argv)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    try:
        import torch

        ds_config = check_args(args, world_size, local_world_size, torch.cuda.is_available())
    except UsageError as exc:
        sys.stderr.write(f"train: error: {exc}\n")
        return EXIT_USAGE
    from launcher.recipes.checkpoint import CheckpointError
    from launcher.recipes.data import DataError

    try:
        return train(args, ds_config)
    except (DataError, CheckpointError) as exc:
        sys.stderr.write(f"train: error: {exc}\n")
        return 1


def train(args: argparse.Namespace, ds_config: dict | None) -> int:
    """Run the training loop on this rank."""
    import torch.distributed as dist

    from launcher.metrics.reporter import Reporter
    from launcher.recipes import checkpoint
    from launcher.recipes.data import DataSpec, prefetched, split_micro_batches, step_batches
    from launcher.recipes.strategies import (
        TrainOptions,
        build_trainer,
        device_for,
        init_distributed,
    )

    init_distributed(get_strategy(args.strategy))
    rank, world = dist.get_rank(), dist.get_world_size()
    info = recipe_info(args.recipe, args.model_size, args.seq_len, args.num_layers)
    opts = TrainOptions(
        recipe=args.recipe, strategy=args.strategy, precision=args.precision,
        lr=args.lr if args.lr is not None else DEFAULT_LR[args.recipe],
        grad_clip=args.grad_clip, compile_mode=args.compile_mode,
        model_size=args.model_size, num_layers=args.num_layers, ds_config=ds_config,
    )
    recipe = importlib.import_module(f"launcher.recipes.{RECIPE_MODULES[args.recipe]}")
    trainer = build_trainer(opts, recipe, device_for(int(os.environ.get("LOCAL_RANK", "0"))), args.seed)
    reporter = Reporter(every=args.metrics_every, flops_per_sample=info.flops_per_sample)
    samples = args.micro_batch * args.grad_accum
    spec = DataSpec(
        recipe=args.recipe, rank=rank, world_size=world, seed=args.seed, samples_per_step=samples,
        seq_len=args.seq_len or DEFAULT_SEQ_LEN.get(args.recipe, 0), data_path=args.data_path,
        micro_batch=args.micro_batch,
    )
    start = _resume(trainer, args, spec.global_batch, rank) if args.checkpoint_dir else 0
    reporter.resume_at(start)
    reporter.extra.update(grad_accum=args.grad_accum)
    loss, saved = None, start
    batches = step_batches(spec, start, args.max_steps)
    if trainer.device.type == "cuda":  # made ahead while the GPU computes; a CPU rank's cores are busy computing
        batches = prefetched(batches, pin=True)
    for step, batch in enumerate(batches, start=start + 1):
        loss = trainer.step(split_micro_batches(batch, args.grad_accum))
        reporter.extra["samples_consumed"] = step * spec.global_batch  # the data position: global samples
        reporter.step(samples=samples, tokens=samples * info.tokens_per_sample, loss=loss)
        if rank == 0 and reporter.steps_done % reporter.every == 0:
            _say(f"step {step} loss {loss.item():.4f}")
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            checkpoint.save(trainer, args.checkpoint_dir, checkpoint.Position(step, step * spec.global_batch))
            saved = step
    if args.checkpoint_dir and reporter.steps_done > saved:  # the final state, so a restart has nothing to redo
        done = reporter.steps_done
        checkpoint.save(trainer, args.checkpoint_dir, checkpoint.Position(done, done * spec.global_batch))
    reporter.close(loss)
    trainer.close()
    dist.barrier()
    # Free the model while the process group lives. DDP's reducer holds the group and, freed last,
    # destroys it holding the GIL while joining gloo's worker threads; a worker still freeing the
    # barrier's work needs the GIL, so the rank hung at exit (1 run in ~50 under load, torch 2.13).
    # Freed here, the reducer drops one reference and destroy_process_group frees the group without the GIL.
    del trainer
    gc.collect()
    dist.destroy_process_group()
    return 0


def _resume(trainer, args: argparse.Namespace, global_batch: int, rank: int) -> int:
    """The step to go on from: the newest checkpoint's, at any world size, as long as the global batch is the
    one it was saved with (then samples consumed = step x global batch, and the data resumes where it was)."""
    from launcher.catalog import checkpoints
    from launcher.recipes import checkpoint

    began = time.monotonic()
    found = checkpoints.saved(args.checkpoint_dir)
    refused = checkpoints.refusal(args.checkpoint_dir, found, os.environ.get("LAUNCH_JOB_ID", "")) \
        if found is not None and os.environ.get("LAUNCH_JOB_ID") and not args.resume else None
    if refused:
        raise checkpoint.CheckpointError(refused)
    at = checkpoint.load_latest(trainer, args.checkpoint_dir)
    if at is None:
        return 0
    if at.samples is not None and at.samples != at.step * global_batch:
        raise checkpoint.CheckpointError(
            f"{args.checkpoint_dir}: saved after {at.samples} samples in {at.step} steps, which is not this run's "
            f"global batch {global_batch} a step; resume with the global batch it was saved with")
    if rank == 0:
        _say(f"resumed from step {at.step}")
        _say(f"  {at.step * global_batch} samples consumed; going on at world size "
             f"{int(os.environ.get('WORLD_SIZE', '1'))}, grad_accum {args.grad_accum} (loaded in "
             f"{time.monotonic() - began:.1f} s)")
    return at.step


def _say(line: str) -> None:
    """One human-readable line, written whole: ranks share the pipe, and unbuffered
    ``print`` writes the text and its newline separately, letting other ranks' lines in between."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
