#!/usr/bin/env python3
"""Fan-out to 1, 8 and 64 namespaced hosts: launch against pdsh (OpenSSH) on the same hosts, in one run.

Needs root, pdsh (``scripts/setup.sh --test``) and the venv. Brings up its own test bed (prefix ``fb-``,
bridge ``fb-br0``, subnet 10.79.0: it never touches the suite's ``lt-`` bed) and tears it down by PID.

For each size, with and without added latency:
  (a) ``launch submit`` of a trivial job (each rank prints one line): end to end, and per phase from the
      job's store (CLI start and plan, preflight, start of every node agent, ranks' lines, exit);
  (b) ``pdsh -R ssh -f FANOUT`` running the node's Python to print one line on every host.
The figure compared is launch's time to "every node agent started" (preflight + start) against pdsh's
whole run (connect, start the node's Python, print): both include their own process start.

Latency: this machine's kernel has no ``sch_netem`` (``tc ... netem`` fails with "Specified qdisc kind is
unknown"), so the delay is a forwarding proxy in the root namespace that holds every chunk of the SSH
stream ``--delay-ms`` each way (``tools/testbed.set_delay`` does it with netem where the kernel has it).
Both tools then connect through the proxy (a per-host port on 127.0.0.1, host keys filed under it).

    sudo .venv/bin/python scripts/bench_fanout.py [--sizes 1,8,64] [--rounds 3] [--delay-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools import testbed  # noqa: E402

PYTHON = str(ROOT / ".venv" / "bin" / "python")
LAUNCH = str(ROOT / ".venv" / "bin" / "launch")
PYSPY = str(ROOT / ".venv" / "bin" / "py-spy")
PROFILE_RATE = 250
# Where the submitting side's CPU goes: the first of these (file fragment, function fragment) found from a sampled
# stack's leaf towards its root names the sample's phase.
PHASES = (
    ("host key check", "launcher/backends/ssh/hostkeys.py", "check_host_key"),
    ("known_hosts parse", "launcher/backends/ssh/hostkeys.py", "load_known_hosts"),
    ("key exchange (client)", "paramiko/", "kex"),
    ("key exchange (client)", "paramiko/transport.py", "_negotiate_keys"),
    ("key exchange (client)", "paramiko/transport.py", "_activate_"),
    ("key exchange (client)", "paramiko/transport.py", "_verify_key"),
    ("authentication (sign)", "paramiko/auth_handler.py", ""),
    ("authentication (sign)", "paramiko/ed25519key.py", ""),
    ("ssh packets (cipher, mac)", "paramiko/packet.py", ""),
    ("ssh transport (other)", "paramiko/", ""),
    ("imports", "<frozen importlib", ""),
    ("preflight (facts, checks)", "launcher/", "preflight"),
    ("start (agents)", "launcher/", "start"),
    ("watch (supervisor, store)", "launcher/run/", ""),
    ("store", "launcher/store/", ""),
)
NAMES = testbed.Names("fb-", "10.79.0")
PROXY_PORT0 = 30000
# --light: a stand-in for ``python -m torch.distributed.run`` that starts the ranks without importing torch
# (the job's PYTHONPATH puts it first). On this bed every host shares the same 2 cores, so 64 real torchruns
# importing torch (~3 s of CPU each) slow the start of the hosts still waiting for theirs: the stand-in
# keeps the measurement on launch's own fan-out. Real torchrun runs with the default. With ``--tee`` (as launch
# plans it) each rank's lines come out behind ``[RANK]: ``, as torchrun's tee writes them (metric records need it).
FAKE_RUN = """import os, subprocess, sys, threading
args, i, opts = sys.argv[1:], 0, {}
while i < len(args) and args[i].startswith("--"):
    if args[i] in ("--no-python",):
        opts[args[i]] = True; i += 1
    else:
        opts[args[i]] = args[i + 1]; i += 2
nproc, node = int(opts.get("--nproc-per-node", 1)), int(opts.get("--node-rank", 0))
world, tee, lock = int(opts.get("--nnodes", 1)) * nproc, "--tee" in opts, threading.Lock()
def relay(stream, rank):
    for line in stream:
        with lock:
            sys.stdout.buffer.write(b"[%d]: " % rank + line); sys.stdout.buffer.flush()
