"""A user's elastic program in its own convention (it never imports launch): argparse flags, its own JSON
checkpoint written by rank 0, its own data positions. It keeps its global batch across a change of world
size by reading launch's contract: LAUNCH_MICRO_BATCH and LAUNCH_GRAD_ACCUM (recomputed at each restart),
LAUNCH_GLOBAL_BATCH, LAUNCH_ATTEMPT and LAUNCH_PREVIOUS_WORLD_SIZE (docs/RELIABILITY.md)."""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt", required=True)
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--save-every", type=int, default=5)
parser.add_argument("--pace", type=float, default=0.1, help="seconds a step, as a real step would take")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
micro, accum = int(os.environ["LAUNCH_MICRO_BATCH"]), int(os.environ["LAUNCH_GRAD_ACCUM"])
global_batch = micro * accum * world
assert global_batch == int(os.environ["LAUNCH_GLOBAL_BATCH"]), (global_batch, os.environ["LAUNCH_GLOBAL_BATCH"])
state = {"step": 0, "samples": 0, "w": [0.0] * 4}
if os.path.exists(args.ckpt):
    with open(args.ckpt) as f:
        state = json.load(f)
if rank == 0:
    print(f"resumed at step {state['step']} after {state['samples']} samples; attempt {os.environ['LAUNCH_ATTEMPT']}, "
          f"previous world size {os.environ.get('LAUNCH_PREVIOUS_WORLD_SIZE', 'none')}", flush=True)
w, target = torch.tensor(state["w"]), torch.tensor([1.0, -2.0, 3.0, 0.5])
for step in range(state["step"] + 1, args.steps + 1):
    grad = torch.zeros(4)
    for j in range(accum):  # this rank's micro-batches: global sample positions, whatever the world size
        first = (step - 1) * global_batch + (rank * accum + j) * micro
        x = torch.stack([torch.randn(4, generator=torch.Generator().manual_seed(first + i)) for i in range(micro)])
        grad += ((x @ w - x @ target)[:, None] * x).sum(0)
    dist.all_reduce(grad)
    w -= 0.05 * grad / global_batch
    state = {"step": step, "samples": state["samples"] + global_batch, "w": w.tolist()}
    if rank == 0:
        print(f"step {step} world {world} grad_accum {accum} global {global_batch} samples {state['samples']}", flush=True)
        if step % args.save_every == 0:
            with open(args.ckpt + ".tmp", "w") as f:
                json.dump(state, f)
            os.replace(args.ckpt + ".tmp", args.ckpt)
    time.sleep(args.pace)
dist.barrier()
dist.destroy_process_group()
