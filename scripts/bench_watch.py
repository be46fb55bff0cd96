#!/usr/bin/env python
"""The first-hour tools' costs: shell completion with 10,000 jobs in the store, one refresh of the
progress view (`status --watch`, foreground submit) with 10,000 metric records, and `launch logs --tail`
on a long log.

A throwaway store (LAUNCH_HOME in a temporary directory) gets 10,000 jobs (real Plans from
``make_plan``), one of them RUNNING with 10,000 metric records (16 ranks x 625 reports, the fields
the Reporter writes) and a node log of ``--log-mb`` MiB in the supervisor's format. Each figure is
the median of ``--runs``; they are printed last.

    python scripts/bench_watch.py [--jobs 10000] [--records 10000] [--log-mb 200] [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def fill_store(home: Path, jobs: int, records: int, log_mb: int) -> str:
    from launcher.backends import cluster_spec, plan_job
    from launcher.metrics.record import MetricRecord
    from launcher.spec import JobSpec
    from launcher.store.db import LAUNCHING, RUNNING, Store
    from launcher.store.records import Batch

    store = Store(home)
    spec = JobSpec(name="bench", entrypoint=["python", "t.py"], batch={"micro_batch": 2}, max_steps=100000)
    plan = plan_job(spec, cluster_spec(name="local"), "bench-00000000", rdzv_port=29500)
    for i in range(jobs):
        store.create_job(plan.model_copy(update={"job_id": f"bench-{i:08x}"}), {})
    job_id = f"bench-{jobs - 1:08x}"
    store.transition(job_id, LAUNCHING)
    store.transition(job_id, RUNNING)
    now = time.time()
    batch = [
        {"v": 1, "job": job_id, "node": rank // 8, "rank": rank, "local_rank": rank % 8, "host": f"gpu{rank // 8}",
         "step": 10 * (i + 1), "t": now, "steps": 10, "interval_s": 1.0, "step_time_s": 0.1 + rank / 1000,
         "samples": 320, "tokens": 0, "samples_per_sec": 320.0, "tokens_per_sec": 0.0, "loss": 1.0 / (i + 1),
         "mem_peak_bytes": 2**33, "warmup": i == 0}
        for i in range(records // 16) for rank in range(16)
    ]
    store.add_batch(job_id, 0, Batch(records=[r for row in batch if (r := MetricRecord.from_stored(row)) is not None]))
    log = store.run_dir(job_id) / "attempt0-node0.log"
    line = " [0/3] step 123 loss 0.123456 lr 0.0001 some more words of a typical training log\n"
    with open(log, "w") as handle:
        t, written = now - 86400, 0
        while written < log_mb * 2**20:
            chunk = "".join(f"{t + i / 10:.3f}{line}" for i in range(10000))
            handle.write(chunk)
            written += len(chunk)
            t += 1000
    store.set_node(job_id, 0, 0, host="gpu0", state="RUNNING", log_path=str(log))
    store.close()
    return job_id


def median_s(argv: list[str], env: dict, runs: int) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def refresh_cost(home: Path, job_id: str, runs: int) -> tuple[float, float]:
    """(one read of the store + snapshot, one render of the bar) in seconds, medians."""
    import io

    from launcher.store.db import Store
    from launcher.views.progress import LiveProgress

    store = Store(home)
    view = LiveProgress(io.StringIO(), max_steps=100000, nnodes=2)
    view._source = (store, job_id)  # the view's own refresh, without its thread
    reads, renders = [], []
    for _ in range(runs):
        began = time.perf_counter()
        view._read_store()
        reads.append(time.perf_counter() - began)
        began = time.perf_counter()
        view._console.render_lines(view._render())
        renders.append(time.perf_counter() - began)
    view.close()
    return statistics.median(reads), statistics.median(renders)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--records", type=int, default=10000)
    parser.add_argument("--log-mb", type=int, default=200)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="bench-watch-"))
    job_id = fill_store(home, args.jobs, args.records, args.log_mb)
    env = {**os.environ, "LAUNCH_HOME": str(home), "PYTHONPATH": str(ROOT)}
    launch = [sys.executable, "-m", "launcher"]
    complete_env = {**env, "_LAUNCH_COMPLETE": "bash_complete", "COMP_WORDS": "launch logs bench-0000", "COMP_CWORD": "2"}
    completion = median_s(launch, complete_env, args.runs)
    help_s = median_s([*launch, "--help"], env, args.runs)
    read_s, render_s = refresh_cost(home, job_id, args.runs)
    tail_s = median_s([*launch, "logs", job_id, "--tail", "50"], env, args.runs)
    grep_s = median_s([*launch, "logs", job_id, "--grep", "step 99999"], env, max(1, args.runs // 5))
    print(f"completion of a job id, {args.jobs} jobs: {completion * 1000:.0f} ms (launch --help: {help_s * 1000:.0f} ms)")
    print(f"progress refresh, {args.records} records: read + snapshot {read_s * 1000:.0f} ms, render {render_s * 1000:.1f} ms")
    print(f"logs --tail 50 of a {args.log_mb} MiB log: {tail_s * 1000:.0f} ms; --grep over all of it: {grep_s:.1f} s")


if __name__ == "__main__":
    main()
