"""A job to watch: each rank reports a step (8 samples) and prints a line every 0.2 s until the file ``TEST_RELEASE``
exists (then every rank but the last waits in a barrier the last never joins, as it sleeps: a hang), or until the
file ``TEST_STOP`` exists or ``TEST_STEPS`` steps are done (then it ends)."""

import os
import time
from pathlib import Path

import torch.distributed as dist

from launcher.metrics import Reporter

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
reporter = Reporter(every=1)
release = Path(os.environ.get("TEST_RELEASE", "/nonexistent"))
stop = Path(os.environ.get("TEST_STOP", "/nonexistent"))
steps = int(os.environ.get("TEST_STEPS", "3000"))
step = 0
while not release.exists() and not stop.exists() and step < steps:
    step += 1
    time.sleep(0.2)
    reporter.step(samples=8, loss=1.0 / step)
    print(f"rank {rank} step {step}", flush=True)
if release.exists():
    print(f"rank {rank} hangs after step {step}", flush=True)
    if rank == world - 1:
        time.sleep(3600)
dist.barrier()
dist.destroy_process_group()
