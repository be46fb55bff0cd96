"""A DeepSpeed training script in the DeepSpeedExamples style, knowing nothing of `launch`.

``--local_rank`` parsed with default -1 (the ``deepspeed`` command passes it), DeepSpeed's own
config arguments (``--deepspeed --deepspeed_config FILE``), ``deepspeed.init_distributed()``,
``deepspeed.initialize(args=...)``, and DeepSpeed's own checkpoint. It writes what it saw to
``--out/rank<R>.json``: the ``--local_rank`` it got, the config DeepSpeed read, and
``LAUNCH_DS_CONFIG``'s file when launch gives one. It ends as PyTorch asks: the engine freed, then
``destroy_process_group()``. Left to interpreter exit, gloo's threads abort a rank now and then
(about 1 two-node run in 4 here, torch 2.13: "terminate called without an active exception"), which
launch then names as the failure's reason.
"""

import argparse
import gc
import json
import os
import socket

import deepspeed
import torch
import torch.nn as nn
from tqdm import tqdm


def parse():
    parser = argparse.ArgumentParser(description="DeepSpeed toy example")
    parser.add_argument("--local_rank", type=int, default=-1, help="local rank passed from distributed launcher")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", default=None)
    parser.add_argument("--save-dir", default=None)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()


def main():
    args = parse()
    given_local_rank = args.local_rank  # deepspeed.initialize overwrites args.local_rank from the environment
    deepspeed.init_distributed(dist_backend="gloo")
    if args.deepspeed_config is None and os.environ.get("LAUNCH_DS_CONFIG"):
        args.deepspeed_config = os.environ["LAUNCH_DS_CONFIG"]
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    with open(args.deepspeed_config) as handle:
        has_optimizer = "optimizer" in json.load(handle)
    optimizer = None if has_optimizer else torch.optim.SGD(net.parameters(), lr=0.01)
    engine, _, _, _ = deepspeed.initialize(args=args, model=net, model_parameters=net.parameters(), optimizer=optimizer)
    steps = range(args.steps)
    if engine.global_rank == 0:  # a progress bar, as DeepSpeedExamples' scripts show one
        steps = tqdm(steps, desc="train", mininterval=0, ascii=True, bar_format="{desc}: {n_fmt}/{total_fmt}")
    for step in steps:
        x = torch.randn(engine.train_micro_batch_size_per_gpu(), 16)
        loss = ((engine(x) - 1.0) ** 2).mean()
        engine.backward(loss)
        engine.step()
        if engine.global_rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    if args.save_dir:
        engine.save_checkpoint(args.save_dir, tag="final")
    if args.out:
        given = os.environ.get("LAUNCH_DS_CONFIG")
        seen = {"rank": engine.global_rank, "local_rank_arg": given_local_rank, "LOCAL_RANK": os.environ.get("LOCAL_RANK"),
                "host": socket.gethostname(), "train_batch_size": engine.train_batch_size(),
                "micro_batch": engine.train_micro_batch_size_per_gpu(),
                "launch_ds_config": json.load(open(given)) if given else None}
        with open(os.path.join(args.out, f"rank{engine.global_rank}.json"), "w") as handle:
            json.dump(seen, handle)
    engine.destroy()
    torch.distributed.barrier()
    del engine
    gc.collect()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
