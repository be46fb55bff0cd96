"""A training script written the way pytorch/examples writes them, knowing nothing of `launch`.

Its own argparse (with the ``--local_rank`` flag old launchers pass), its own
``init_process_group`` from the torchrun environment, DDP, its own checkpoint file, its own
prints. It writes what it saw to ``--out/rank<R>.json`` so tests can check it.
"""

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse():
    parser = argparse.ArgumentParser(description="PyTorch toy DDP example")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--save-dir", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--hold-mb", type=int, default=0, help="keep this much memory allocated while training")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    return parser.parse_args()


def main():
    args = parse()
    dist.init_process_group(backend="gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    held = bytearray(args.hold_mb * 2**20)
    for i in range(0, len(held), 4096):
        held[i] = 1
    for epoch in range(args.epochs):
        x = torch.randn(args.batch_size, 32)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if rank == 0:
            print(f"Epoch {epoch}: loss {loss.item():.4f}", flush=True)
        time.sleep(0.2)
    if args.save_dir and rank == 0:
        os.makedirs(args.save_dir, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "epoch": args.epochs}, os.path.join(args.save_dir, "checkpoint.pth"))
    if args.out:
        seen = {"rank": rank, "world": world, "local_rank_arg": args.local_rank, "LOCAL_RANK": os.environ.get("LOCAL_RANK"),
                "host": socket.gethostname(), "launcher_imported": "launcher" in __import__("sys").modules,
                "batch_env": {k: os.environ.get(k) for k in ("LAUNCH_GLOBAL_BATCH", "LAUNCH_MICRO_BATCH", "LAUNCH_GRAD_ACCUM")}}
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as handle:
            json.dump(seen, handle)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