procs = [subprocess.Popen([sys.executable, "-u", *args[i:]], env={**os.environ, "RANK": str(node * nproc + r),
         "LOCAL_RANK": str(r), "WORLD_SIZE": str(world)}, stdout=subprocess.PIPE if tee else None,
         stderr=subprocess.STDOUT if tee else None) for r in range(nproc)]
relays = [threading.Thread(target=relay, args=(p.stdout, node * nproc + r)) for r, p in enumerate(procs) if tee]
for t in relays: t.start()
code = max(p.wait() for p in procs)
for t in relays: t.join()
sys.exit(code)
"""
HELLO = "import os, socket; print('hello from rank', os.environ.get('RANK'), 'on', socket.gethostname(), flush=True)\n"


# ---------------------------------------------------------------- the latency proxy (its own process)

async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy reader to writer, each chunk held ``delay`` seconds (order kept)."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, chunk = await queue.get()
            if not chunk:
                break
            if (wait := due - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()
        writer.close()

    sender = asyncio.create_task(send())
    try:
        while chunk := await reader.read(65536):
            queue.put_nowait((time.monotonic() + delay, chunk))
    finally:
        queue.put_nowait((0.0, b""))
        await sender


async def _serve(targets: list[str], delay: float) -> None:
    async def handler(address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(address, 22)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_writer, delay), _pump(up_reader, writer, delay),
                             return_exceptions=True)

    servers = [await asyncio.start_server(lambda r, w, a=address: handler(a, r, w), "127.0.0.1", PROXY_PORT0 + i,
                                          backlog=256)
               for i, address in enumerate(targets, 1)]
    print("ready", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


def start_proxy(bed: testbed.Testbed, delay_ms: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve-proxy", str(delay_ms),
                             *[h.address for h in bed.hosts]], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def proxied_files(bed: testbed.Testbed, work: Path) -> tuple[Path, Path]:
    """An ssh_config and a known_hosts that reach every host through the proxy."""
    config, known = work / "ssh_config_delayed", work / "known_hosts_delayed"
    blocks, lines = [], []
    for i, h in enumerate(bed.hosts, 1):
        blocks.append(f"Host {h.name}\n    HostName 127.0.0.1\n    Port {PROXY_PORT0 + i}\n    User root\n"
                      f"    IdentityFile {bed.key_file}\n    IdentitiesOnly yes\n    UserKnownHostsFile {known}\n"
                      "    StrictHostKeyChecking yes\n    BatchMode yes\n")
        lines.append(f"[127.0.0.1]:{PROXY_PORT0 + i} {(h.host_key.with_suffix('.pub')).read_text().split()[0]} "
                     f"{(h.host_key.with_suffix('.pub')).read_text().split()[1]}")
    config.write_text("\n".join(blocks))
    known.write_text("\n".join(lines) + "\n")
    return config, known


# ---------------------------------------------------------------- one measurement each

def cluster_yaml(bed: testbed.Testbed, n: int, work: Path, delayed: tuple[Path, Path] | None, fanout: int) -> Path:
    config, known = delayed or (bed.ssh_config, bed.known_hosts)
    lines = ["name: bench", "backend: ssh",
             f"ssh: {{user: root, key_file: {bed.key_file}, known_hosts: {known}, config_file: {config}}}",
             "nodes:", *(f"  - {{host: {h.name}, address: {h.address}, gpus: 0}}" for h in bed.hosts[:n]),
             f"python: {PYTHON}", f"workdir: {work}"]
    del fanout  # the cap is the cluster spec's ssh.fanout once the backend passes it (docs/BENCHMARKS.md)
    path = work / f"cluster-{n}-{'d' if delayed else 'n'}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def node_cpu(bed: testbed.Testbed) -> float:
    """CPU seconds the hosts spent in what their sshd listeners reaped: every SSH session's processes (the
    per-connection sshd, the node's Python, the agent and what it started), once they have exited."""
    total = 0
    for host in bed.hosts:
        pid = testbed.sshd_pid(host)
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, TypeError):
            continue
        total += int(fields[13]) + int(fields[14])  # cutime, cstime: reaped children, in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_launch(n: int, cluster: Path, work: Path, profile: Path | None = None, light: bool = False) -> dict:
    """``launch submit`` of the trivial job on the first ``n`` hosts (under py-spy into ``profile``)."""
    job = work / f"job-{n}.yaml"
    env_line = f"env: {{PYTHONPATH: {work / 'fake'}}}\n" if light else ""
    job.write_text(f"name: hello{n}\nentrypoint: [python, {work / 'hello.py'}]\n"
                   f"resources: {{nodes: {n}, nproc_per_node: 1}}\nwatch: {{stall_timeout: 300}}\n{env_line}")
    home = work / "home"
    env = {**os.environ, "LAUNCH_HOME": str(home)}
    argv = [LAUNCH, "submit", str(job), "--cluster", str(cluster)]
    if profile is not None:
        argv = [PYSPY, "record", "--rate", str(PROFILE_RATE), "--format", "raw", "--threads", "--nonblocking",
                "--output", str(profile), "--", PYTHON, *argv]
    cpu0, t0 = child_cpu(), time.time()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[tuple[float, str]] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.time(), line.rstrip()))
    code = proc.wait()
    t_end, cpu = time.time(), child_cpu() - cpu0
    hello = [t for t, line in lines if "hello from rank" in line]
    job_id = next((line.split()[1].rstrip(":") for _, line in lines if line.startswith("job ")), None)
    status = json.loads(subprocess.run([LAUNCH, "status", job_id, "--json"], env=env, capture_output=True,
                                       text=True).stdout or "{}") if job_id else {}
    events = {e["kind"]: e["t"] for e in status.get("events", [])}
    out = {"n": n, "code": code, "state": status.get("state"), "lines": len(hello), "total_s": t_end - t0,
           "cpu_s": cpu, "tail": [line for _, line in lines[-3:]]}
    if "created_at" in status and "launching" in events and "running" in events:
        # created_at is stored after preflight: CLI start and imports, load, plan, connect, probe, version check
        out |= {"to_preflight_done_s": status["created_at"] - t0, "record_s": events["launching"] - status["created_at"],
                "start_s": events["running"] - events["launching"], "to_started_s": events["running"] - t0}
    if hello:
        out |= {"first_line_s": min(hello) - t0, "last_line_s": max(hello) - t0}
    return out


