"""A small distributed program for the attach tests: every rank prints ``step K of rank R`` and reports
metrics for every step (``STEPS`` steps of ``STEP_S`` seconds, an all-reduce each). With ``GATE_FILE``
and ``GATE_STEP``, the ranks wait before that step until the file exists (a test says when to end)."""

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
    gate, gate_step = os.environ.get("GATE_FILE"), int(os.environ.get("GATE_STEP", "-1"))
    for step in range(int(os.environ.get("STEPS", "40"))):
        while gate and step == gate_step and not os.path.exists(gate):
            time.sleep(0.05)
        time.sleep(float(os.environ.get("STEP_S", "0.1")))
        dist.all_reduce(torch.ones(4))
        print(f"step {step} of rank {rank}", flush=True)
        reporter.step(samples=8, tokens=128, loss=1.0 / (step + 1))
    reporter.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
