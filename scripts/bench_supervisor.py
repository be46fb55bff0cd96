#!/usr/bin/env python3
"""A supervisor that stays light (issue 23): its CPU and memory while it follows 64 nodes x 1 rank, each rank
printing a line and a metric record a second; and `launch status` of such a job and of a 1,000-rank job.

Needs root and the venv. Brings up its own 64-host namespace bed (prefix ``sv-``, bridge ``sv-br0``, subnet
10.85.0: never the suite's ``lt-``/``lu-``, bench_fanout's ``fb-`` or bench_scale's ``sc-``) and always tears it
down. Shares bench_fanout's bed code (cluster spec, ``--light``'s torchrun stand-in).

Why the SSH bed and not the local backend with 64 nodes: what a supervisor of a real 64-node job pays is the
SSH side of following (one paramiko channel a node: decrypting and reading every node's stream, the threads
that parse it) as well as parsing, deciding and writing the store; the local backend reads pipes and would leave
the transport out. The ranks and their hosts' sshd share this machine's cores with the supervisor, which slows
everything's wall time but not the CPU the supervisor's own process is charged with (``/proc/PID/stat``).

The job (``--detach``): 64 nodes x 1 rank, each rank prints a line and writes a record through the real
``launcher.metrics.Reporter`` (every step, one step a second) for ``--duration`` seconds. Once every node runs
and records arrive, the supervisor process (the detached keeper's ``--supervise`` child, the store's
``supervisor_pid``) is measured over ``--window`` seconds: utime + stime from ``/proc/PID/stat`` at both ends
(and its keeper's), RSS every 5 s. `launch status` (list), `status JOB` and `status --json JOB` are timed during
the run and after the job ended, each against `launch --help` in the same rounds (a ratio). Where the window's CPU
went: each thread's utime + stime (``/proc/PID/task``) by what one ``py-spy dump`` says the thread runs (``--profile``
also tries ``py-spy record``, which at this bed's load did not come back from the 129-thread supervisor).
``--idle-transports N`` measures only what N idle paramiko transports to the bed's hosts cost this process.

The 1,000-rank job: 1,000 processes (plus 64 agents and launchers) do not fit this machine's 2 cores and
24 GiB alongside others' runs, so the benchmark writes its rows through the store's own API (``Store``):
the 64-node job's plan and spec widened to 125 nodes x 8 ranks, node rows, 50,000 metric records (the most a
job keeps: 1,000 ranks x 50 steps, copies of the real job's records) and 1,000 ranks' process samples; timed
while RUNNING (the summary read from its running summary, ``store/tally.py``) and after it ended (the summary
stored).

``bench_status.py`` times the 1,000-rank job alone, without the bed.

    sudo .venv/bin/python scripts/bench_supervisor.py [--duration 170] [--window 60] [--rounds 3]
    sudo .venv/bin/python scripts/bench_supervisor.py --hosts 4 --idle-transports 64 --window 15
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_fanout import LAUNCH, PYSPY, cluster_yaml, load_avg, prepare_work  # noqa: E402

from launcher.metrics.record import ProcessSample  # noqa: E402
from launcher.store.db import Store  # noqa: E402
from launcher.store.records import Batch  # noqa: E402
from tools import testbed  # noqa: E402

NAMES = testbed.Names("sv-", "10.85.0")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TICKER = """import os, sys, time
from launcher.metrics import Reporter
duration, rank = float(sys.argv[1]), os.environ.get("RANK")
reporter = Reporter(every=1, warmup=0)
start, i = time.monotonic(), 0
while time.monotonic() - start < duration:
    i += 1
    print(f"rank {rank} step {i}: the program's own line, as training scripts print them", flush=True)
    reporter.step(samples=32, tokens=4096, loss=1.0 / i)
    time.sleep(max(0.0, start + i - time.monotonic()))
