#!/usr/bin/env python3
"""Fan-out to 1, 8 and 64 namespaced hosts: launch against pdsh (OpenSSH) on the same hosts, in one run.

Needs root, pdsh (``scripts/setup.sh --test``) and the venv. Brings up its own test bed (prefix ``fb-``,
bridge ``fb-br0``, subnet 10.79.0: it never touches the suite's ``lt-`` bed) and tears it down by PID.

For each size, with and without added latency, both tools in one round on the same bed:
  (a) ``launch submit`` of a trivial job (each rank prints one line, imports no torch): end to end, and per
      phase from the job's store (CLI start and plan, preflight, start of every node agent, ranks' lines, exit);
  (b) by default, ``pdsh -R ssh -f FANOUT`` running the node's Python to print one line on every host; the
      figure compared is launch's time to "every node agent started" (preflight + start) against pdsh's whole
      run (connect, start the node's Python, print): both include their own process start.
  With ``--torchrun`` (issue 33's comparison), (b) is ``pdsh`` starting on every host the torchrun command
      launch plans for the job (``launch submit --dry-run --json``: the same interpreter, flags, static
      rendezvous, environment; the node rank from the host's name), and both run real torchrun: the figures
      compared are the time to every rank's first line and to the exit, from each tool's start (pdsh's output
      read as it comes). pdsh's ``-f`` is then at least the host count: it holds a session until its command
      exits, and torchruns it has not started yet would hold the started ones in their rendezvous for ever.
      The two tools alternate which goes first from round to round at each size.
The hosts' CPU of each (``node_cpu``): what the hosts' sshd listeners reaped from the sessions of its run. With
``--breakdown`` the cluster's python is a wrapper that times every node process (``WRAPPER``), and each tool's hosts'
CPU is split by process: the facts probe, the agent's own, torchrun with its rank, the end's commands, the rest (sshd).

Latency: this machine's kernel has no ``sch_netem`` (``tc ... netem`` fails with "Specified qdisc kind is
unknown"), so the delay is a forwarding proxy in the root namespace that holds every chunk of the SSH
stream ``--delay-ms`` each way (``tools/testbed.set_delay`` does it with netem where the kernel has it).
Both tools then connect through the proxy (a per-host port on 127.0.0.1, host keys filed under it).

    sudo .venv/bin/python scripts/bench_fanout.py [--sizes 1,8,64] [--rounds 3] [--delay-ms 10] [--torchrun]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
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
RANK_LINE = re.compile(r"hello from rank (\S+)")
# One write: under PYTHONUNBUFFERED (as launch plans it) print's pieces are separate writes, and torchrun's tee then
# puts the rank's prefix inside the line ("hello from rank[15]:  15").
# --breakdown: the cluster's python is this wrapper, which runs the real one and files, for every node process it
# starts, the host, the node command (facts, agent, clean...: the argument after BOOT and its payload; torchrun's
# module; a script's name), when it ran and the CPU it and what it waited for spent (bash's ``times``).
WRAPPER = """#!/bin/bash
what=python; args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    -c) case "${args[i+1]}" in
          *launch_node*) what="${args[i+3]}" ;;
          *torch.distributed.run*) what=torch.distributed.run ;;
          *) what=c ;;
        esac; break ;;
    -m) what="${args[i+1]}"; break ;;
    -*) ;;
    *) what="${args[i]##*/}"; break ;;
  esac
