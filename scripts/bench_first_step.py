#!/usr/bin/env python
"""Submit -> first step: `launch submit` vs bare torchrun on the same tiny script (2 local procs).

Each rank prints a wall-clock timestamp right after ``init_process_group`` and
one DDP step; a run's "first step" is when the last rank printed it, counted
from the moment the command was started. The two commands alternate for
``--repeats`` rounds; the figure is the median of the rounds' ratios (each round's two runs are
neighbours in time, so the machine's drift, which moves a run by +-30% here, cancels out), with
the medians of each given too. Bare torchrun gets
``--local-addr 127.0.0.1`` (--standalone hangs where the host name does not
resolve, as on the CI box). Goal (docs/BENCHMARKS.md): the
ratio launch / torchrun <= 1.05 (issue 20). The figure is printed last.

    python scripts/bench_first_step.py [--repeats 25]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAM = """
import os
import time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
model = DistributedDataParallel(torch.nn.Linear(32, 32))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(8, 32)).pow(2).mean().backward()
optimizer.step()
print(f"FIRST_STEP {time.time():.6f}", flush=True)
dist.barrier()
# Skip gloo's teardown: on torch 2.13 it aborts now and then ("terminate called without an
# active exception") under either launcher; only the first step is measured here.
os._exit(0)
"""
MARK = re.compile(r"FIRST_STEP (\d+\.\d+)")


def first_step(argv: list[str], env: dict[str, str], cwd: Path, ranks: int = 2) -> tuple[float, float]:
    """Run ``argv``; (seconds to the last rank's first step, seconds to exit)."""
    start = time.time()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    end = time.time()
    stamps = [float(m) for m in MARK.findall(proc.stdout + proc.stderr)]
    if proc.returncode != 0 or len(stamps) != ranks:
        raise SystemExit(f"{argv[0]} failed ({proc.returncode}), {len(stamps)} stamps:\n{proc.stdout}\n{proc.stderr}")
    return max(stamps) - start, end - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=25,
                        help="paired rounds (single rounds range 0.74-1.19x on a quiet 2-core VM: fewer mislead)")
    args = parser.parse_args()
    python = sys.executable
    launch = str(Path(python).with_name("launch"))
    # launch's own modules as an install leaves them, compiled (where PYTHONDONTWRITEBYTECODE is set, as on the CI
    # machines, a source checkout would otherwise compile them again at every `launch` start); torch's are already
    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "launcher"), quiet=1)
    with tempfile.TemporaryDirectory(prefix="bench-first-step-") as tmp:
        work = Path(tmp)
        (work / "first_step.py").write_text(PROGRAM)
        job = {"name": "first-step", "entrypoint": [python, str(work / "first_step.py")],
               "batch": {"micro_batch": 8}, "resources": {"nodes": 1, "nproc_per_node": 2}}
        (work / "job.yaml").write_text(json.dumps(job))
        env = {**os.environ, "LAUNCH_HOME": str(work / "store")}
        commands = {
            "launch": [launch, "submit", "job.yaml"],
            "torchrun": [python, "-m", "torch.distributed.run", "--standalone", "--local-addr", "127.0.0.1",
                         "--nproc-per-node", "2", "first_step.py"],
        }
        first_step(commands["torchrun"], env, work)  # warm the page cache for both
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for round_ in range(args.repeats):
            for name, argv in commands.items():
                results[name].append(first_step(argv, env, work))
                step, total = results[name][-1]
                print(f"round {round_ + 1}  {name:<8} first step {step:6.2f} s   exit {total:6.2f} s", flush=True)
    medians = {name: statistics.median(s for s, _ in runs) for name, runs in results.items()}
    exits = {name: statistics.median(t for _, t in runs) for name, runs in results.items()}
    print(f"median first step: launch {medians['launch']:.2f} s, torchrun {medians['torchrun']:.2f} s;"
          f" median exit: launch {exits['launch']:.2f} s, torchrun {exits['torchrun']:.2f} s")
    paired = statistics.median(a[0] / b[0] for a, b in zip(results["launch"], results["torchrun"], strict=True))
    print(f"ratio of the medians {medians['launch'] / medians['torchrun']:.3f}x")
    print(f"submit -> first step, launch / torchrun = {paired:.3f}x, the median of the rounds' ratios (goal <= 1.05x)")


if __name__ == "__main__":
    main()
