#!/usr/bin/env python3
"""`launch status` of a 1,000-rank job (issue 23), without bench_supervisor's bed: no root, no namespaces.

The job is bench_supervisor's (``thousand_ranks``: 125 nodes x 8 ranks written through the store's own API,
50,000 metric records, 1,000 ranks' samples), made from a stand-in for the bed's 64 x 1 job
(``synthetic_source``: rank 0's records as the ticker's Reporter writes them). Each status command is timed
against `launch --help` in the same rounds, wall and CPU time (user + system, which the machine's load stretches
less), while the job runs (its summary read from the running summary) and after it ended (the summary stored);
then the status path in process (``status_in_process``: the summary alone and each command, and a cProfile of
`status JOB`).

    .venv/bin/python scripts/bench_status.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_fanout import load_avg  # noqa: E402
from bench_supervisor import end_thousand, thousand_ranks, time_status  # noqa: E402

from launcher.metrics.record import ProcessSample  # noqa: E402
from launcher.store.db import Store  # noqa: E402
from launcher.store.records import Batch  # noqa: E402


def synthetic_source(home: Path, steps: int = 50) -> str:
    """A stand-in for the bed's 64 x 1 job: a 1-node job's plan, spec and records of rank 0 as
    the ticker's Reporter writes them (every step, no warm-up, about a second a step, 32 samples and 4,096 tokens,
    loss 1/step, the peak RSS, no GPU) and one process sample; its id."""
    import random

    from launcher.backends import cluster_spec, plan_job
    from launcher.metrics.record import MetricRecord
    from launcher.run.recorded import stored_spec
    from launcher.spec import JobSpec

    job = JobSpec(name="ticker", entrypoint=["python", "ticker.py"], resources={"nodes": 1, "nproc_per_node": 1})
    cluster = cluster_spec(name="local")
    job_id = f"ticker-{os.urandom(4).hex()}"
    store = Store(home)
    store.create_job(plan_job(job, cluster, job_id, rdzv_port=29500), stored_spec(job, cluster, False))
    store.transition(job_id, "LAUNCHING", attempt=0)
    store.transition(job_id, "RUNNING")
    clock, rng = time.time() - steps, random.Random(23)
    records = []
    for step in range(1, steps + 1):
        elapsed = 1.0 + rng.uniform(-0.004, 0.012)
        clock += elapsed
        records.append(MetricRecord(node=0, rank=0, local_rank=0, host="node1", step=step, t=clock, steps=1,
                                    interval_s=elapsed, step_time_s=elapsed, samples=32, tokens=4096,
                                    samples_per_sec=32 / elapsed, tokens_per_sec=4096 / elapsed, loss=1.0 / step,
                                    mem_peak_bytes=58_000_000 + 4096 * step))
    store.add_batch(job_id, 0, Batch(records=records))
    store.add_batch(job_id, 0, Batch(samples=[ProcessSample(node=0, rank=0, host="node1", t=clock, pid=4242, cpu_s=3.5,
                                                rss_bytes=57_000_000, rss_peak_bytes=58_000_000)]))
    return job_id


def status_in_process(home: Path, job_id: str, rounds: int) -> dict:
    """The status path timed inside this process (ms, medians of ``rounds``): the job's summary alone
    (``jobstatus.job_summary``), each status command; then where one `status JOB` spends (cProfile, by cumulative time)."""
    import contextlib
    import cProfile
    import io
    import pstats

    from launcher.cli.main import main as launch
    from launcher.views import jobstatus

    os.environ["LAUNCH_HOME"] = str(home)

    def run(argv: list[str]) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                launch(argv)
            except SystemExit:
                pass

    def summary() -> None:
        store = Store(home)
        jobstatus.job_summary(store, store.job(job_id))
        store.close()

    steps = {"summary": summary, "status": lambda: run(["status"]), "status JOB": lambda: run(["status", job_id]),
             "status --json JOB": lambda: run(["status", "--json", job_id])}
    times: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, call in steps.items():
            t, c = time.perf_counter(), time.process_time()
            call()
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
    profile = cProfile.Profile()
    profile.runcall(run, ["status", job_id])
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(r"launcher|sqlite3|json", 14)
    top = [line for line in text.getvalue().splitlines() if line.strip()][-15:]
    return {"ms": {name: round(median(t) * 1000, 1) for name, t in times.items()},
            "cpu_ms": {name: round(median(t) * 1000, 1) for name, t in cpu.items()}, "profile": top, "load": load_avg()}


def run(work: Path, rounds: int) -> int:
    """The 1,000-rank job, running then ended, timed against `launch --help`; the results under ``work``'s parent."""
    shutil.rmtree(work, ignore_errors=True)
    home = work / "home"
    env = {**os.environ, "LAUNCH_HOME": str(home)}
    results: dict = {"load_before": load_avg(), "cores": os.cpu_count()}
    t = time.perf_counter()
    big = thousand_ranks(home, synthetic_source(home))
    results["write_s"] = time.perf_counter() - t
    results["status_running"] = time_status(big, env, rounds)
    results["in_process_running"] = status_in_process(home, big, rounds)
    results["finish_s"] = end_thousand(home, big)
    results["status_ended"] = time_status(big, env, rounds)
    results["in_process_ended"] = status_in_process(home, big, rounds)
    results["load_after"] = load_avg()
    (work.parent / "bench-status.json").write_text(json.dumps(results, indent=1))
    print(f"load {results['load_before']} -> {results['load_after']} on {results['cores']} cores; 1,000-rank job "
          f"written in {results['write_s']:.1f} s, finished in {results['finish_s']:.2f} s")
    for state in ("running", "ended"):
        timing = results[f"status_{state}"]
        for kind in ("ms", "cpu_ms"):
            ms = timing[kind]
            print(f"  {state:8} {'wall' if kind == 'ms' else 'CPU ':4} " + "  ".join(
                f"{name} {value:.0f} ms" + (f" ({value / ms['--help']:.1f}x)" if name != "--help" else "")
                for name, value in ms.items()) + f"  (load {timing['load']})")
        inside = results[f"in_process_{state}"]
        print(f"  {state:8} in process, wall (CPU): " + "  ".join(f"{name} {value:.0f} ({inside['cpu_ms'][name]:.0f}) ms"
                                                              for name, value in inside["ms"].items()))
        for line in inside["profile"]:
            print("    " + line)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="runs of each status command")
    parser.add_argument("--work", default="/tmp/bench-status/w")
    args = parser.parse_args()
    return run(Path(args.work), args.rounds)


if __name__ == "__main__":
    sys.exit(main())