done
t0=$EPOCHREALTIME
@REAL@ "$@"
rc=$?
t1=$EPOCHREALTIME
times > @LOG@.$$
read -r user system < <(tail -n 1 @LOG@.$$)
rm -f @LOG@.$$
echo "$HOSTNAME $what $t0 $t1 $user $system" >> @LOG@
exit $rc
"""
HELLO = ("import os, socket\n"
         "os.write(1, f\"hello from rank {os.environ.get('RANK')} on {socket.gethostname()}\\n\".encode())\n")


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

    servers = [await asyncio.start_server(partial(handler, address), "127.0.0.1", PROXY_PORT0 + i, backlog=256)
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

def cluster_yaml(bed: testbed.Testbed, n: int, work: Path, delayed: tuple[Path, Path] | None, fanout: int,
                 python: str = PYTHON) -> Path:
    config, known = delayed or (bed.ssh_config, bed.known_hosts)
    lines = ["name: bench", "backend: ssh",
             f"ssh: {{user: root, key_file: {bed.key_file}, known_hosts: {known}, config_file: {config}, "
             f"fanout: {fanout}}}",
             "nodes:", *(f"  - {{host: {h.name}, address: {h.address}, gpus: 0}}" for h in bed.hosts[:n]),
             f"python: {python}", f"workdir: {work}"]
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


def job_yaml(n: int, work: Path, light: bool) -> Path:
    """The trivial job on ``n`` nodes, one rank a node that prints one line (with ``light``: the stand-in torchrun)."""
    job = work / f"job-{n}.yaml"
    env_line = f"env: {{PYTHONPATH: {work / 'fake'}}}\n" if light else ""
    job.write_text(f"name: hello{n}\nentrypoint: [python, {work / 'hello.py'}]\n"
                   f"resources: {{nodes: {n}, nproc_per_node: 1}}\nwatch: {{stall_timeout: 300}}\n{env_line}")
    return job


def rank_lines(lines: list[tuple[float, str]]) -> list[float]:
    """When each rank's first line was seen (one entry a rank that printed)."""
    seen: dict[str, float] = {}
    for t, line in lines:
        if (match := RANK_LINE.search(line)) is not None:
            seen.setdefault(match.group(1), t)
    return list(seen.values())


def run_launch(n: int, cluster: Path, work: Path, profile: Path | None = None, light: bool = False) -> dict:
    """``launch submit`` of the trivial job on the first ``n`` hosts (under py-spy into ``profile``)."""
    job = job_yaml(n, work, light)
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
    hello = rank_lines(lines)
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


def planned_command(n: int, cluster: Path, work: Path, port: int) -> str:
    """The shell command that starts, on any host of the first ``n``, the torchrun that launch plans for the
    trivial job there (``launch submit --dry-run --json``): node 0's argv and environment with the node rank
    taken from the host's name (``fb-hI`` is node I-1), a rendezvous port and id of the caller's, the error file
    under ``work``. Left out of the environment: launch's own tags (``LAUNCH_*``, read by its agent and step
    hooks) and values preflight probes on each host (``auto``: the network interfaces, unused by a rank that
    never joins a process group)."""
    done = subprocess.run([LAUNCH, "submit", str(job_yaml(n, work, light=False)), "--cluster", str(cluster),
                           "--dry-run", "--json"], env={**os.environ, "LAUNCH_HOME": str(work / "home")},
                          capture_output=True, text=True, check=True)
    node = json.loads(done.stdout)["nodes"][0]
    argv = [shlex.quote(a) for a in node["argv"]]
    flags = {"--node-rank": '"$R"', "--master-port": str(port), "--rdzv-id": f"bench{port}"}
    for i, arg in enumerate(node["argv"][:-1]):
        if arg in flags:
            argv[i + 1] = flags[arg]
    env = {k: v for k, v in node["env"].items() if not k.startswith("LAUNCH_") and v != "auto"}
    if "TORCHELASTIC_ERROR_FILE" in env:
        env["TORCHELASTIC_ERROR_FILE"] = str(work / "pdsh-run" / f"node{port}-$R.torchrun-error.json")
    assignments = " ".join(f"{k}={shlex.quote(v)}" if k != "TORCHELASTIC_ERROR_FILE" else f'{k}="{v}"'
                           for k, v in env.items())
    return (f"R=$(( $(hostname | tr -dc 0-9) - 1 )); cd {shlex.quote(node['cwd'])} && "
            f"exec env {assignments} {' '.join(argv)}")


