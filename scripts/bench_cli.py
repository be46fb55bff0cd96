#!/usr/bin/env python
"""CLI start-up: `launch --help` and `launch status` (10,000 jobs in the store) vs `torchrun --help`.

A throwaway store (LAUNCH_HOME in a temporary directory) gets a few real
submits (2 gloo ranks with metric records each); the rest of the 10,000 jobs
are recorded through ``Store.create_job`` with a real ``Plan`` each (from
``make_plan``), then moved RUNNING -> SUCCEEDED with a copy of a real job's
summary, so the rows look like real ones. Each command runs ``--runs`` times;
medians are compared. Goals (docs/BENCHMARKS.md): `launch --help` and
`launch status` <= 0.25x `torchrun --help`; `launch status` <= 150 ms.
The figures are printed last.

    python scripts/bench_cli.py [--jobs 10000] [--real 3] [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROGRAM = """
import torch.distributed as dist
from launcher.metrics import Reporter

dist.init_process_group("gloo")
reporter = Reporter(every=2)
for step in range(6):
    reporter.step(samples=8, loss=1.0 / (step + 1))
reporter.close()
dist.destroy_process_group()
"""


def fill_store(work: Path, env: dict[str, str], jobs: int, real: int) -> None:
    """``real`` submitted jobs, then synthetic rows with real plans up to ``jobs`` in all."""
    launch = str(Path(sys.executable).with_name("launch"))
    (work / "tiny.py").write_text(PROGRAM)
    spec = {"name": "tiny", "entrypoint": [sys.executable, str(work / "tiny.py")], "batch": {"micro_batch": 8},
            "resources": {"nodes": 1, "nproc_per_node": 2}, "max_steps": 6}
    (work / "tiny.yaml").write_text(json.dumps(spec))
    for _ in range(real):
        subprocess.run([launch, "submit", "tiny.yaml"], env=env, cwd=work, check=True, capture_output=True)

    os.environ["LAUNCH_HOME"] = env["LAUNCH_HOME"]
    from launcher.backends import plan_job
    from launcher.run import orchestrate
    from launcher.store.db import LAUNCHING, RUNNING, SUCCEEDED, Store

    store = Store()
    template = store.job(store.jobs(limit=1)[0].id)
    prepared = orchestrate.prepare(str(work / "tiny.yaml"), None)
    spec_data = {"job": prepared.job.model_dump(mode="json"), "cluster": prepared.cluster.model_dump(mode="json")}
    for index in range(jobs - real):
        job_id = f"{prepared.job.name}-{index:06x}"  # new_job_id()'s shape; 6 random hex would collide at 10k
        plan = plan_job(prepared.job, prepared.cluster, job_id, rdzv_port=prepared.plan.rendezvous.port)
        store.create_job(plan, spec_data)
        store.transition(job_id, LAUNCHING, attempt=0)
        store.transition(job_id, RUNNING)
        store.transition(job_id, SUCCEEDED, summary=template.summary)
    store.close()


def timed(argv: list[str], env: dict[str, str], cwd: Path, runs: int) -> float:
    """Median wall seconds of ``runs`` runs of ``argv`` (after one untimed warm-up run)."""
    subprocess.run(argv, env=env, cwd=cwd, check=True, capture_output=True)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, cwd=cwd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def imports_torch(env: dict[str, str], cwd: Path, args: list[str]) -> bool:
    """Whether `launch ARGS` imports torch (run in-process, then sys.modules inspected)."""
    code = (
        "import sys, contextlib, io\nfrom launcher.cli.main import main\n"
        f"with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n    main({args!r})\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, check=True, capture_output=True, text=True)
    return out.stdout.strip().endswith("True")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--real", type=int, default=3, help="jobs submitted for real")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    launch = str(Path(sys.executable).with_name("launch"))
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "LAUNCH_HOME": str(work / "store")}
        start = time.perf_counter()
        fill_store(work, env, args.jobs, args.real)
        print(f"store: {args.jobs} jobs ({args.real} submitted) in {time.perf_counter() - start:.1f} s", flush=True)
        help_s = timed([launch, "--help"], env, work, args.runs)
        status_s = timed([launch, "status"], env, work, args.runs)
        torchrun_s = timed([torchrun, "--help"], env, work, args.runs)
        torch_loaded = {name: imports_torch(env, work, argv) for name, argv in (("--help", ["--help"]), ("status", ["status"]))}
    print(f"median of {args.runs}: launch --help {help_s * 1000:.0f} ms, launch status {status_s * 1000:.0f} ms "
          f"({args.jobs} jobs), torchrun --help {torchrun_s * 1000:.0f} ms; torch imported by "
          f"--help: {torch_loaded['--help']}, status: {torch_loaded['status']}")
    print(f"launch --help / torchrun --help = {help_s / torchrun_s:.3f}x, launch status / torchrun --help = "
          f"{status_s / torchrun_s:.3f}x (goals <= 0.25x); launch status = {status_s * 1000:.0f} ms (goal <= 150 ms)")


if __name__ == "__main__":
    main()
