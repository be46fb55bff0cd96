"""A small distributed program for the attach tests: every rank prints ``step K of rank R`` and reports
metrics for every step (``STEPS`` steps of ``STEP_S`` seconds, an all-reduce each)."""

import os
import sys
import time

import torch
import torch.distributed as dist

from launcher.metrics import Reporter


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    reporter = Reporter(every=1, flops_per_sample=1e6)
    for step in range(int(os.environ.get("STEPS", "40"))):
        time.sleep(float(os.environ.get("STEP_S", "0.1")))
        dist.all_reduce(torch.ones(4))
        print(f"step {step} of rank {rank}", flush=True)
        reporter.step(samples=8, tokens=128, loss=1.0 / (step + 1))
    reporter.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