reporter.close()
"""


def cpu_s(pid: int) -> float | None:
    """utime + stime of ``pid`` (every thread), seconds; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def thread_cpu(pid: int) -> dict[int, float]:
    """utime + stime of each thread of ``pid``, seconds."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


_THREAD = re.compile(r'^Thread (\d+) \(([^)]*)\): "(.*)"$')


def threads_by_role(pid: int, used: dict[int, float], seconds: float) -> list[str]:
    """The window's CPU by what each thread is (one ``py-spy dump``: its name and the frames that say what it runs,
    its innermost launcher/ and paramiko/ functions), as lines. py-spy ``record`` of this 129-thread process at
    the bed's load never came back (it falls behind and writes nothing when stopped), so this is the profile."""
    try:
        dump = subprocess.run([PYSPY, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True,
                              timeout=120).stdout
    except subprocess.TimeoutExpired:
        dump = ""
    role: dict[int, str] = {}
    tid: int | None = None
    frames: list[str] = []

    def close() -> None:
        if tid is not None:
            ours = [f.split(" (")[0] for f in frames if "launcher/" in f or "<launch node" in f]
            theirs = [f.split(" (")[0] for f in frames if "paramiko/" in f]
            role[tid] = f"{name}: " + " <- ".join((ours[:1] + ours[-1:]) if ours else theirs[-1:] or ["?"])

    name = ""
    for line in dump.splitlines():
        if match := _THREAD.match(line):
            close()
            tid, name, frames = int(match.group(1)), re.sub(r"\d+", "N", match.group(3)), []
        elif tid is not None and line.startswith("    "):
            frames.append(line.strip())
    close()
    by_role: dict[str, list[float]] = {}
    for thread, cpu in used.items():
        by_role.setdefault(role.get(thread, "(not in the dump)"), []).append(cpu)
    rows = sorted(by_role.items(), key=lambda item: -sum(item[1]))
    return [f"{sum(c):6.2f} s = {sum(c) / seconds:5.1%} of a core, {len(c):3d} thread(s): {r}" for r, c in rows]


def parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + system) and exit code of one run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, done.returncode