def run_pdsh_torchrun(bed: testbed.Testbed, n: int, config: Path, fanout: int, command: str,
                      timeout: float) -> dict:
    """pdsh running ``command`` (``planned_command``) on the first ``n`` hosts: when every rank's first line came
    (its output read as it comes) and the exit (killed after ``timeout`` seconds). pdsh keeps a host's session until
    its command exits, so below ``n`` sessions at once (``-f``) the first torchruns wait in their rendezvous for
    nodes pdsh never starts: ``-f`` is at least ``n`` (launch's ``fanout`` caps its connecting and starting only)."""
    env = {**os.environ, "PDSH_SSH_ARGS_APPEND": f"-F {config}"}
    names = ",".join(h.name for h in bed.hosts[:n])
    cpu0, t0 = child_cpu(), time.time()
    proc = subprocess.Popen(["pdsh", "-R", "ssh", "-f", str(max(n, fanout)), "-l", "root", "-w", names, command], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killer = threading.Timer(timeout, proc.kill)
    killer.start()
    lines: list[tuple[float, str]] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.time(), line.rstrip()))
    code = proc.wait()
    killer.cancel()
    t_end, cpu = time.time(), child_cpu() - cpu0
    hello = rank_lines(lines)
    out = {"n": n, "code": code, "lines": len(hello), "total_s": t_end - t0, "cpu_s": cpu,
           "tail": [line for _, line in lines if not RANK_LINE.search(line)][-3:]}
    if hello:
        out |= {"first_line_s": min(hello) - t0, "last_line_s": max(hello) - t0}
    return out


