"""The ``ssh`` backend: each node of the plan is a torchrun (or DeepSpeed) agent started over SSH.

On a node, a small ``sh`` wrapper reads the job's secrets from the
channel's stdin, starts the agent in a session of its own
(``setsid``), writes the agent's PID to ``/tmp/launch-runs/JOB_ID/nodeK.pid``
(directory 0700), and exits with the agent's status. The command line carries
the plan's environment as ``env K=V`` (sshd drops protocol env) but never a
secret. Output streams back over the channel (no pty: a pty mangles output,
so a lost client leaves the agent running and ``terminate`` ends it
explicitly: the process group first, then every process tagged with the job).
"""

from __future__ import annotations

import json
import logging
import shlex
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path

import paramiko

from launcher import proctree, sync
from launcher.backends.base import Preflight
from launcher.commands import RECIPE_MODULE
from launcher.errors import LaunchError, NodeStartError
from launcher.failures import LOST_NODE_EXIT
from launcher.netenv import AUTO, NodeNetwork
from launcher.plan import NodePlan, Plan
from launcher.shell import render_command
from launcher.spec.cluster import ClusterSpec, NodeSpec
from launcher.sshconn import CONNECTION_ERRORS, Pool, RunResult, SSHSettings, error_text, fan_out

log = logging.getLogger(__name__)

RUN_ROOT = "/tmp/launch-runs"
AGENT_MARK = "@@launch-agent "
START_TIMEOUT_S = 30.0
CLEANUP_CONNECT_S = 2.0
EXIT_STATUS_WAIT_S = 2.0

# sh -c WRAPPER sh RUN_DIR PID_FILE AGENT_ARGV... (sh, not python: ~40 ms less CPU a node). Secrets come on
# stdin (secrets_script). A background job of a non-interactive sh leads no group: setsid(1) execs, $! is the agent.
WRAPPER = r"""
run_dir=$1 pid_file=$2
shift 2
[ -d "${run_dir%/*}" ] || mkdir -m 1777 "${run_dir%/*}" 2>/dev/null
mkdir -m 700 "$run_dir" 2>/dev/null
if [ -L "$run_dir" ] || [ ! -d "$run_dir" ] || [ ! -O "$run_dir" ]; then
  echo "launch: $run_dir is not a directory of this user; refusing to use it" >&2
  exit 126
fi
. /dev/stdin
setsid "$@" </dev/null &
agent=$!
echo "$agent" >"$pid_file"
echo "@@launch-agent $agent"
wait "$agent"
"""

# Runs on the node: sh -c KILL_GROUP sh PID_FILE TICKS. TERM the agent's process group, KILL it after
# TICKS tenths of a second. (dash's kill takes no `--`: the group goes as "-PGID" after the signal.)
KILL_GROUP = r"""
{ read -r group <"$1"; } 2>/dev/null || exit 0
case $group in ''|*[!0-9]*) exit 0 ;; esac
kill -TERM "-$group" 2>/dev/null || exit 0
ticks=$2
while [ "$ticks" -gt 0 ] && kill -0 "-$group" 2>/dev/null; do
  sleep 0.1
  ticks=$((ticks - 1))
done
kill -KILL "-$group" 2>/dev/null
exit 0
"""

# Runs on the node: PROBE REQUEST_JSON; prints what preflight needs as JSON.
PROBE = r"""
import importlib.util, json, os, socket, subprocess, sys
req = json.loads(sys.argv[1])
def run(argv):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if done.returncode:
        return None, (done.stderr or done.stdout).strip() or "exit %d" % done.returncode
    return done.stdout, None
def importable(module):
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
out = {"missing": [m for m in req["modules"] if not importable(m)]}
out["workdir_ok"] = req["workdir"] is None or os.path.isdir(req["workdir"])
out["missing_ifaces"] = [n for n in req["ifaces"] if not os.path.exists("/sys/class/net/" + n)]
ib = "/sys/class/infiniband"
out["hcas"] = sorted(os.listdir(ib)) if os.path.isdir(ib) else []
if req["port"]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", req["port"]))
        out["port_free"] = True
    except OSError:
        out["port_free"] = False
    sock.close()
if req["gpus"]:
    text, out["gpu_error"] = run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"])
    out["gpus"] = None if text is None else len(text.split())
if req["master"]:
    try:
        addr = socket.gethostbyname(req["master"])
        text, err = run(["ip", "-o", "route", "get", addr])
        words = (text or "").split()
        if words[:1] == ["local"]:
            text, err = run(["ip", "-o", "addr", "show", "to", addr])
            words = ["dev", text.split()[1].split("@")[0]] if text else []
        out["dev"] = words[words.index("dev") + 1] if "dev" in words else None
        out["route_error"] = err or (None if out["dev"] else "no route")
    except OSError as exc:
        out["dev"], out["route_error"] = None, "cannot resolve %s: %s" % (req["master"], exc)
print(json.dumps(out))
"""


