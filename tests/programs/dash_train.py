"""A job to watch on the dashboard: each rank reports a step (8 samples) and prints a line every 0.2 s until the file
``TEST_RELEASE`` exists; then every rank but the last waits in a barrier the last never joins (it sleeps): a hang."""

import os
import time
from pathlib import Path

import torch.distributed as dist

from launcher.metrics import Reporter

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
reporter = Reporter(every=1)
release = Path(os.environ["TEST_RELEASE"])
step = 0
while not release.exists() and step < 3000:
    step += 1
    time.sleep(0.2)
    reporter.step(samples=8, loss=1.0 / step)
    print(f"rank {rank} step {step}", flush=True)
print(f"rank {rank} hangs after step {step}", flush=True)
if rank == world - 1:
    time.sleep(3600)
dist.barrier()
