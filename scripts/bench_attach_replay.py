"""How fast `launch attach --cluster` replays a node's journal into a fresh store (lines/s).

Writes the run directory of a finished one-node local job as its agent would have left it (``job.json``,
``node0.journal``: ``@started``, LINES output lines of which every tenth is a metric record, ``@exit``), then
times ``launch attach JOB --cluster cluster.yaml`` with an empty LAUNCH_HOME, which imports the job and
fetches the whole journal (logs and records into the store), and checks every line arrived once.

    .venv/bin/python scripts/bench_attach_replay.py [LINES]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from launcher.backends import plan_job  # noqa: E402
from launcher.node import journal, rundir  # noqa: E402
from launcher.run.orchestrate import load_cluster_spec, new_job_id  # noqa: E402
from launcher.run.recorded import stored_spec  # noqa: E402
from launcher.run.takeover import node_record  # noqa: E402
from launcher.spec import JobSpec  # noqa: E402
from launcher.store.db import Store  # noqa: E402


def main(lines: int) -> None:
    os.chdir(ROOT)
    cluster = load_cluster_spec("cluster.yaml")
    job = JobSpec(name="replay", entrypoint=["python", "t.py"], resources={"nodes": 1, "nproc_per_node": 1},
                  max_steps=lines // 10)
    job_id = new_job_id("replay")
    plan = plan_job(job, cluster, job_id, rdzv_port=29599)
    run_dir = rundir.job_run_dir(job_id)
    journal.write_atomically(os.path.join(run_dir, journal.RECORD_FILE), json.dumps(
        node_record({"created_at": time.time(), "spec": stored_spec(job, cluster, run_check=False)}, plan, 0)))
    journal.write_atomically(journal.pid_path(run_dir, 0), "1 0\n")  # not this agent: gone, as after its exit
    body = [f'@started {json.dumps({"pid": 1, "child": 2, "host": "localhost", "run_dir": run_dir})}']
    for k in range(lines):
        step = k // 10 + 1
        body.append(f'|[0]: @@launch {json.dumps({"v": 1, "rank": 0, "step": step, "samples": 8})}' if k % 10 == 9
                    else f"|[0]: step {step} line {k} of rank 0")
    body.append('@exit {"code":0}')
    Path(journal.journal_path(run_dir, 0)).write_text("\n".join(body) + "\n")
    home = Path(tempfile.mkdtemp(prefix="replay-home-"))
    try:
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "launcher", "attach", job_id, "--cluster", "cluster.yaml"],
                              env={**os.environ, "LAUNCH_HOME": str(home)}, capture_output=True, text=True, cwd=ROOT)
        took = time.monotonic() - began
        assert done.returncode == 0, done.stderr
        store = Store(home)
        logged = sum(1 for _ in open(store.run_dir(job_id) / "attempt0-node0.log"))
        records = len(store.metrics(job_id))
        assert (logged, records) == (lines - lines // 10, lines // 10), (logged, records)
        print(f"{lines} journal lines ({records} records) replayed into a fresh store in {took:.2f} s "
              f"(the whole `launch attach --cluster`, start to exit): {lines / took:,.0f} lines/s")
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lines", nargs="?", type=int, default=100_000, help="journal lines to replay")
    main(parser.parse_args().lines)