def kill_left(bed: testbed.Testbed, n: int) -> list[str]:
    """Kill (by PID) every process left in the first ``n`` hosts but their sshd listeners; what they were."""
    left = []
    for host in bed.hosts[:n]:
        for pid in testbed.pids(host):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                os.kill(pid, signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue
            left.append(f"{host.name}: {command[:160]}")
    return left


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
    left = kill_left(bed, n)
    return {"n": n, "backend": backend, "code": code, "total_s": elapsed, "lines": out.count("hello from rank"),
            "killed_after": left}


def one_round(bed: testbed.Testbed, n: int, work: Path, cluster: Path, config: Path, args: argparse.Namespace,
              port: int, pdsh_first: bool) -> dict:
    """Both tools on the first ``n`` hosts, one after the other (``pdsh_first``: pdsh first), each with the
    hosts' CPU its sessions spent."""
    tools: dict[str, Callable[[], dict]]
    if args.torchrun:
        command = planned_command(n, cluster, work, port)
        tools = {"launch": partial(run_launch, n, cluster, work),
                 "pdsh": partial(run_pdsh_torchrun, bed, n, config, args.fanout, command, args.pdsh_timeout)}
    else:
        tools = {"launch": partial(run_launch, n, cluster, work, light=args.light),
                 "pdsh": partial(run_pdsh, bed, n, config, args.fanout)}
    order = ["pdsh", "launch"] if pdsh_first else ["launch", "pdsh"]
    row: dict = {"n": n, "first": order[0], "load_before": load_avg()}
    for name in order:
        before, (offset, _), t0 = node_cpu(bed), timed_procs(work, 0), time.time()
        row[name] = tools[name]()
        time.sleep(1.0)  # the sessions' sshd processes exit and are reaped
        row[name]["left"] = kill_left(bed, n)  # none, unless a run timed out or a tool leaves processes behind
        row[name]["node_cpu_s"] = node_cpu(bed) - before
        if args.breakdown:
            row[name]["breakdown"] = breakdown(timed_procs(work, offset)[1], row[name]["node_cpu_s"], n, t0)
    return row


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
    (work / "pdsh-run").mkdir()
    wrapper = work / "python-timed"
    wrapper.write_text(WRAPPER.replace("@REAL@", shlex.quote(PYTHON)).replace("@LOG@", shlex.quote(str(work / "procs.log"))))
    wrapper.chmod(0o755)


def timed_procs(work: Path, offset: int) -> tuple[int, list[dict]]:
    """The node processes ``python-timed`` filed after byte ``offset`` of its log: (the log's end, each process's
    host, command, start, end and CPU seconds with what it waited for)."""
    try:
        data = (work / "procs.log").read_bytes()
    except OSError:
        return offset, []
    procs = []
    for line in data[offset:].decode(errors="replace").splitlines():
        fields = line.split()
        if len(fields) != 6:
            continue
        user, system = (int(v.split("m")[0]) * 60 + float(v.split("m")[1].rstrip("s")) for v in fields[4:6])
        procs.append({"host": fields[0], "what": fields[1], "t0": float(fields[2]), "t1": float(fields[3]),
                      "cpu_s": user + system})
    return len(data), procs


def breakdown(procs: list[dict], node_cpu_s: float, n: int, t0: float) -> dict:
    """The hosts' CPU a host by node process, each one's own (less what ran within it on its host: an agent's
    torchrun, a torchrun's rank; a facts probe that became the agent is ``facts+agent``), the rest (sshd, shells)
    from ``node_cpu_s``; and when each kind of process first started and last ended, from ``t0``."""
    by: dict[str, float] = {}
    span: dict[str, list[float]] = {}
    top = 0.0
    for proc in procs:
        outer = [o for o in procs if o is not proc and o["host"] == proc["host"] and o["t0"] < proc["t0"]
                 and proc["t1"] <= o["t1"]]
        inner = [i for i in procs if i is not proc and i["host"] == proc["host"] and proc["t0"] < i["t0"]
                 and i["t1"] <= proc["t1"] and not any(proc["t0"] < o["t0"] and o["t1"] <= proc["t1"] and
                                                       o["t0"] < i["t0"] for o in procs if o["host"] == proc["host"]
                                                       and o is not i and o is not proc and i["t1"] <= o["t1"])]
        what = "facts+agent" if proc["what"] == "facts" and inner else proc["what"]
        by[what] = by.get(what, 0.0) + proc["cpu_s"] - sum(i["cpu_s"] for i in inner)
        top += 0.0 if outer else proc["cpu_s"]
        first, last = span.setdefault(what, [proc["t0"], proc["t1"]])
        span[what] = [min(first, proc["t0"]), max(last, proc["t1"])]
    by["sshd and the rest"] = node_cpu_s - top
    return {"cpu_a_host_s": {what: round(cpu / n, 3) for what, cpu in by.items()},
            "spans_s": {what: [round(a - t0, 2), round(b - t0, 2)] for what, (a, b) in span.items()}}


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
    parser.add_argument("--no-latency", action="store_true", help="only the rows without added latency")
    parser.add_argument("--fanout", type=int, default=32, help="pdsh -f (launch's default cap is 32 too)")
    parser.add_argument("--work", default="/tmp/bench-fanout")
    parser.add_argument("--profile", action="store_true", help="also run launch at the largest size under cProfile")
    parser.add_argument("--light", action="store_true", help="a torchrun stand-in that does not import torch")
    parser.add_argument("--torchrun", action="store_true",
                        help="against pdsh starting launch's planned torchrun, to every rank's line (issue 33)")
    parser.add_argument("--breakdown", action="store_true",
                        help="the hosts' CPU by node process (facts, agent, torchrun...): the node's python timed")
    parser.add_argument("--pdsh-timeout", type=float, default=600.0, help="with --torchrun: pdsh's run at most")
    parser.add_argument("--rendezvous-sizes", default="", help="also time bare torchrun (pdsh), static vs c10d")
    parser.add_argument("--rendezvous-timeout", type=float, default=240.0)
    parser.add_argument("--serve-proxy", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_proxy:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        asyncio.run(_serve(args.serve_proxy[1:], float(args.serve_proxy[0]) / 1000))
        return 0
    if args.torchrun and args.light:
        parser.error("--torchrun compares real torchrun: leave out --light")
    if shutil.which("pdsh") is None:
        print("pdsh not found: scripts/setup.sh --test installs it", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.sizes.split(",") if s]
    rdzv_sizes = [int(s) for s in args.rendezvous_sizes.split(",") if s]
    work = Path(args.work)
    prepare_work(work)
    results: dict = {"load_before": load_avg(), "cores": os.cpu_count(), "rows": [], "light": args.light,
                     "torchrun": args.torchrun}
    t = time.perf_counter()
    hosts = max(sizes + rdzv_sizes)
    bed = testbed.up(hosts, work / "bed", NAMES)
    results["up_s"] = time.perf_counter() - t
    print(f"bed: {hosts} hosts up in {results['up_s']:.2f} s (load {load_avg()})", flush=True)
    proxy = None
    try:
        proxy = start_proxy(bed, args.delay_ms)
        delayed = proxied_files(bed, work)
        ports = iter(range(29700, 29800))
        passes = [("none", None), (f"{args.delay_ms:g} ms each way", delayed)]
        for label, files in passes[:1] if args.no_latency else passes:
            config = files[0] if files else bed.ssh_config
            for n in sizes:
                cluster = cluster_yaml(bed, n, work, files, args.fanout,
                                       str(work / "python-timed") if args.breakdown else PYTHON)
                for _ in range(args.rounds_64 if n >= 64 else args.rounds):
                    row = one_round(bed, n, work, cluster, config, args, next(ports),
                                    pdsh_first=args.torchrun and sum(r["n"] == n for r in results["rows"]) % 2 == 1)
                    row["delay"] = label
                    row["load"] = load_avg()
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
    for row in results.get("rendezvous", []):
        print(f"bare torchrun by pdsh, {row['n']:>3} hosts, {row['backend']:>6} rendezvous: {row['total_s']:6.1f} s, "
              f"{row['lines']} of {row['n']} ranks printed (exit {row['code']}; killed after: {len(row['killed_after'])})")
    groups: dict[tuple[str, int], list[dict]] = {}
    for row in results["rows"]:
        groups.setdefault((row["delay"], row["n"]), []).append(row)
    (summarise_torchrun if results["torchrun"] else summarise_started)(groups)
    for (delay, n), rows in groups.items():
        for tool in ("launch", "pdsh"):
            found = [r[tool]["breakdown"] for r in rows if "breakdown" in r[tool]]
            if found:
                kinds = sorted({what for b in found for what in b["cpu_a_host_s"]})
                parts = ", ".join(f"{what} {median(b['cpu_a_host_s'].get(what, 0.0) for b in found) * 1000:.0f}"
                                  for what in kinds)
                print(f"{delay:>16} {n:>5} {tool}: the hosts' CPU a host by process, ms: {parts}")


def summarise_started(groups: dict[tuple[str, int], list[dict]]) -> None:
    """Medians of launch to every node agent started against pdsh's run of a print."""
    print(f"{'delay':>16} {'hosts':>5} {'launch to started':>18} {'pdsh':>7} {'ratio':>6} {'launch end':>10} "
          f"{'launch cpu/host':>15} {'pdsh cpu/host':>13} {'node cpu/host launch, pdsh':>27}")
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


def summarise_torchrun(groups: dict[tuple[str, int], list[dict]]) -> None:
    """Medians of launch against pdsh + the same torchrun: every rank's first line, the exit, the hosts' CPU."""
    print(f"{'delay':>16} {'hosts':>5} {'every rank, launch / pdsh':>26} {'ratio':>6} {'exit, launch / pdsh':>20} "
          f"{'ratio':>6} {'ranks':>9} {'hosts cpu/host launch / pdsh':>29}")
    nan = float("nan")
    for (delay, n), rows in groups.items():
        def med(tool: str, key: str, rows: list[dict] = rows) -> float:
            return median(r[tool].get(key, nan) for r in rows)
        last = med("launch", "last_line_s"), med("pdsh", "last_line_s")
        end = med("launch", "total_s"), med("pdsh", "total_s")
        cpu = med("launch", "node_cpu_s") / n, med("pdsh", "node_cpu_s") / n
        ranks = f"{min(r['launch']['lines'] for r in rows)}/{min(r['pdsh']['lines'] for r in rows)} of {n}"
        print(f"{delay:>16} {n:>5} {last[0]:>11.2f} / {last[1]:>7.2f} s {last[0] / last[1]:>5.2f}x "
              f"{end[0]:>8.2f} / {end[1]:>6.2f} s {end[0] / end[1]:>5.2f}x {ranks:>9} "
              f"{cpu[0] * 1000:>17.0f} / {cpu[1] * 1000:.0f} ms")


if __name__ == "__main__":
    threading.stack_size(1 << 20)
    sys.exit(main())
