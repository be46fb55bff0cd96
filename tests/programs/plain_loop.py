"""A plain PyTorch training loop, knowing nothing of `launch`: a DataLoader, an optimizer, its own prints.

``--ddp``: DDP over gloo with a DistributedSampler (pytorch/examples style); ``--accum N``: N micro-batches
a step (gradient accumulation: N backward calls, one optimizer step); ``--fail-at S``: raise at step S the first
time (``--out`` keeps a mark, so a restart runs to the end); ``--hang-at-exit R``: rank R starts an upload thread
(not a daemon) that waits for a sentinel the program never sends, as a forgotten worker thread does: its training
ends, its main returns, and Python waits for that thread for ever.
It writes its optimizer steps to ``--out/rank<R>.json``.
"""

import argparse
import gc
import json
import os
import queue
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def upload(uploads):
    """Upload what is queued until the sentinel None comes (the program forgets to send it)."""
    while uploads.get() is not None:
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--ddp", action="store_true")
    parser.add_argument("--fail-at", type=int, default=0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--hang-at-exit", type=int, default=-1)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", 0))
    uploads: queue.Queue = queue.Queue()
    if rank == args.hang_at_exit:
        threading.Thread(target=upload, args=(uploads,), name="uploader").start()
    torch.manual_seed(rank)
    data = TensorDataset(torch.randn(4096, 32), torch.randint(0, 4, (4096,)))
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    sampler = None
    if args.ddp:
        dist.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(model)
        sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    steps = 0
    for index, (x, y) in enumerate(loader):
        loss = criterion(model(x), y)
        if args.accum > 1:
            loss = loss / args.accum
        loss.backward()
        if (index + 1) % args.accum:
            continue
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
        if rank == 0:
            print(f"step {steps}/{args.steps} loss {loss.item():.4f}", flush=True)
        mark = os.path.join(args.out or ".", f"failed{rank}")
        if steps == args.fail_at and not os.path.exists(mark):
            open(mark, "w").close()
            raise RuntimeError(f"the program's own error at step {steps}")
        if steps == args.steps:
            break
    if args.out:
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as handle:
            json.dump({"steps": steps}, handle)
    uploads.put("rank-state")
    if args.ddp:  # as PyTorch asks: the model freed, then the group (left to exit, gloo aborts a rank now and then)
        dist.barrier()
        del model, optimizer
        gc.collect()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