def run_pdsh(bed: testbed.Testbed, n: int, config: Path, fanout: int) -> dict:
    env = {**os.environ, "PDSH_SSH_ARGS_APPEND": f"-F {config}"}
    names = ",".join(h.name for h in bed.hosts[:n])
    argv = ["pdsh", "-R", "ssh", "-f", str(fanout), "-l", "root", "-w", names,
            f"{PYTHON} -c \"import socket; print('hello from', socket.gethostname())\""]
    cpu0, t0 = child_cpu(), time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    return {"n": n, "code": done.returncode, "total_s": time.time() - t0, "cpu_s": child_cpu() - cpu0,
            "lines": done.stdout.count("hello from"), "err": done.stderr.strip()[-300:]}


def run_rendezvous(bed: testbed.Testbed, n: int, backend: str, port: int, work: Path, timeout: float) -> dict:
    """Bare torchrun on the first ``n`` hosts, started by pdsh, with ``backend`` rendezvous: the time until every
    node's rank printed its line and torchrun exited. What a timed-out run left is killed by PID afterwards."""
    master = bed.hosts[0]
    flags = {"static": f"--rdzv-backend static --master-addr {master.address} --master-port {port}",
             "c10d": f"--rdzv-backend c10d --rdzv-endpoint {master.address}:{port} --local-addr $(hostname)"}[backend]
    command = (f"OMP_NUM_THREADS=1 {PYTHON} -m torch.distributed.run --nnodes {n} --nproc-per-node 1 "
               f"--node-rank $(( $(hostname | tr -dc 0-9) - 1 )) {flags} --rdzv-id bench{port} --max-restarts 0 "
               f"--monitor-interval 0.5 {work / 'hello.py'}")
    env = {**os.environ, "PDSH_SSH_ARGS_APPEND": f"-F {bed.ssh_config}"}
    names = ",".join(h.name for h in bed.hosts[:n])
    t0 = time.time()
    try:
        done = subprocess.run(["pdsh", "-R", "ssh", "-f", str(max(n, 32)), "-l", "root", "-w", names, command],
                              env=env, capture_output=True, text=True, timeout=timeout)
        out, code = done.stdout, done.returncode
    except subprocess.TimeoutExpired as exc:
        out, code = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or ""), None
    elapsed = time.time() - t0
    left = 0
    for host in bed.hosts[:n]:
        for pid in testbed.pids(host):
            left += 1
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return {"n": n, "backend": backend, "code": code, "total_s": elapsed, "lines": out.count("hello from rank"),
            "killed_after": left}