def time_status(job_id: str, env: dict[str, str], rounds: int) -> dict:
    """Medians of ``rounds`` interleaved runs of each command (ms), with `launch --help` as the reference: wall time,
    and CPU time (user + system), which a loaded machine stretches less."""
    commands = {"--help": [LAUNCH, "--help"], "status": [LAUNCH, "status"], "status JOB": [LAUNCH, "status", job_id],
                "status --json JOB": [LAUNCH, "status", "--json", job_id]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    cpu: dict[str, list[float]] = {name: [] for name in commands}
    codes: dict[str, int] = {}
    for _ in range(rounds):
        for name, argv in commands.items():
            seconds, used, codes[name] = timed(argv, env)
            times[name].append(seconds)
            cpu[name].append(used)
    return {"ms": {name: round(median(t) * 1000, 1) for name, t in times.items()},
            "cpu_ms": {name: round(median(t) * 1000, 1) for name, t in cpu.items()},
            "all_ms": {name: [round(x * 1000) for x in t] for name, t in times.items()},
            "codes": codes, "load": load_avg()}


def wait_for(predicate, timeout: float, interval: float = 0.5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := predicate():
            return value
        time.sleep(interval)
    return None


def follow_job(bed: testbed.Testbed, work: Path, args: argparse.Namespace) -> dict:
    home = work / "home"
    env = {**os.environ, "LAUNCH_HOME": str(home)}
    n = len(bed.hosts)
    job = work / "ticker.yaml"
    job.write_text(f"name: ticker{n}\nentrypoint: [python, {work / 'ticker.py'}, '{args.duration}']\n"
                   f"resources: {{nodes: {n}, nproc_per_node: 1}}\nwatch: {{stall_timeout: 900}}\n"
                   f"env: {{PYTHONPATH: '{work / 'fake'}:{ROOT}'}}\n")
    t0 = time.time()
    done = subprocess.run([LAUNCH, "submit", str(job), "--cluster", str(cluster_yaml(bed, n, work, None, 32)),
                           "--detach"], env=env, capture_output=True, text=True, timeout=300)
    out: dict = {"n": n, "submit_code": done.returncode, "submit_s": time.time() - t0}
    if done.returncode != 0:
        out["error"] = (done.stderr or done.stdout).strip()[-800:]
        return out
    job_id = out["job"] = done.stdout.strip().splitlines()[-1]
    store = Store(home)

    def supervising() -> int | None:
        row = store.job(job_id)
        pid = row.supervisor_pid
        if row.state == "RUNNING" and pid and b"--supervise" in _cmdline(pid):
            return pid
        return None

    pid = wait_for(supervising, 300)
    if pid is None:
        out["error"] = f"no RUNNING job with a --supervise supervisor after 300 s: {store.job(job_id).state}"
        return out
    keeper = parent(pid)
    out |= {"supervisor_pid": pid, "keeper_pid": keeper, "to_running_s": time.time() - t0}

    def every_rank_reports() -> bool:
        ranks = store._query("SELECT count(DISTINCT rank) FROM metrics WHERE job_id = ?", (job_id,))[0][0]
        return ranks >= n

    wait_for(every_rank_reports, 120)
    time.sleep(args.settle)
    out["to_every_rank_reporting_s"] = time.time() - t0
    count0 = store._query("SELECT count(*) FROM metrics WHERE job_id = ?", (job_id,))[0][0]
    c0, k0, w0, t0s = cpu_s(pid), cpu_s(keeper) if keeper else None, time.monotonic(), thread_cpu(pid)
    rss: list[float] = []
    load_during: list[str] = []
    while time.monotonic() - w0 < args.window:
        rss.append(rss_mib(pid) or 0.0)
        load_during.append(load_avg())
        time.sleep(min(5.0, max(0.0, args.window - (time.monotonic() - w0))))
    c1, k1, w1, t1s = cpu_s(pid), cpu_s(keeper) if keeper else None, time.monotonic(), thread_cpu(pid)
    count1 = store._query("SELECT count(*) FROM metrics WHERE job_id = ?", (job_id,))[0][0]
    lines = sum(1 for _ in open(next(iter(sorted(store.run_dir(job_id).glob("attempt0-node0.log"))), os.devnull)))
    if c0 is None or c1 is None:
        out["error"] = "the supervisor ended during the window"
        return out
    out |= {"window_s": w1 - w0, "supervisor_cpu_s": c1 - c0, "cpu_fraction_of_a_core": (c1 - c0) / (w1 - w0),
            "keeper_cpu_s": (k1 - k0) if k0 is not None and k1 is not None else None,
            "rss_mib": rss, "rss_end_mib": rss_mib(pid), "threads": threads(pid),
            "records_in_window": count1 - count0, "records_per_s": (count1 - count0) / (w1 - w0),
            "node0_log_lines": lines, "load_during": load_during}
    out["by_thread"] = threads_by_role(pid, {tid: t1s[tid] - t0s.get(tid, 0.0) for tid in t1s}, w1 - w0)
    print(json.dumps(out), flush=True)
    if args.profile:
        profile = work.parent / "bench-supervisor-profile.txt"
        p0 = cpu_s(pid)
        spy = subprocess.Popen([PYSPY, "record", "--pid", str(pid), "--rate", "50", "--format", "raw",
                                "--nonblocking", "--duration", str(int(args.profile_s)), "--output", str(profile)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            spy.wait(args.profile_s + 60)
        except subprocess.TimeoutExpired:
            spy.terminate()  # py-spy writes what it has on SIGTERM... or not: then the profile is left out
            try:
                spy.wait(10)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()
        out["profile"] = {"file": str(profile), "cpu_s": (cpu_s(pid) or 0) - (p0 or 0), "s": args.profile_s,
                          "top": top_frames(profile)}
    out["status_running"] = time_status(job_id, env, args.rounds)
    wait_for(lambda: store.job(job_id).state in ("SUCCEEDED", "FAILED", "CANCELLED"), args.duration + 120, 1.0)
    row = store.job(job_id)
    out |= {"state": row.state, "reason": row.reason, "total_s": time.time() - t0,
            "records": store._query("SELECT count(*) FROM metrics WHERE job_id = ?", (job_id,))[0][0]}
    out["status_ended"] = time_status(job_id, env, args.rounds)
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def top_frames(path: Path, count: int = 15) -> list[str]:
    """py-spy raw samples by leaf function and by the innermost launcher/ frame."""
    leaves: dict[str, int] = {}
    ours: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines() if path.exists() else []:
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = [f for f in stack.split(";") if not f.startswith(("thread (", "process "))]
        if not frames:
            continue
        total += int(n)
        leaves[frames[-1]] = leaves.get(frames[-1], 0) + int(n)
        own = next((f for f in reversed(frames) if "launcher/" in f), "(no launcher frame)")
        ours[own] = ours.get(own, 0) + int(n)
    rows = [f"{total} samples on CPU (50 Hz)"]
    rows += [f"  leaf {c:5d}  {f[:120]}" for f, c in sorted(leaves.items(), key=lambda i: -i[1])[:count]]
    rows += [f"  ours {c:5d}  {f[:120]}" for f, c in sorted(ours.items(), key=lambda i: -i[1])[:count]]
    return rows


def thousand_ranks(home: Path, source: str, nodes: int = 125, per_node: int = 8, steps: int = 50) -> str:
    """A 1,000-rank job written through the store's API from the real job ``source``: its id."""
    from launcher.plan.planner import Plan

    store = Store(home)
    row = store.job(source)
    plan = Plan.model_validate(row.plan)
    job_id = f"ranks{nodes * per_node}-{os.urandom(4).hex()}"
    template = plan.nodes[0]
    plan_nodes = tuple(template.model_copy(update={"index": i, "host": f"node{i + 1}", "address": f"10.0.{i // 250}.{i % 250}",
                                                   "nproc": per_node, "first_rank": i * per_node})
                       for i in range(nodes))
    plan = plan.model_copy(update={"job_id": job_id, "job_name": f"ranks{nodes * per_node}", "nnodes": nodes,
                                   "nproc_per_node": per_node, "world_size": nodes * per_node, "nodes": plan_nodes})
    spec = row.spec
    spec["job"]["resources"] = {**spec["job"].get("resources", {}), "nodes": nodes, "nproc_per_node": per_node}
    store.create_job(plan, spec)
    store.transition(job_id, "LAUNCHING", attempt=0)
    for i in range(nodes):
        store.set_node(job_id, 0, i, state="RUNNING", host=f"node{i + 1}", started_at=time.time())
    store.transition(job_id, "RUNNING")
    for event in store.events(row.id):
        store.add_event(job_id, event["kind"], event["message"], event["data"])
    records = [r for r in store.metrics(row.id) if r.rank == 0]
    t = time.time() - steps
    for step in range(1, steps + 1):
        base = records[(step - 1) % len(records)]
        store.add_batch(job_id, 0, Batch(records=[dataclasses.replace(base, job=job_id, rank=r, node=r // per_node, local_rank=r % per_node,
                                                          host=f"node{r // per_node + 1}", step=step, t=t + step)
                                      for r in range(nodes * per_node)]))
    usage = store.samples(row.id)[0]
    store.add_batch(job_id, 0, Batch(samples=[ProcessSample(node=r // per_node, rank=r, host=f"node{r // per_node + 1}", t=time.time(),
                                                pid=1000 + r, cpu_s=usage.cpu_s or 1.0, rss_bytes=usage.rss_bytes or 1,
                                                rss_peak_bytes=usage.rss_peak_bytes or 1)
                                  for r in range(nodes * per_node)]))
    return job_id


def end_thousand(home: Path, job_id: str) -> float:
    """End the 1,000-rank job as a supervisor's finish does (summary from the records, then SUCCEEDED); seconds."""
    from launcher.metrics.aggregate import summarize

    store = Store(home)
    t = time.perf_counter()
    summary = summarize(store.metrics(job_id), store.samples(job_id))
    store.transition(job_id, "SUCCEEDED", reason="finished", summary=summary)
    for i in range(int(store.job(job_id).nnodes)):
        store.set_node(job_id, 0, i, state="EXITED", exit_code=0, ended_at=time.time())
    return time.perf_counter() - t


def bring_down(bed: testbed.Testbed, names: testbed.Names = NAMES, tries: int = 4) -> None:
    """``testbed.down``, again while processes outlive its wait for SIGKILL (seconds, at a load of 100 here)."""
    for attempt in range(tries):
        try:
            testbed.down(bed.base_dir, names)
            return
        except testbed.TestbedError as exc:
            print(f"bed: down, try {attempt + 1}: {exc}"[:300], flush=True)
            time.sleep(2.0)
    testbed.down(bed.base_dir, names)


def idle_transports(bed: testbed.Testbed, count: int, seconds: float) -> list[str]:
    """CPU of this process holding ``count`` idle paramiko transports to the bed's hosts (nothing sent on them), by
    how paramiko is set: its own socket poll (every 0.1 s, to notice a close) and launch's keepalive (every 1 s,
    ``connection.KEEPALIVE_S``). What a supervisor pays per node before a single line arrives."""
    import paramiko

    from launcher.backends.ssh.connection import KEEPALIVE_S

    clients = []
    for i in range(count):
        host = bed.hosts[i % len(bed.hosts)]
        client = paramiko.SSHClient()
        client.load_host_keys(str(bed.known_hosts))
        client.connect(host.address, username="root", key_filename=str(bed.key_file), allow_agent=False,
                       look_for_keys=False, timeout=30)
        clients.append(client)
    transports = [c.get_transport() for c in clients]
    rows = []
    for label, poll, keepalive in (("paramiko's poll 0.1 s, keepalive 1 s (as launch runs)", 0.1, KEEPALIVE_S),
                                   ("poll 0.1 s, no keepalive", 0.1, 0),
                                   ("poll 1 s, keepalive 1 s", 1.0, KEEPALIVE_S),
                                   ("poll 1 s, no keepalive", 1.0, 0)):
        for t in transports:
            t.sock.settimeout(poll)
            t.set_keepalive(keepalive)
        time.sleep(2.0)
        c0, t0 = cpu_s(os.getpid()) or 0.0, time.monotonic()
        time.sleep(seconds)
        used, elapsed = (cpu_s(os.getpid()) or 0.0) - c0, time.monotonic() - t0
        rows.append(f"{count} idle transports, {label}: {used:.2f} s CPU in {elapsed:.0f} s = {used / elapsed:.1%} "
                    f"of a core, {used / elapsed / count * 1000:.2f} ms a second a transport (load {load_avg()})")
        print(rows[-1], flush=True)
    for c in clients:
        c.close()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=64)
    parser.add_argument("--duration", type=float, default=170.0, help="seconds each rank ticks (outlasting "
                        "the window and the status timings)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds after every rank reported, before the window")
    parser.add_argument("--window", type=float, default=60.0, help="seconds the supervisor is measured")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each status command")
    parser.add_argument("--profile", action="store_true", help="then py-spy the supervisor for --profile-s")
    parser.add_argument("--profile-s", type=float, default=20.0)
    parser.add_argument("--work", default="/tmp/bench-supervisor")
    parser.add_argument("--idle-transports", type=int, default=0,
                        help="only measure N idle paramiko transports to the bed's hosts (--window s each setting)")
    args = parser.parse_args()
    work = Path(args.work)
    prepare_work(work)
    (work / "ticker.py").write_text(TICKER)
    results: dict = {"load_before": load_avg(), "cores": os.cpu_count()}
    t = time.perf_counter()
    bed = testbed.up(args.hosts, work / "bed", NAMES)
    results["up_s"] = time.perf_counter() - t
    print(f"bed: {args.hosts} hosts up in {results['up_s']:.2f} s (load {load_avg()})", flush=True)
    try:
        if args.idle_transports:
            results["idle_transports"] = idle_transports(bed, args.idle_transports, args.window)
            return 0
        results["follow"] = follow_job(bed, work, args)
        print(json.dumps(results["follow"]), flush=True)
    finally:
        t = time.perf_counter()
        bring_down(bed)
        results["down_s"] = time.perf_counter() - t
        listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        results["namespaces_left"] = [line.split()[0] for line in listing.splitlines() if line.startswith(NAMES.prefix)]
        print(f"bed: down in {results['down_s']:.2f} s; {NAMES.prefix} namespaces left: {results['namespaces_left']}",
              flush=True)
        (work.parent / "bench-supervisor.json").write_text(json.dumps(results, indent=1))
    follow = results["follow"]
    if "job" in follow and "error" not in follow:
        env = {**os.environ, "LAUNCH_HOME": str(work / "home")}
        t = time.perf_counter()
        big = thousand_ranks(work / "home", follow["job"])
        results["thousand"] = {"job": big, "write_s": time.perf_counter() - t,
                               "status_running": time_status(big, env, args.rounds)}
        results["thousand"]["finish_s"] = end_thousand(work / "home", big)
        results["thousand"]["status_ended"] = time_status(big, env, args.rounds)
        print(json.dumps(results["thousand"]), flush=True)
    results["load_after"] = load_avg()
    (work.parent / "bench-supervisor.json").write_text(json.dumps(results, indent=1))
    summarise(results)
    return 0


def summarise(results: dict) -> None:
    print(f"\nload {results['load_before']} -> {results['load_after']} on {results['cores']} cores; "
          f"bed up {results['up_s']:.2f} s, down {results['down_s']:.2f} s")
    f = results["follow"]
    if "error" in f:
        print(f"follow: {f['error']}")
        return
    print(f"supervisor following {f['n']} nodes x 1 rank ({f['records_per_s']:.1f} records/s stored): "
          f"{f['supervisor_cpu_s']:.2f} s CPU in {f['window_s']:.1f} s = {f['cpu_fraction_of_a_core']:.1%} of a core "
          f"(keeper {f['keeper_cpu_s']} s); RSS {min(f['rss_mib']):.0f}-{max(f['rss_mib']):.0f} MiB over the window, "
          f"{f['threads']} threads; job {f['state']} in {f['total_s']:.0f} s")
    for label, timing in (("64-node job, running", f["status_running"]), ("64-node job, ended", f["status_ended"]),
                          ("1,000-rank job, running", results.get("thousand", {}).get("status_running")),
                          ("1,000-rank job, ended", results.get("thousand", {}).get("status_ended"))):
        if timing:
            ms = timing["ms"]
            print(f"  {label:24} " + "  ".join(f"{name} {value:.0f} ms" for name, value in ms.items())
                  + f"  (load {timing['load']})")
    for row in f.get("by_thread", []):
        print("  " + row)
    for row in f.get("profile", {}).get("top", []):
        print(row)


if __name__ == "__main__":
    sys.exit(main())