def agent_command(job_id: str, node: NodePlan) -> str:
    """The remote command that starts ``node``'s agent under the wrapper (secrets go to its stdin)."""
    run_dir = f"{RUN_ROOT}/{job_id}"
    argv = ["sh", "-c", WRAPPER, "sh", run_dir, f"{run_dir}/node{node.index}.pid", *node.argv]
    return render_command(argv, node.env, node.cwd)


def secrets_script(secrets: Mapping[str, str]) -> bytes:
    """What the wrapper sources from stdin: one quoted ``export`` a secret (names are checked by the spec)."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in secrets.items()).encode()


def exit_code(status: int) -> int:
    """The wrapper's exit status as a NodeHandle code: 128+N (a signal) becomes -N."""
    return -(status - 128) if 128 < status < 192 else status


class SSHNode:
    """One node agent running under the wrapper, followed over its SSH channel."""

    def __init__(self, index: int, backend: SSHBackend, channel: paramiko.Channel, job_id: str) -> None:
        self.index = index
        self.pid: int | None = None
        self._backend = backend
        self._channel = channel
        self._job_id = job_id
        self._host = backend.targets[index].alias
        self._stream = _channel_lines(channel)
        self._early: list[str] = []

    def wait_started(self, timeout: float) -> None:
        """Read up to the wrapper's PID line; LaunchError with the output if the agent did not start."""
        self._channel.settimeout(timeout)
        try:
            for line in self._stream:
                if line.startswith(AGENT_MARK):
                    self.pid = int(line[len(AGENT_MARK):])
                    self._channel.settimeout(None)
                    return
                self._early.append(line)
        except TimeoutError:
            self._early.append(f"(no answer within {timeout:.0f} s)")
        self._channel.status_event.wait(EXIT_STATUS_WAIT_S)
        self._channel.close()
        output = " | ".join(self._early[-5:] or ["no output"])
        raise LaunchError(f"{self._host}: the node agent did not start (exit {self._channel.exit_status}): {output}")

    def lines(self) -> Iterator[str]:
        yield from self._early
        yield from self._stream
        self._channel.status_event.wait(EXIT_STATUS_WAIT_S)
        if self._channel.exit_status == -1:
            yield f"[launch] connection to {self._host} lost: the node's exit status is unknown"

    def poll(self) -> int | None:
        if self._channel.status_event.is_set():
            status = self._channel.exit_status
            return LOST_NODE_EXIT if status == -1 else exit_code(status)
        return None if self._channel.get_transport().is_active() else LOST_NODE_EXIT

    def terminate(self, grace: float) -> None:
        if self._channel.status_event.is_set() and self._channel.exit_status != -1:
            return
        self._backend.end_node(self.index, self._job_id, grace)
        self._channel.status_event.wait(EXIT_STATUS_WAIT_S)


def _channel_lines(channel: paramiko.Channel) -> Iterator[str]:
    """Decoded output lines of ``channel`` until it closes."""
    pending = b""
    while chunk := channel.recv(65536):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for raw in complete:
            yield raw.decode("utf-8", "replace")
    if pending:
        yield pending.decode("utf-8", "replace")


