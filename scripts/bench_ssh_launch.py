#!/usr/bin/env python3
"""Launch wall time to 1, 2, 4 and 8 SSH hosts (the namespaced testbed), as ratios against 1 host.

Measures, in this process, from ``prepare`` (load + plan) to the moment every
node's torchrun agent process exists (the store's ``running`` event): preflight
(connect, authenticate, probe every host) plus start (one channel and wrapper a
host). Each job runs ``/bin/true`` under torchrun, 1 process a node, and is
allowed to finish before the next. Sizes are interleaved and repeated; the
median counts. Target: 8 hosts <= 1.5x one host (parallel fan-out).

Needs root (it brings up an 8-host testbed, taking the machine's testbed lock,
and tears it down at the end)::

    sudo .venv/bin/python scripts/bench_ssh_launch.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import testbed  # noqa: E402

SIZES = (1, 2, 4, 8)
LOCK_FILE = Path(tempfile.gettempdir()) / "lt-testbed.lock"


@contextlib.contextmanager
def machine_lock() -> Iterator[None]:
    """The testbed lock that tests/testbed_fixture.py takes: one testbed a machine."""
    with open(LOCK_FILE, "w") as lock:
        print(f"waiting for {LOCK_FILE} ...", file=sys.stderr)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_specs(bed: testbed.Testbed, work: Path, hosts: int) -> tuple[Path, Path]:
    """A cluster of the first ``hosts`` testbed hosts (addresses probed) and a /bin/true job."""
    cluster = {
        "name": f"bench-{hosts}", "backend": "ssh",
        "ssh": {"user": "root", "key_file": str(bed.key_file), "known_hosts": str(bed.known_hosts),
                "config_file": str(bed.ssh_config)},
        "nodes": [{"host": h.name, "gpus": 0} for h in bed.hosts[:hosts]],
        "python": sys.executable, "workdir": str(work),
    }
    job = {"name": "bench-ssh", "entrypoint": ["/bin/true"], "batch": {"micro_batch": 1},
           "resources": {"nodes": hosts, "nproc_per_node": 1}}
    cluster_path, job_path = work / f"cluster{hosts}.yaml", work / f"job{hosts}.yaml"
    cluster_path.write_text(json.dumps(cluster))
    job_path.write_text(json.dumps(job))
    return cluster_path, job_path


def launch_once(cluster: Path, job: Path) -> tuple[float, float]:
    """(preflight seconds, start seconds) of one foreground submit, which must succeed."""
    from launcher.run import orchestrate
    from launcher.store.db import Store

    started = time.time()
    job_id, state = orchestrate.submit(orchestrate.prepare(str(job), str(cluster)), detach=False, echo=None)
    if state != "SUCCEEDED":
        raise SystemExit(f"{job_id} ended {state}; see $LAUNCH_HOME/runs/{job_id}")
    events = {e["kind"]: e["t"] for e in Store().events(job_id)}
    return events["launching"] - started, events["running"] - events["launching"]


def fan_out_floor(bed: testbed.Testbed, hosts: int) -> float:
    """Seconds to connect to ``hosts`` hosts and run ``true`` on each, in parallel: the fan-out alone."""
    from launcher.backends.ssh.connection import Pool, fan_out
    from launcher.backends.ssh.settings import SSHSettings
    from launcher.backends.ssh.spec import SSHSpec

    settings = SSHSettings(SSHSpec(user="root", key_file=str(bed.key_file), known_hosts=str(bed.known_hosts),
                                   config_file=str(bed.ssh_config)))
    pool = Pool(settings, 10.0)
    started = time.perf_counter()
    try:
        results = fan_out(lambda host: pool.get(settings.target(host.name)).run(["true"]), bed.hosts[:hosts])
    finally:
        pool.close()
    if not all(r.ok and r.value.code == 0 for r in results):
        raise SystemExit(f"fan-out to {hosts} hosts failed: {[r.error for r in results if not r.ok]}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per size (default 5)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ssh-") as tmp, machine_lock():
        work = Path(tmp)
        os.environ["LAUNCH_HOME"] = str(work / "home")
        bed = testbed.up(max(SIZES), work / "testbed")
        try:
            specs = {n: write_specs(bed, work, n) for n in SIZES}
            launch_once(*specs[1])  # warm-up: page cache, sshd, imports
            runs: dict[int, list[tuple[float, float]]] = {n: [] for n in SIZES}
            floor: dict[int, list[float]] = {n: [] for n in SIZES}
            for _ in range(args.repeat):
                for n in SIZES:
                    runs[n].append(launch_once(*specs[n]))
                    floor[n].append(fan_out_floor(bed, n))
        finally:
            testbed.down(bed.base_dir)
    bare = {n: statistics.median(floor[n]) for n in SIZES}
    print(f"fan-out alone, connect + `true` on every host (median of {args.repeat})")
    print("  " + "  ".join(f"{n} hosts {bare[n]:.3f} s ({bare[n] / bare[1]:.2f}x)" for n in SIZES))
    total = {n: statistics.median(p + s for p, s in runs[n]) for n in SIZES}
    print(f"launch wall time, submit -> every agent started (median of {args.repeat}, in-process)")
    print(f"{'hosts':>5}  {'total s':>8}  {'preflight s':>11}  {'start s':>8}  {'min s':>6}  {'vs 1 host':>9}")
    for n in SIZES:
        preflight = statistics.median(p for p, _ in runs[n])
        start = statistics.median(s for _, s in runs[n])
        fastest = min(p + s for p, s in runs[n])
        print(f"{n:>5}  {total[n]:>8.3f}  {preflight:>11.3f}  {start:>8.3f}  {fastest:>6.3f}  {total[n] / total[1]:>8.2f}x")
    print(f"8 hosts / 1 host: {total[8] / total[1]:.2f}x (target <= 1.5x)")


if __name__ == "__main__":
    main()
