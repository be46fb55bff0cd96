#!/usr/bin/env python
"""Steady step time with the metrics reporter on vs off (LAUNCH_METRICS=0), same job, same box.

The job is the CIFAR-10 ConvNet recipe (jobs/cifar10_convnet.yaml) when the
recipes exist, else a tiny DDP entrypoint that reports the same way. Rank 0
prints ``step N ...`` every 10 steps in both modes; the steady step time is
the time between the arrival of the first line after warm-up and the last
one, over the steps in between. On and off alternate for ``--repeats``
rounds; medians and best-of-rounds are compared. On a loaded box the
run-to-run noise is far above 1%, so the script also measures the CPU cost of
the metrics path in-process (reporter on a rank, parse + store insert in the
supervisor) and states it as a ratio of the step time. Goal
(docs/BENCHMARKS.md): on / off <= 1.01.
The figure is printed last.

    python scripts/bench_metrics_overhead.py [--steps 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STEP_LINE = re.compile(r"\] step (\d+)\b")
WARMUP_STEPS = 20

FALLBACK_PROGRAM = """
import sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from launcher.metrics import Reporter

dist.init_process_group("gloo")
steps = int(sys.argv[1])
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
reporter = Reporter(every=10, flops_per_sample=6 * (256 * 512 + 512 * 10))
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
for step in range(1, steps + 1):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    reporter.step(samples=64, loss=loss)
    if dist.get_rank() == 0 and step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
reporter.close(loss)
dist.destroy_process_group()
"""


def job_command(work: Path, steps: int, metrics_on: bool) -> tuple[list[str], str]:
    """The `launch submit` argv for one run, and a name for the job used."""
    launch = str(Path(sys.executable).with_name("launch"))
    sets = ["--set", f"max_steps={steps}", "--set", f"env.LAUNCH_METRICS='{int(metrics_on)}'",
            "--set", "resources.nproc_per_node=2"]
    if (REPO / "launcher/recipes/train.py").exists():
        return [launch, "submit", str(REPO / "jobs/cifar10_convnet.yaml"), "--set", "metrics.every=10", *sets], "convnet recipe"
    program = work / "mlp.py"
    program.write_text(FALLBACK_PROGRAM)
    job = {"name": "overhead", "entrypoint": [sys.executable, str(program), str(steps)], "batch": {"micro_batch": 64}}
    (work / "job.yaml").write_text(json.dumps(job))
    return [launch, "submit", str(work / "job.yaml"), *sets], "tiny DDP MLP entrypoint"


def steady_step_time(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """Seconds per step between the first step line after warm-up and the last one."""
    arrivals: list[tuple[int, float]] = []
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    tail = []
    for line in proc.stdout:
        now = time.monotonic()
        tail = (tail + [line])[-20:]
        match = STEP_LINE.search(line)
        if match and int(match[1]) >= WARMUP_STEPS:
            arrivals.append((int(match[1]), now))
    if proc.wait() != 0 or len(arrivals) < 2:
        raise SystemExit(f"run failed ({proc.returncode}); last lines:\n{''.join(tail)}")
    (first_step, first_t), (last_step, last_t) = arrivals[0], arrivals[-1]
    return (last_t - first_t) / (last_step - first_step)


def reporter_cost(work: Path, world_size: int = 2, every: int = 10, steps: int = 20_000) -> float:
    """Seconds of CPU work the metrics add per training step, measured in-process (insensitive to load).

    The rank's side (``Reporter.step``, a record every ``every`` steps) plus the
    supervisor's (parse each record, insert it into the store) for every rank.
    """
    import io

    from launcher.metrics.record import parse_line
    from launcher.metrics.reporter import Reporter
    from launcher.store.db import Store
    from launcher.store.records import Batch

    out = io.StringIO()
    reporter = Reporter(every=every, stream=out, flops_per_sample=1e9)
    start = time.process_time()
    for _ in range(steps):
        reporter.step(samples=64, loss=0.5)
    rank_side = (time.process_time() - start) / steps
    store = Store(work / "cost-store")
    lines = out.getvalue().splitlines()
    start = time.process_time()
    for line in lines:
        store.add_batch("cost", 0, Batch(records=[parse_line(line, world_size=world_size, node=0, host="localhost", rank=0)]))
    supervisor_side = (time.process_time() - start) / steps
    store.close()
    return rank_side + world_size * supervisor_side


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps per run (>= 60)")
    parser.add_argument("--repeats", type=int, default=5, help="on/off rounds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "LAUNCH_HOME": str(work / "store")}
        times: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(args.repeats):
            for metrics_on in (False, True) if round_ % 2 == 0 else (True, False):
                argv, what = job_command(work, args.steps, metrics_on)
                times[metrics_on].append(steady_step_time(argv, env, REPO))
                print(f"round {round_ + 1}  metrics {'on ' if metrics_on else 'off'}  "
                      f"{times[metrics_on][-1] * 1000:7.2f} ms/step  ({what})", flush=True)
        cost = reporter_cost(work)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    best_on, best_off = min(times[True]), min(times[False])
    print(f"steady step time ({what}, {args.steps} steps, {args.repeats} rounds): median on {on * 1000:.2f} ms, "
          f"off {off * 1000:.2f} ms; best on {best_on * 1000:.2f} ms, off {best_off * 1000:.2f} ms")
    print(f"metrics CPU cost measured in-process: {cost * 1e6:.1f} us per step (rank + supervisor, 2 ranks) = "
          f"{1 + cost / best_off:.5f}x of the best metrics-off step")
    print(f"step time metrics on / off = {on / off:.4f}x median, {best_on / best_off:.4f}x best-of-rounds, "
          f"{1 + cost / best_off:.5f}x from the in-process cost (goal <= 1.01x)")


if __name__ == "__main__":
    main()