class SSHBackend:
    """Runs each node of a plan on its host over SSH, fanning out to all hosts in parallel."""

    name = "ssh"

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self.python = cluster.python or "python3"
        settings = SSHSettings(cluster.ssh)
        self.targets = [settings.target(n.host, n.port, n.user) for n in cluster.nodes]
        self._pool = Pool(settings, cluster.ssh.connect_timeout)
        self._unreachable: set[int] = set()
        self._prepared: list[str] | None = None
        self._prepare_lock = threading.Lock()

    def preflight(self, plan: Plan) -> Preflight:
        """Connect to every host and probe it in parallel; every problem is reported together."""
        specs = self.cluster.nodes[: plan.nnodes]
        master: Future[str | None] = Future()
        if specs[0].address and specs[0].address != AUTO:
            master.set_result(specs[0].address)
        results = fan_out(lambda index: self._check(plan, index, specs[index], master), list(range(plan.nnodes)))
        problems = [p for r in results for p in (r.value[2] if r.ok else [error_text(r.error)])]
        if problems:
            return Preflight(problems=problems)
        nodes = [specs[r.key].model_copy(update={"address": r.value[0]}) for r in results]
        return Preflight(nodes=nodes, probes={r.key: r.value[1] for r in results})

    def _check(self, plan: Plan, index: int, spec: NodeSpec, master: Future) -> tuple[str, NodeNetwork, list[str]]:
        """One host's preflight: (its address, its network probe, its problems).

        Every host probes its route to node 0, whose address (unless pinned)
        node 0's step publishes in ``master`` as soon as TCP connects (behind a
        jump host: once logged in; None if it failed).
        """
        address = None

        def publish(peer: str | None) -> None:
            if index == 0 and not master.done():
                master.set_result(peer)

        try:
            conn = self._pool.get(self.targets[index], on_peer=publish)
            address = spec.address if spec.address and spec.address != AUTO else conn.peer_address()
        finally:
            publish(address)
        node = plan.nodes[index]
        pinned = node.env.get("GLOO_SOCKET_IFNAME", AUTO)
        request = {
            "modules": _modules(plan),
            "workdir": None if self.cluster.sync_workdir else node.cwd,
            "ifaces": [] if pinned == AUTO else [name for name in pinned.split(",") if name],
            "port": plan.rendezvous.port if index == 0 else None,
            "gpus": spec.gpus,
            "master": master.result(),
        }
        result = conn.run([self.python, "-c", PROBE, json.dumps(request)])
        host = self.targets[index].alias
        try:
            found = json.loads(result.out.splitlines()[-1]) if result.code == 0 else None
        except (IndexError, ValueError):
            found = None
        if found is None:
            missing = result.code in (126, 127)
            why = f"python interpreter '{self.python}' not found (cluster.yaml python)" if missing else (
                f"the preflight probe failed (exit {result.code}): {(result.err or result.out).strip()[-300:]}")
            return address, NodeNetwork("", address), [f"{host}: {why}"]
        network = NodeNetwork(found.get("dev") or "", address, tuple(found["hcas"]))
        auto_interface = self.cluster.network.interface == AUTO
        return address, network, _problems(host, self.python, auto_interface, node, request, found)

    def start(self, node: NodePlan, plan: Plan, run_dir: Path, secrets: Mapping[str, str]) -> SSHNode:
        """Start one node's agent under the wrapper; returns once the agent process exists."""
        self._prepare(plan, run_dir)
        conn = self._pool.get(self.targets[node.index])
        self._unreachable.discard(node.index)
        channel = conn.exec(agent_command(plan.job_id, node), combine=True)
        channel.sendall(secrets_script(secrets))
        channel.shutdown_write()
        handle = SSHNode(node.index, self, channel, plan.job_id)
        handle.wait_started(START_TIMEOUT_S)
        return handle

    def _prepare(self, plan: Plan, run_dir: Path) -> None:
        """Workdir sync and ``setup:`` on every node, once, before any agent starts."""
        with self._prepare_lock:
            if self._prepared is None:
                self._prepared = self._prepare_all(plan, run_dir)
        if self._prepared:
            raise NodeStartError(
                "preparing the nodes failed; no agent was started:\n" + "\n".join(f"  {p}" for _, p in self._prepared),
                node=self._prepared[0][0],
            )

    def _prepare_all(self, plan: Plan, run_dir: Path) -> list[tuple[int, str]]:
        """(node index, problem) for every node whose sync or setup failed, in node order."""
        if not (self.cluster.sync_workdir or self.cluster.setup):
            return []

        def step(node: NodePlan) -> None:
            conn = self._pool.get(self.targets[node.index])
            sync.prepare_node(conn, self.cluster, node, plan.job_id, run_dir / f"setup-node{node.index}.log")

        return [(r.key.index, error_text(r.error)) for r in fan_out(step, list(plan.nodes)) if not r.ok]

    def end_node(self, index: int, job_id: str, grace: float) -> None:
        """TERM the node's agent group, KILL it after ``grace``, then end anything tagged that is left."""
        pid_file = f"{RUN_ROOT}/{job_id}/node{index}.pid"
        if self._cleanup(index, ["sh", "-c", KILL_GROUP, "sh", pid_file, str(int(grace * 10))], grace + 30) is not None:
            self._cleanup(index, proctree.remote_argv(self.python, "end", job_id, grace), grace + 30)

    def run_on_node(self, index: int, argv: list[str], timeout: float) -> tuple[int, str, str]:
        """Run ``argv`` on node ``index`` (quoted by render_command); a connection error is the result."""
        try:
            result = self._pool.get(self.targets[index]).run(argv, timeout=timeout)
        except (LaunchError, *CONNECTION_ERRORS) as exc:
            return LOST_NODE_EXIT, "", error_text(exc) if isinstance(exc, LaunchError) else f"cannot connect: {exc}"
        return result.code, result.out, result.err

    def kernel_log(self, node_index: int) -> list[str]:
        """The node's last kernel log lines (``dmesg``), for OOM-killer and Xid lines; [] if unreadable."""
        result = self._cleanup(node_index, ["dmesg", "--ctime"], 10.0)
        return result.out.splitlines()[-300:] if result is not None and result.code == 0 else []

    def leftovers(self, plan: Plan) -> dict[int, list[int]]:
        """PIDs of the job on every node, found by its tag (proctree over SSH, in parallel)."""
        return self._proctree(plan, "list", 0.0)

    def sweep(self, plan: Plan, grace: float) -> dict[int, list[int]]:
        """End the job's tagged processes on every node in parallel; what is left per node."""
        return self._proctree(plan, "end", grace)

    def _proctree(self, plan: Plan, action: str, grace: float) -> dict[int, list[int]]:
        """Run proctree ``action`` on every node; after a clean ``end``, remove the node's run directory."""

        def step(index: int) -> list[int]:
            result = self._cleanup(index, proctree.remote_argv(self.python, action, plan.job_id, grace), grace + 30)
            if result is not None and result.code != 0:
                log.warning("%s: proctree %s failed: %s", self.targets[index].alias, action, result.err.strip()[-300:])
            if result is None or result.code != 0:
                return []
            left = [int(pid) for pid in result.out.split()]
            if action == "end" and not left:
                self._cleanup(index, ["rm", "-rf", "--", f"{RUN_ROOT}/{plan.job_id}"], 30.0)
            return left

        return {r.key: r.value for r in fan_out(step, list(range(plan.nnodes))) if r.value}

    def _cleanup(self, index: int, argv: list[str], timeout: float) -> RunResult | None:
        """Run a clean-up command on a node; None (logged) when the node cannot be reached.

        Clean-up must not hang on a dead host: connecting again waits
        CLEANUP_CONNECT_S at most, and a host that failed once is not retried.
        """
        host = self.targets[index].alias
        if index in self._unreachable:
            return None
        try:
            conn = self._pool.get(self.targets[index], timeout=CLEANUP_CONNECT_S)
            return conn.run(argv, timeout=timeout)
        except (LaunchError, *CONNECTION_ERRORS) as exc:
            self._unreachable.add(index)
            log.warning("%s: cannot reach the node to clean up job processes: %s", host, exc)
            return None

    def close(self) -> None:
        """Close every SSH connection."""
        self._pool.close()