def prepare_work(work: Path) -> None:
    """A fresh ``work``: the ranks' ``hello.py`` and the torchrun stand-in of ``--light`` (under ``work/fake``)."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "hello.py").write_text(HELLO)
    fake = work / "fake" / "torch" / "distributed"
    fake.mkdir(parents=True)
    for package in (fake.parent, fake):
        (package / "__init__.py").write_text("")
    (fake / "run.py").write_text(FAKE_RUN)


def load_avg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def profile_summary(path: Path, n: int) -> list[str]:
    """py-spy's raw samples of the launch process (every thread) by phase (PHASES) and by leaf function."""
    phases: dict[str, int] = {}
    leaves: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if not f.startswith(("thread (", "process "))]
        if not frames:
            continue  # a thread sampled outside Python code (waiting in C): not this process's Python work
        total += count
        phase = next((name for frame in reversed(frames) for name, where, func in PHASES
                      if where in frame and func in frame.split(" (")[0]), None)
        if phase is None:
            module = next((f.split("(")[-1].split(":")[0] for f in reversed(frames) if "launcher/" in f), None)
            phase = f"launch: {module}" if module else "other"
        phases[phase] = phases.get(phase, 0) + count
        leaf = frames[-1] if frames else "?"
        leaves[leaf] = leaves.get(leaf, 0) + count
    seconds = 1.0 / PROFILE_RATE
    rows = [f"sampled on-CPU {total * seconds:.2f} s over {n} hosts = {total * seconds / n * 1000:.0f} ms a host"]
    rows += [f"  {name:28} {c * seconds:6.2f} s  {c * seconds / n * 1000:6.1f} ms/host  {c / total:5.1%}"
             for name, c in sorted(phases.items(), key=lambda item: -item[1])]
    rows += ["  top leaf functions:"]
    rows += [f"    {c * seconds:6.2f} s  {leaf[:110]}" for leaf, c in sorted(leaves.items(), key=lambda i: -i[1])[:12]]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,8,64")
    parser.add_argument("--rounds", type=int, default=3, help="rounds at sizes below 64 (64: --rounds-64)")
    parser.add_argument("--rounds-64", type=int, default=1)
    parser.add_argument("--delay-ms", type=float, default=10.0)
    parser.add_argument("--fanout", type=int, default=32, help="pdsh -f (launch's default cap is 32 too)")
    parser.add_argument("--work", default="/tmp/bench-fanout")
    parser.add_argument("--profile", action="store_true", help="also run launch at the largest size under cProfile")
    parser.add_argument("--light", action="store_true", help="a torchrun stand-in that does not import torch")
    parser.add_argument("--rendezvous-sizes", default="", help="also time bare torchrun (pdsh), static vs c10d")
    parser.add_argument("--rendezvous-timeout", type=float, default=240.0)
    parser.add_argument("--serve-proxy", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_proxy:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        asyncio.run(_serve(args.serve_proxy[1:], float(args.serve_proxy[0]) / 1000))
        return 0
    if shutil.which("pdsh") is None:
        print("pdsh not found: scripts/setup.sh --test installs it", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",") if s]
    rdzv_sizes = [int(s) for s in args.rendezvous_sizes.split(",") if s]
    work = Path(args.work)
    prepare_work(work)
    results: dict = {"load_before": load_avg(), "cores": os.cpu_count(), "rows": [], "light": args.light}
    t = time.perf_counter()
    hosts = max(sizes + rdzv_sizes)
    bed = testbed.up(hosts, work / "bed", NAMES)
    results["up_s"] = time.perf_counter() - t
    print(f"bed: {hosts} hosts up in {results['up_s']:.2f} s (load {load_avg()})", flush=True)
    proxy = None
    try:
        proxy = start_proxy(bed, args.delay_ms)
        delayed = proxied_files(bed, work)
        for label, files in (("none", None), (f"{args.delay_ms:g} ms each way", delayed)):
            config = files[0] if files else bed.ssh_config
            for n in sizes:
                cluster = cluster_yaml(bed, n, work, files, args.fanout)
                for _ in range(args.rounds_64 if n >= 64 else args.rounds):
                    before = node_cpu(bed)
                    a = run_launch(n, cluster, work, light=args.light)
                    time.sleep(1.0)  # the sessions' sshd processes exit and are reaped
                    middle = node_cpu(bed)
                    b = run_pdsh(bed, n, config, args.fanout)
                    time.sleep(1.0)
                    a["node_cpu_s"], b["node_cpu_s"] = middle - before, node_cpu(bed) - middle
                    row = {"delay": label, "n": n, "launch": a, "pdsh": b, "load": load_avg()}
                    results["rows"].append(row)
                    print(json.dumps(row), flush=True)
        if args.profile:
            n = max(sizes)
            prof = work.parent / "bench-fanout-profile.txt"
            a = run_launch(n, cluster_yaml(bed, n, work, None, args.fanout), work, profile=prof, light=args.light)
            results["profile"] = {"run": a, "top": profile_summary(prof, n)}
            print("\n".join(results["profile"]["top"]), flush=True)
        for i, n in enumerate(rdzv_sizes):
            for j, backend in enumerate(("static", "c10d")):
                row = run_rendezvous(bed, n, backend, 29600 + 2 * i + j, work, args.rendezvous_timeout)
                row["load"] = load_avg()
                results.setdefault("rendezvous", []).append(row)
                print(json.dumps(row), flush=True)
    finally:
        if proxy is not None:
            proxy.send_signal(signal.SIGTERM)
            proxy.wait(5)
        t = time.perf_counter()
        testbed.down(bed.base_dir, NAMES)
        results["down_s"] = time.perf_counter() - t
        results["load_after"] = load_avg()
        (work.parent / "bench-fanout.json").write_text(json.dumps(results, indent=1))
        print(f"bed: down in {results['down_s']:.2f} s", flush=True)
    summarise(results)
    return 0


