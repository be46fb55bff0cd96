"""The ``ssh`` backend: each node of the plan is a node agent started over SSH (paramiko).

On every host the command is ``cd WORKDIR && exec env LAUNCH_JOB_ID=... PYTHON -c AGENT ...``
(``launcher.node.ship``), every part quoted by ``shell.render_command``. The job's secrets
travel on the channel's stdin, never on a command line. The agent starts the node's torchrun
(or DeepSpeed launcher) in a session of its own and streams framed lines back over the channel
(no pty: a pty mangles output). If the connection dies, the agent carries on and journals its
lines; ``follow`` reads them again over a new channel from the line the supervisor had (the
supervisor decides, on evidence, when a node out of contact is lost: ``launcher.run.contact``);
``terminate`` signals the agent by PID and start time; the sweep ends whatever is still tagged. One connection per host serves the whole submit:
preflight, the version comparison, sync, setup, start and watch. Preflight's facts probe of a job that starts at once
stays on its channel (``HeldProbe``) and becomes the node's agent when ``start`` sends the request there: one
interpreter a node, not two (about 90 ms of a host's CPU, issue 33); a later start (a restart) starts a new agent.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from typing import ClassVar

import paramiko

from launcher.backends import leasing
from launcher.backends.agents import agent_exit_code, agent_start
from launcher.backends.base import Backend, CommandResult, NodeHandle, Preflight, Stage, StageState, StartContext, unreachable
from launcher.backends.facts import NodeFacts
from launcher.backends.failures import LOST_NODE_EXIT
from launcher.backends.follow import FollowHandle, follow_request, whole_lines
from launcher.backends.nodechecks import FACTS_TIMEOUT_S, facts_request, node_problems, parse_facts
from launcher.backends.ssh import sync
from launcher.backends.ssh.connection import CONNECTION_ERRORS, Connection, Pool, error_text, fan_out
from launcher.backends.ssh.hostkeys import HostKeyError
from launcher.backends.ssh.planning import SSHPlanning
from launcher.backends.ssh.settings import SSHSettings
from launcher.backends.ssh.spec import SSHCluster
from launcher.backends.stopping import term_then_kill
from launcher.errors import LaunchError, NodeStartError
from launcher.node.protocol import FactsRequest, Frame, FrameKind, Request, SignalRequest, early_output, parse
from launcher.node.ship import node_argv
from launcher.plan.netenv import AUTO, NodeNetwork
from launcher.plan.planner import NodePlan, Plan
from launcher.plan.shell import render_command
from launcher.spec.cluster import NodeSpec

START_TIMEOUT_S = 30.0
CLEANUP_CONNECT_S = 1.0
EXIT_STATUS_WAIT_S = 2.0
HOLD_S = 600.0  # how long preflight's probe waits to become the node's agent (then it exits, having started nothing)
HOLD_MARGIN_S = 60.0  # a probe kept longer than HOLD_S less this is not used: a new agent starts instead


@dataclasses.dataclass
class HeldProbe:
    """Preflight's facts probe of one node, kept on its channel to become the node's agent (``agent_within_s``)."""

    channel: paramiko.Channel
    lines: Iterator[str]  # its output after the facts answer (the agent's, once it has its request)
    key: tuple[str, str]  # the interpreter and job it runs: it serves only a start of the same
    since: float  # monotonic

    def usable(self, key: tuple[str, str]) -> bool:
        return (key == self.key and time.monotonic() - self.since < HOLD_S - HOLD_MARGIN_S
                and not self.channel.closed and not self.channel.exit_status_ready())


class SSHNode(NodeHandle):
    """One node agent, followed over its SSH channel; ``generation``: its supervisor's (for its signals)."""

    def __init__(self, index: int, backend: SSHBackend, plan: Plan, channel: paramiko.Channel, generation: int,
                 stream: Iterator[str] | None = None) -> None:
        self.index = index
        self._backend = backend
        self._plan = plan
        self._generation = generation
        self._channel = channel
        self._host = backend.targets[index].alias
        self._stream = stream if stream is not None else _channel_lines(channel)
        self._early: list[str] = []
        self.start_ticks: int | None = None

    def wait_leased(self, timeout: float) -> None:
        """Read up to the agent's ``@leased`` line (LeasesBusy on ``@busy``); those lines are not the journal's."""
        self._channel.settimeout(timeout)
        try:
            self.leased = leasing.read_until_leased(self._stream, self._host, self.index)
        except TimeoutError:
            self._channel.close()
            raise NodeStartError(f"{self._host}: the node agent did not take its leases within {timeout:.0f} s",
                                 self.index) from None

    def answer(self, go: bool) -> None:
        """Tell an agent holding its leases to start (``go``), or, closing its stdin without, to exit."""
        try:
            if go:
                self._channel.sendall(b"go\n")
            self._channel.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the agent or its connection is gone: wait_started reports it

    def wait_started(self, timeout: float) -> None:
        """Read up to the agent's ``@started`` line; NodeStartError with the output if it did not start."""
        self._channel.settimeout(timeout)
        try:
            for line in self._stream:
                self._early.append(line)
                parsed = parse(line)
                if isinstance(parsed, Frame) and parsed.kind is FrameKind.STARTED:
                    self.pid, self.start_ticks = parsed.get_int("pid"), parsed.get_int("start_ticks")
                    self._channel.settimeout(None)
                    return
        except TimeoutError:
            self._early.append(f"(no answer within {timeout:.0f} s)")
        self._channel.status_event.wait(EXIT_STATUS_WAIT_S)
        self._channel.close()
        shown = early_output(self._early, last=5) or "no output"
        raise NodeStartError(f"{self._host}: the node agent did not start (exit {self._channel.exit_status}): {shown}",
                             self.index)

    def lines(self) -> Iterator[str]:
        """The agent's lines until its channel closes. A broken connection ends them without an exit status:
        ``poll`` then says None (out of contact) and the supervisor follows the node again or, on evidence,
        declares it lost (``launcher.run.contact``)."""
        yield from self._early
        try:
            yield from self._stream
        except CONNECTION_ERRORS as exc:
            self.error = f"connection to {self._host} lost: {exc}"
        if self._channel.get_transport().is_active():
            self._channel.status_event.wait(EXIT_STATUS_WAIT_S)
        if self.poll() is None:
            self.error = self.error or f"connection to {self._host} lost: the node's exit status is unknown"

    def poll(self) -> int | None:
        if self._channel.status_event.is_set() and self._channel.exit_status != -1:
            return agent_exit_code(self._channel.exit_status)
        return LOST_NODE_EXIT if self.lost_reason is not None else None

    def terminate(self, grace: float) -> None:
        """TERM the agent (it ends its node's processes), then KILL it if it lingers; the sweep does the rest. An
        agent that started nothing (told not to, having its leases) exits by itself: waited for."""
        if self.pid is None and self.leased is not None:
            self._channel.status_event.wait(START_TIMEOUT_S)
        if self.poll() is not None or self.pid is None or not self._channel.get_transport().is_active():
            return  # ended, lost, never started, or out of contact: the sweep reaches what is left
        term_then_kill(self._signal, self._channel.status_event.wait, grace, kill_wait=EXIT_STATUS_WAIT_S)

    def _signal(self, sig: int) -> None:
        """Send ``sig`` to the agent, by PID and start time (a PID reused since is left alone)."""
        assert self.pid is not None
        self._backend.fenced_command(self._plan, self.index, "signal",
                                     SignalRequest(pid=self.pid, signal=int(sig), start_ticks=self.start_ticks),
                                     self._generation, timeout=30)


