#!/usr/bin/env python3
"""32 and 64 hosts run and cancel clean (issue 23), on a 64-host namespace bed: the check CI has no time for.

Needs root and the venv. Brings up its own bed (prefix ``sc-``, bridge ``sc-br0``, subnet 10.83.0: never the
suite's ``lt-``/``lu-`` nor bench_fanout's ``fb-``) and always tears it down, by PID. Shares bench_fanout's bed
code (cluster spec, the job, ``--light``'s torchrun stand-in); nothing of it is copied here.

  (a) ``launch submit`` (foreground) of a job of 1 process a node that prints a line, at 32 and at 64 hosts:
      the time to SUCCEEDED (the submit's exit), the time to every node started, every rank's line;
  (b) a 64-host job whose ranks sleep, submitted with ``--detach``; once every host has its rank, ``launch cancel``;
      the time until the cancel returns and until no process of the job is left on any host, then, per host,
      the processes of the job in that host's namespace (``testbed.tagged_pids``: the ``LAUNCH_JOB_ID`` tag the
      job's processes carry, launcher/node/proctree.py), which must be 0 on all 64.

    sudo .venv/bin/python scripts/bench_scale.py [--sizes 32,64] [--light]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_fanout import LAUNCH, cluster_yaml, load_avg, prepare_work, run_launch  # noqa: E402
from bench_supervisor import bring_down  # noqa: E402

from launcher.node import proctree  # noqa: E402
from tools import testbed  # noqa: E402

NAMES = testbed.Names("sc-", "10.83.0")
SLEEPER = "import time; print('rank up', flush=True); time.sleep(900)\n"


def ranks_by_node(job_id: str) -> dict[int, int]:
    """Rank processes of the job now, by node (the ``LAUNCH_NODE`` of each; one PID namespace for the bed)."""
    by_node: dict[int, int] = {}
    for proc in proctree.job_procs(job_id):
        if "RANK" in proc.env and proc.env.get(proctree.NODE_TAG, "").isdigit():
            node = int(proc.env[proctree.NODE_TAG])
            by_node[node] = by_node.get(node, 0) + 1
    return by_node


def per_host(bed: testbed.Testbed, job_id: str) -> tuple[dict[str, int], dict[str, int]]:
    """(the job's processes, every non-daemon process) in each host's namespace."""
    tag = f"{proctree.TAG}={job_id}"
    return ({h.name: len(testbed.tagged_pids(h, tag)) for h in bed.hosts},
            {h.name: len(testbed.pids(h)) for h in bed.hosts})


def run_cancel(bed: testbed.Testbed, n: int, work: Path, light: bool, hold_s: float, timeout: float) -> dict:
    """Submit a long job on ``n`` hosts with --detach, wait for every rank, ``launch cancel`` it, count what is left."""
    home = work / "home"
    env = {**os.environ, "LAUNCH_HOME": str(home)}
    job = work / f"sleep-{n}.yaml"
    env_line = f"env: {{PYTHONPATH: {work / 'fake'}}}\n" if light else ""
    job.write_text(f"name: sleep{n}\nentrypoint: [python, {work / 'sleep.py'}]\n"
                   f"resources: {{nodes: {n}, nproc_per_node: 1}}\nwatch: {{stall_timeout: 900}}\n{env_line}")
    cluster = cluster_yaml(bed, n, work, None, 32)
    t0 = time.time()
    done = subprocess.run([LAUNCH, "submit", str(job), "--cluster", str(cluster), "--detach"], env=env,
                          capture_output=True, text=True, timeout=timeout)
    out: dict = {"n": n, "submit_code": done.returncode, "submit_s": time.time() - t0}
    job_id = done.stdout.strip().splitlines()[-1] if done.returncode == 0 and done.stdout.strip() else None
    if job_id is None:
        out["error"] = (done.stderr or done.stdout).strip()[-500:]
        return out
    out["job"] = job_id
    deadline = time.time() + timeout
    while len(by_node := ranks_by_node(job_id)) < n and time.time() < deadline:
        time.sleep(0.5)
    out["to_every_rank_s"] = time.time() - t0
    out["nodes_with_a_rank"] = len(by_node)
    time.sleep(hold_s)
    tagged, _ = per_host(bed, job_id)
    out["job_procs_before"] = sum(tagged.values())
    out["hosts_with_job_procs_before"] = sum(1 for c in tagged.values() if c)
    out["load_at_cancel"] = load_avg()
    t1 = time.time()
    cancelled = subprocess.run([LAUNCH, "cancel", job_id], env=env, capture_output=True, text=True, timeout=timeout)
    out |= {"cancel_code": cancelled.returncode, "cancel_out": (cancelled.stdout + cancelled.stderr).strip()[-300:],
            "cancel_returned_s": time.time() - t1}
    left = proctree.job_pids(job_id)
    while left and time.time() - t1 < timeout:
        time.sleep(0.1)
        left = proctree.job_pids(job_id)
    out["to_zero_job_procs_s"] = time.time() - t1 if not left else None
    tagged, every = per_host(bed, job_id)
    out["job_procs_left"] = sum(tagged.values())
    out["hosts_checked"] = len(tagged)
    out["hosts_with_job_procs_left"] = sorted(name for name, c in tagged.items() if c)
    time.sleep(2.0)  # the hosts' sshd sessions close
    _, every = per_host(bed, job_id)
    out["any_procs_left_2s_later"] = sum(every.values())
    status = subprocess.run([LAUNCH, "status", job_id, "--json"], env=env, capture_output=True, text=True)
    out["state"] = json.loads(status.stdout or "{}").get("state")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="32,64", help="hosts of the jobs run to SUCCEEDED")
    parser.add_argument("--cancel-hosts", type=int, default=64)
    parser.add_argument("--hold", type=float, default=5.0, help="seconds every rank runs before the cancel")
    parser.add_argument("--timeout", type=float, default=300.0, help="per step")
    parser.add_argument("--light", action="store_true", help="bench_fanout's torchrun stand-in (no torch import)")
    parser.add_argument("--work", default="/tmp/bench-scale")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    work = Path(args.work)
    prepare_work(work)
    (work / "sleep.py").write_text(SLEEPER)
    hosts = max(sizes + [args.cancel_hosts])
    results: dict = {"load_before": load_avg(), "cores": os.cpu_count(), "light": args.light, "runs": []}
    t = time.perf_counter()
    bed = testbed.up(hosts, work / "bed", NAMES)
    results["up_s"] = time.perf_counter() - t
    print(f"bed: {hosts} hosts up in {results['up_s']:.2f} s (load {load_avg()})", flush=True)
    try:
        for n in sizes:
            row = run_launch(n, cluster_yaml(bed, n, work, None, 32), work, light=args.light)
            row["load"] = load_avg()
            results["runs"].append(row)
            print(json.dumps(row), flush=True)
            time.sleep(2.0)
        row = run_cancel(bed, args.cancel_hosts, work, args.light, args.hold, args.timeout)
        row["load"] = load_avg()
        results["cancel"] = row
        print(json.dumps(row), flush=True)
    finally:
        t = time.perf_counter()
        bring_down(bed, NAMES)
        results["down_s"] = time.perf_counter() - t
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        results["namespaces_left"] = [line.split()[0] for line in listing.splitlines() if line.startswith(NAMES.prefix)]
        results["load_after"] = load_avg()
        (work.parent / "bench-scale.json").write_text(json.dumps(results, indent=1))
        print(f"bed: down in {results['down_s']:.2f} s; {NAMES.prefix} namespaces left: {results['namespaces_left']}",
              flush=True)
    summarise(results)
    return 0 if all(r.get("state") == "SUCCEEDED" for r in results["runs"]) and _clean(results.get("cancel")) else 1


def _clean(row: dict | None) -> bool:
    return row is not None and row.get("state") == "CANCELLED" and row.get("job_procs_left") == 0


def summarise(results: dict) -> None:
    print(f"\nload {results['load_before']} -> {results['load_after']} on {results['cores']} cores; "
          f"bed up {results['up_s']:.2f} s, down {results['down_s']:.2f} s; light: {results['light']}")
    for r in results["runs"]:
        print(f"{r['n']:>3} hosts: {r['state']} in {r['total_s']:.1f} s (every node started "
              f"{r.get('to_started_s', float('nan')):.1f} s), {r['lines']} of {r['n']} ranks' lines; load {r['load']}")
    c = results.get("cancel")
    if c and "job" in c:
        zero = c["to_zero_job_procs_s"]
        print(f"cancel at {c['n']} hosts: every rank up {c['to_every_rank_s']:.1f} s after submit "
              f"({c['nodes_with_a_rank']} nodes); {c['job_procs_before']} processes of the job on "
              f"{c['hosts_with_job_procs_before']} hosts; `launch cancel` returned in {c['cancel_returned_s']:.2f} s, "
              f"0 left after {'never' if zero is None else f'{zero:.2f} s'}; left on the {c['hosts_checked']} hosts: "
              f"{c['job_procs_left']} {c['hosts_with_job_procs_left'] or ''}; any process 2 s later: "
              f"{c['any_procs_left_2s_later']}; {c['state']} (load at cancel {c['load_at_cancel']})")
    elif c:
        print(f"cancel: submit failed: {c.get('error')}")


if __name__ == "__main__":
    sys.exit(main())