def summarise(results: dict) -> None:
    print(f"\nload {results['load_before']} -> {results['load_after']} on {results['cores']} cores; "
          f"bed up {results['up_s']:.2f} s, down {results['down_s']:.2f} s")
    print(f"{'delay':>16} {'hosts':>5} {'launch to started':>18} {'pdsh':>7} {'ratio':>6} {'launch end':>10} "
          f"{'launch cpu/host':>15} {'pdsh cpu/host':>13} {'node cpu/host launch, pdsh':>27}")
    groups: dict[tuple[str, int], list[dict]] = {}
    for row in results["rows"]:
        groups.setdefault((row["delay"], row["n"]), []).append(row)
    for row in results.get("rendezvous", []):
        print(f"bare torchrun by pdsh, {row['n']:>3} hosts, {row['backend']:>6} rendezvous: {row['total_s']:6.1f} s, "
              f"{row['lines']} of {row['n']} ranks printed (exit {row['code']}; killed after: {row['killed_after']})")
    for (delay, n), rows in groups.items():
        started = median(r["launch"].get("to_started_s", float("nan")) for r in rows)
        pdsh = median(r["pdsh"]["total_s"] for r in rows)
        end = median(r["launch"]["total_s"] for r in rows)
        lcpu = median(r["launch"]["cpu_s"] for r in rows) / n
        pcpu = median(r["pdsh"]["cpu_s"] for r in rows) / n
        lnode = median(r["launch"].get("node_cpu_s", float("nan")) for r in rows) / n
        pnode = median(r["pdsh"].get("node_cpu_s", float("nan")) for r in rows) / n
        print(f"{delay:>16} {n:>5} {started:>16.2f} s {pdsh:>5.2f} s {started / pdsh:>5.2f}x {end:>8.2f} s "
              f"{lcpu:>13.3f} s {pcpu:>11.3f} s {lnode:>14.3f} s, {pnode:.3f} s")


if __name__ == "__main__":
    threading.stack_size(1 << 20)
    sys.exit(main())
