"""Where a recipe's step goes on one GPU: the data, the step itself, and the profiler's top operators.

Runs the recipes' own code in this process (one rank, no torchrun), as launch's rank would, for the cases
scripts/gpu_check.sh benchmarks, and prints for each: the data source alone (ms a step, on the CPU); the
training loop with the data made inline, on batches made beforehand, and made ahead in a thread (as train.py
does on a GPU); and the torch profiler's top operators by device time and by CPU time over a few steps.

    python scripts/gpu_profile.py [--steps 30] [--cases convnet-ddp,bert-ddp] [--hooks]
"""

from __future__ import annotations

import argparse
import importlib
import os
import time

CASES = {
    "convnet-ddp": "--recipe convnet --strategy ddp --precision fp32 --micro-batch 256",
    "convnet-ddp_compile": "--recipe convnet --strategy ddp_compile --precision fp32 --micro-batch 256",
    "bert-ddp": "--recipe bert --model-size large --strategy ddp --precision bf16 --micro-batch 64 --grad-accum 2",
    "bert-zero3": "--recipe bert --model-size large --strategy zero3 --precision bf16 --micro-batch 64 --grad-accum 2",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--hooks", action="store_true", help="with launch's step hooks installed, as in a launched rank")
    opts = parser.parse_args()
    for name, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533"), ("RANK", "0"),
                        ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", "1")):
        os.environ.setdefault(name, value)
    import torch.distributed as dist

    from launcher.catalog.strategies import get_strategy
    from launcher.recipes.strategies import init_distributed

    init_distributed(get_strategy("ddp"))
    if opts.hooks:
        import io

        from launcher.node import stephooks

        stephooks.install(io.StringIO())
    for case in opts.cases.split(","):
        profile_case(case, CASES[case].split(), opts.steps)
    dist.destroy_process_group()


def profile_case(case: str, argv: list[str], steps: int) -> None:
    import torch

    from launcher.recipes import train
    from launcher.recipes.data import DataSpec, prefetched, split_micro_batches, step_batches
    from launcher.recipes.strategies import TrainOptions, build_trainer, device_for

    args = train.build_parser().parse_args(argv)
    ds_config = train.check_args(args, 1, 1, torch.cuda.is_available())
    info = train.recipe_info(args.recipe, args.model_size, args.seq_len, args.num_layers)
    opts = TrainOptions(recipe=args.recipe, strategy=args.strategy, precision=args.precision,
                        lr=train.DEFAULT_LR[args.recipe], grad_clip=args.grad_clip, model_size=args.model_size,
                        ds_config=ds_config)
    recipe = importlib.import_module(f"launcher.recipes.{train.RECIPE_MODULES[args.recipe]}")
    trainer = build_trainer(opts, recipe, device_for(0), args.seed)
    spec = DataSpec(recipe=args.recipe, rank=0, world_size=1, seed=0, samples_per_step=args.micro_batch * args.grad_accum,
                    seq_len=args.seq_len or train.DEFAULT_SEQ_LEN.get(args.recipe, 0), data_path=None,
                    micro_batch=args.micro_batch)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def run(batches) -> float:
        sync()
        start = time.perf_counter()
        for batch in batches:
            trainer.step(split_micro_batches(batch, args.grad_accum))
        sync()
        return (time.perf_counter() - start) / steps * 1e3

    run(step_batches(spec, 0, 10))  # warm-up (and compilation)
    start = time.perf_counter()
    made = list(step_batches(spec, 0, steps))
    data_ms = (time.perf_counter() - start) / steps * 1e3
    inline_ms = run(step_batches(spec, 0, steps))
    made_ms = run(made)
    ahead_ms = run(prefetched(step_batches(spec, 0, steps), pin=torch.cuda.is_available()))
    flops = info.flops_per_sample * spec.samples_per_step
    print(f"== {case}: data {data_ms:.1f} ms/step; loop with data inline {inline_ms:.1f} ms/step "
          f"({flops / inline_ms / 1e9:.0f} TFLOP/s); on batches made beforehand {made_ms:.1f} ms/step "
          f"({flops / made_ms / 1e9:.0f} TFLOP/s); made ahead (train.py on a GPU) {ahead_ms:.1f} ms/step "
          f"({flops / ahead_ms / 1e9:.0f} TFLOP/s)", flush=True)
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        run(made[:5])
    table = prof.key_averages()
    for key in (("self_device_time_total", "cpu_time_total") if torch.cuda.is_available() else ("cpu_time_total",)):
        print(table.table(sort_by=key, row_limit=14, max_name_column_width=60), flush=True)
    trainer.close()


if __name__ == "__main__":
    main()