def _channel_lines(channel: paramiko.Channel) -> Iterator[str]:
    """Decoded whole output lines of ``channel`` until it closes (linear in the output's size); a last line cut
    off by a broken connection is not one: following the journal again gives it whole."""
    return whole_lines(iter(lambda: channel.recv(65536), b""))


class SSHStream:
    """A long node command over its own channel (``leasing.NodeStream``); ``close`` closes the channel."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel

    def lines(self) -> Iterator[str]:
        try:
            yield from _channel_lines(self._channel)
        except CONNECTION_ERRORS:
            return

    def close(self) -> None:
        self._channel.close()


class SSHBackend(Backend[SSHCluster]):
    """Runs each node of a plan on its host over SSH, fanning out to all hosts in parallel."""

    name: ClassVar[str] = "ssh"
    planning_class = SSHPlanning

    def __init__(self, cluster: SSHCluster) -> None:
        super().__init__(cluster)
        settings = SSHSettings(cluster.ssh)
        self.targets = [settings.target(n.host, n.port, n.user) for n in cluster.nodes]
        self._pool = Pool(settings, cluster.ssh.connect_timeout)
        self._unreachable: set[int] = set()
        self._guard = threading.Lock()
        self._held: dict[int, HeldProbe] = {}  # node index -> preflight's probe, to become its agent

    @property
    def pool(self) -> Pool:
        """The connections to the cluster's hosts, one per host (`launch init` fetches host keys through it)."""
        return self._pool

    def untrusted(self, plan: Plan) -> list[str]:
        """Each host whose key is not the one in known_hosts, as preflight says it (connected now: the connection is
        kept for what follows); an unreachable host is not one (attach follows it as out of contact)."""
        def one(index: int) -> str | None:
            try:
                self._pool.get(self.targets[index])
            except HostKeyError as exc:
                return exc.message + (f" ({exc.hint})" if exc.hint else "")
            except LaunchError:
                return None
            return None

        results = fan_out(one, list(range(plan.nnodes)), self.pool.settings.fanout)
        return [r.got for r in results if r.ok and r.got]

    def preflight(self, plan: Plan) -> Preflight:
        """Connect to every host and probe it in parallel; every problem is reported together."""
        specs = self.cluster.nodes[: plan.nnodes]
        master: Future[str | None] = Future()
        if specs[0].address and specs[0].address != AUTO:
            master.set_result(specs[0].address)
        results = fan_out(lambda index: self._check(plan, index, specs[index], master), list(range(plan.nnodes)),
                          self.pool.settings.fanout)
        problems = [p for r in results for p in (r.got[2] if r.ok else [error_text(r.failure)])]
        if problems:
            return Preflight(problems=problems, hint=leasing.hint(problems))
        nodes = [specs[r.key].model_copy(update={"address": r.got[0]}) for r in results]
        return Preflight(nodes=nodes, probes={r.key: r.got[1] for r in results},
                         facts={r.key: r.got[3] for r in results})

    def _check(self, plan: Plan, index: int, spec: NodeSpec, master: Future) -> tuple[str, NodeNetwork, list[str], NodeFacts]:
        """One host's preflight: (its address, its network probe, its problems, its facts).

        Every host probes its route to node 0, whose address (unless pinned) node 0's step
        publishes in ``master`` as soon as TCP connects (behind a jump host: once logged in;
        None if it failed).
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
        pinned = node.env.get("GLOO_SOCKET_IFNAME")  # absent: probed (node.unprobed)
        request = facts_request(
            plan, index, ifaces=() if pinned is None else tuple(name for name in pinned.split(",") if name),
            gpus=bool(spec.gpus), master=master.result() if self.cluster.network.interface == AUTO else None,
        )
        wanted = leasing.preflight_request(self, plan, index)  # who holds what the job needs here, in the same probe
        workdir = None if self.cluster.sync_workdir else request.workdir  # made by the sync at start
        hold = plan.queue != "wait"  # the agents start right after preflight (not after a wait for the leases)
        request = dataclasses.replace(request, workdir=workdir, leases=wanted, agent_within_s=HOLD_S if hold else None)
        host = self.targets[index].alias
        if hold:
            answer, error = self._held_probe(plan, index, conn, request)
        else:
            answer, error = self.node_command(plan, index, "facts", request, timeout=FACTS_TIMEOUT_S)
        if answer is None:
            missing = error and ("not found" in error or "No such file" in error)
            why = (f"python interpreter '{plan.python}' not found (cluster.yaml python)" if missing
                   else f"the preflight probe failed: {error}")
            return address, NodeNetwork("", address), [f"{host}: {why}"], NodeFacts()
        facts, problem = parse_facts(host, answer)
        if facts is None:
            return address, NodeNetwork("", address), [problem or f"{host}: no facts"], NodeFacts()
        network = NodeNetwork(facts.dev or "", address, facts.hcas, facts.settable_memlock)
        problems = node_problems(host, plan, facts, node, spec.gpus)
        if not problems and wanted:
            problems = leasing.preflight_problems(host, plan, answer)
        return address, network, problems, facts

    def _held_probe(self, plan: Plan, index: int, conn: Connection, request: FactsRequest) -> tuple[dict | None, str | None]:
        """Run the facts probe on a channel of its own that stays open once it answered (its stderr merged, as an
        agent's is), kept in ``_held`` to become the node's agent; (its answer, None) or (None, why not)."""
        host = self.targets[index].alias
        tag = {"LAUNCH_JOB_ID": plan.job_id, "LAUNCH_NODE": str(index)}  # the agent it may become is the job's
        argv = node_argv(plan.python, "facts", request)
        seen: list[str] = []
        try:
            channel = conn.exec(render_command(argv, tag, replace_shell=False), combine=True)
        except CONNECTION_ERRORS as exc:
            return None, f"{host}: connection lost: {exc}"
        since, lines = time.monotonic(), _channel_lines(channel)
        channel.settimeout(FACTS_TIMEOUT_S)
        try:
            for line in lines:
                if not line.startswith("{"):
                    seen.append(line)
                    continue
                answer = json.loads(line)
                channel.settimeout(None)
                with self._guard:
                    self._held[index] = HeldProbe(channel, lines, (plan.python, plan.job_id), since)
                return answer, None
        except TimeoutError:
            channel.close()
            return None, f"{host}: `{argv[0]}` did not answer within {FACTS_TIMEOUT_S:.0f} s"
        except CONNECTION_ERRORS as exc:
            channel.close()
            return None, f"{host}: connection lost: {exc}"
        except ValueError:
            channel.close()
            return None, f"unreadable answer: {line[:200]}"
        channel.status_event.wait(EXIT_STATUS_WAIT_S)
        channel.close()
        return None, "\n".join(seen).strip()[-300:] or f"exit {channel.exit_status}"

    def start(self, plan: Plan, context: StartContext) -> tuple[Plan, Sequence[SSHNode]]:
        """Sync and set up every node (once, all in parallel), then start every agent in parallel once they all
        hold their leases (waiting for them under ``queue: wait``)."""
        problems = self._prepare(plan, context)
        if problems:
            raise NodeStartError(
                "preparing the nodes failed; no agent was started:\n" + "\n".join(f"  {p}" for _, p in problems),
                node=problems[0][0],
            )
        return leasing.start_leased(self, plan, context, lambda: self._start_agents(plan, context))

    def _start_agents(self, plan: Plan, context: StartContext) -> tuple[Plan, list[SSHNode]]:
        """Every agent takes its leases; then all are told to go, or, if one could not, all to exit."""

        def lease_one(node: NodePlan) -> SSHNode:
            context.stage(Stage.START, node.index, node.host, StageState.RUNNING)
            start = agent_start(plan, node, context.grace, context.secrets, leasing.agent_lease(self, plan, node),
                                context.generation, context.record)
            with self._guard:
                held = self._held.pop(node.index, None)
            if held is not None and held.usable((plan.python, plan.job_id)):
                channel, stream = held.channel, held.lines  # preflight's probe reads the request and becomes the agent
            else:
                if held is not None:
                    held.channel.close()
                conn = self._pool.get(self.targets[node.index])
                tag = {"LAUNCH_JOB_ID": plan.job_id, "LAUNCH_NODE": str(node.index)}
                channel = conn.exec(render_command(start.argv, tag, node.cwd, replace_shell=False), combine=True)
                stream = None
            channel.sendall(start.stdin)
            handle = SSHNode(node.index, self, plan, channel, context.generation, stream)
            handle.wait_leased(START_TIMEOUT_S)
            return handle

        def start_one(handle: SSHNode) -> SSHNode:
            handle.answer(go=True)
            handle.wait_started(START_TIMEOUT_S)
            context.stage(Stage.START, handle.index, plan.nodes[handle.index].host, StageState.DONE)
            return handle

        leased = fan_out(lease_one, list(plan.nodes), self.pool.settings.fanout)
        handles = [r.got for r in leased if r.ok]
        failures = [(r.key.index, r.failure) for r in leased if not r.ok]
        if not failures:
            started = fan_out(start_one, handles, self.pool.settings.fanout)
            failures = [(r.key.index, r.failure) for r in started if not r.ok]
        if failures:
            for handle in handles:
                handle.answer(go=False)
            for handle in handles:
                handle.terminate(context.grace)
            busy = [error for _, error in failures if isinstance(error, leasing.LeasesBusy)]
            if busy:
                raise leasing.LeasesBusy("; ".join(str(error) for error in busy), busy[0].node)
            index, error = failures[0]
            raise NodeStartError(error_text(error), error.node if isinstance(error, NodeStartError) else index)
        return plan, handles

    def lease_devices(self, plan: Plan | None, index: int) -> tuple[str, int]:
        spec = self.cluster.nodes[index]  # a plan's node index is its cluster's (a smaller cluster: a new backend)
        return ("gpu", spec.gpus) if spec.gpus else ("slot", spec.capacity)

    def stream_command(self, plan: Plan, index: int, command: str, request: Request) -> SSHStream:
        conn = self._pool.get(self.targets[index])
        return SSHStream(conn.exec(render_command(node_argv(plan.python, command, request), replace_shell=False)))

    def _prepare(self, plan: Plan, context: StartContext) -> list[tuple[int, str]]:
        """(node index, problem) for every node whose sync or setup failed, in node order."""
        if not (self.cluster.sync_workdir or self.cluster.setup):
            return []

        def step(node: NodePlan) -> None:
            stage = Stage.SYNC if self.cluster.sync_workdir else Stage.SETUP
            context.stage(stage, node.index, node.host, StageState.RUNNING)
            conn = self._pool.get(self.targets[node.index])
            try:
                sync.prepare_node(conn, self.cluster, node, plan.job_id, context.run_dir / f"setup-node{node.index}.log")
            except BaseException:
                context.stage(stage, node.index, node.host, StageState.FAILED)
                raise
            context.stage(stage, node.index, node.host, StageState.DONE)

        return [(r.key.index, error_text(r.failure)) for r in fan_out(step, list(plan.nodes), self.pool.settings.fanout) if not r.ok]

    def host(self, plan: Plan | None, index: int) -> str:
        return self.targets[index].alias

    def follow(self, plan: Plan, index: int, after: int, agent: tuple[int, int | None] | None = None,
               generation: int = 0) -> FollowHandle:
        """Node ``index``'s journal after line ``after``: a channel running ``follow`` on its host (connecting
        again if the connection is gone). LaunchError or a connection error when the host cannot be reached."""
        conn = self._pool.get(self.targets[index])
        argv = node_argv(plan.python, "follow", follow_request(plan, index, after, generation))
        channel = conn.exec(render_command(argv, replace_shell=False))
        channel.shutdown_write()
        host = self.targets[index].alias

        def chunks() -> Iterator[bytes]:
            try:
                yield from iter(lambda: channel.recv(65536), b"")
            except CONNECTION_ERRORS as exc:
                handle.error = f"connection to {host} lost: {exc}"

        def close() -> None:
            if channel.get_transport().is_active():
                channel.status_event.wait(EXIT_STATUS_WAIT_S)
            if channel.recv_stderr_ready():
                handle.error = handle.error or channel.recv_stderr(4096).decode("utf-8", "replace").strip()[-300:]
            handle.error = handle.error or f"{host}: `follow` ended (exit {channel.exit_status})"
            channel.close()

        handle = FollowHandle(self, plan, index, whole_lines(chunks()), close, agent, generation)
        with self._guard:
            self._unreachable.discard(index)
        return handle

    def node_unreachable(self, index: int) -> None:
        self.mark_unreachable(index)

    def mark_unreachable(self, index: int) -> None:
        """Node ``index`` was lost: later commands to it try to connect for CLEANUP_CONNECT_S only."""
        with self._guard:
            self._unreachable.add(index)

    def run_on_node(self, plan: Plan | None, index: int, argv: list[str], timeout: float) -> CommandResult:
        """Run ``argv`` on node ``index`` (quoted by render_command); an unreachable node is the result.

        A node found unreachable once is retried with a short connect timeout, so clean-up never
        hangs on a dead host.
        """
        host = self.targets[index].alias
        with self._guard:
            quick = index in self._unreachable
        try:
            conn = self._pool.get(self.targets[index], timeout=CLEANUP_CONNECT_S if quick else None)
            result = conn.run(argv, timeout=timeout)
        except (LaunchError, *CONNECTION_ERRORS) as exc:
            with self._guard:
                self._unreachable.add(index)
            return unreachable(error_text(exc) if isinstance(exc, LaunchError) else f"{host}: cannot connect: {exc}")
        with self._guard:
            self._unreachable.discard(index)
        if result.code == -1:
            return unreachable(f"{host}: the connection closed before `{argv[0]}` finished")
        return CommandResult(result.code, result.out, result.err)

    def close(self) -> None:
        """Close every SSH connection (a probe kept and never told to start reads the end of its stdin and exits)."""
        with self._guard:
            held, self._held = self._held, {}
        for probe in held.values():
            probe.channel.close()
        self._pool.close()