def _modules(plan: Plan) -> list[str]:
    modules = ["torch"]
    if plan.launcher == "deepspeed" or plan.ds_config:
        modules.append("deepspeed")
    if RECIPE_MODULE in plan.nodes[0].argv:
        modules.append("launcher")
    return modules


def _problems(host: str, python: str, auto_interface: bool, node: NodePlan, request: dict, found: dict) -> list[str]:
    """What the probe's answer says is wrong with one host."""
    problems = []
    if found["missing"]:
        problems.append(
            f"{host}: {python} cannot import {', '.join(found['missing'])} "
            "(install it on the node, or point cluster.yaml python at an interpreter that has it)"
        )
    if not found["workdir_ok"]:
        problems.append(f"{host}: workdir '{node.cwd}' does not exist (cluster.yaml workdir, or set sync_workdir)")
    for name in found["missing_ifaces"]:
        problems.append(f"{host}: network interface '{name}' (cluster.yaml network.interface) does not exist")
    if found.get("port_free") is False:
        problems.append(
            f"{host}: rendezvous port {request['port']} is in use on node 0 (a stale job may hold it: "
            "`launch status`; or choose another rendezvous.port)"
        )
    if request["gpus"] and found.get("gpus") is None:
        problems.append(f"{host}: cluster.yaml says {request['gpus']} GPUs but nvidia-smi failed: {found['gpu_error']}")
    elif request["gpus"] and found["gpus"] < request["gpus"]:
        problems.append(f"{host}: cluster.yaml says {request['gpus']} GPUs, nvidia-smi lists {found['gpus']}")
    if auto_interface and request["master"] and not found.get("dev"):
        problems.append(
            f"{host}: cannot find the interface routing to node 0 ({request['master']}): "
            f"{found.get('route_error')} (pin network.interface in cluster.yaml)"
        )
    return problems
