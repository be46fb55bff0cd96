"""The embedded default backend: every node of the plan is a node agent on this machine.

The local cluster describes this machine as it is: ``local.slots`` defaults to the CPUs this
process may use and ``local.gpus`` to the GPUs found (see ``launcher.backends.local.host``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import ClassVar

from launcher.backends import leasing
from launcher.backends.agents import agent_exit_code, agent_start
from launcher.backends.base import Backend, CommandResult, NodeHandle, Preflight, Stage, StageState, StartContext
from launcher.backends.follow import FollowHandle, follow_request, whole_lines
from launcher.backends.local.planning import LocalPlanning
from launcher.backends.local.spec import LocalCluster
from launcher.backends.nodechecks import FACTS_TIMEOUT_S, facts_request, node_problems, parse_facts
from launcher.backends.stopping import stop_process
from launcher.errors import NodeStartError
from launcher.node.follow import collect
from launcher.node.protocol import CleanRequest, FactsRequest, Frame, FrameKind, Request, early_output, parse
from launcher.node.ship import node_argv, stdin_argv
from launcher.plan.planner import NodePlan, Plan

STDOUT_CLOSED_WAIT_S = 1.0  # an agent whose stdout closed exits within this, unless fenced (else: followed again)
START_TIMEOUT_S = 60.0  # an agent that has not taken its leases, or not started its command, this long is ended


class LocalNode(NodeHandle):
    """A node agent in its own session on this machine."""

    def __init__(self, index: int, proc: subprocess.Popen) -> None:
        self.index = index
        self.pid = proc.pid
        self._proc = proc
        self._first: list[str] = []

    def _within(self, read: Callable[[], object], timeout: float, what: str, seen: list[str]) -> None:
        """``read()`` (of the agent's first lines, kept in ``seen``) if it returns within ``timeout``; else
        NodeStartError (the caller ends the agent: its stdout then closes and the reading thread ends)."""
        done: list[BaseException | None] = []

        def run() -> None:
            try:
                read()
                done.append(None)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread, which raises it
                done.append(exc)

        thread = threading.Thread(target=run, daemon=True, name=f"agent{self.index}-start")
        thread.start()
        thread.join(timeout)
        if not done:
            shown = early_output(list(seen))
            raise NodeStartError(f"localhost: the node agent did not {what} within {timeout:.0f} s"
                                 f"{': ' + shown if shown else ''}", self.index)
        if done[0] is not None:
            raise done[0]

    def wait_leased(self, timeout: float = START_TIMEOUT_S) -> None:
        """Read up to the agent's ``leased`` frame (LeasesBusy on ``busy``); those lines are not the journal's.
        NodeStartError if it says neither within ``timeout``."""
        assert self._proc.stdout is not None
        stdout, seen = self._proc.stdout, []

        def lines() -> Iterator[str]:
            for raw in iter(stdout.readline, b""):
                seen.append(raw.decode("utf-8", "replace").rstrip("\n"))
                yield seen[-1]

        def read() -> None:
            self.leased = leasing.read_until_leased(lines(), "localhost", self.index)

        self._within(read, timeout, "take its leases", seen)

    def answer(self, go: bool) -> None:
        """Tell an agent holding its leases to start (``go``), or, closing its stdin without, to exit."""
        assert self._proc.stdin is not None
        try:
            if go:
                self._proc.stdin.write(b"go\n")
            self._proc.stdin.close()
        except OSError:
            pass  # the agent exited: wait_started reports it

    def wait_started(self, timeout: float = START_TIMEOUT_S) -> None:
        """Read up to the agent's ``started`` frame; NodeStartError with its output if it exits first, or says
        nothing of the kind within ``timeout`` (a hung agent never hangs `launch submit`)."""
        self._within(self._read_started, timeout, "start its command", self._first)

    def _read_started(self) -> None:
        assert self._proc.stdout is not None
        for raw in iter(self._proc.stdout.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self._first.append(line)
            parsed = parse(line)
            if isinstance(parsed, Frame) and parsed.kind is FrameKind.STARTED:
                return
        self._proc.wait()
        shown = early_output(self._first)
        raise NodeStartError(f"localhost: the node agent exited {self._proc.returncode}: {shown or 'no output'}", self.index)

    def lines(self) -> Iterator[str]:
        assert self._proc.stdout is not None
        yield from self._first
        for raw in iter(self._proc.stdout.readline, b""):
            if not raw.endswith(b"\n"):  # cut short as the agent exited mid-write: its journal has it whole
                break
            yield raw.decode("utf-8", "replace")[:-1]
        self._proc.stdout.close()
        try:  # its stdout closes as it exits (its code is then known), or when a newer supervisor took the job
            self._proc.wait(STDOUT_CLOSED_WAIT_S)
        except subprocess.TimeoutExpired:
            self.error = "the agent closed its output without exiting"  # followed again: its journal says why

    def poll(self) -> int | None:
        code = self._proc.poll()
        return None if code is None else agent_exit_code(code)

    def terminate(self, grace: float) -> None:
        """TERM the agent (it ends its command's group and the job's tagged processes); KILL it if it lingers."""
        stop_process(self._proc, grace)


class LocalStream:
    """A long node command on this machine (``leasing.NodeStream``): its stdout lines; ``close`` closes its stdin."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self._proc = proc

    def lines(self) -> Iterator[str]:
        assert self._proc.stdout is not None
        for raw in iter(self._proc.stdout.readline, b""):
            yield raw.decode("utf-8", "replace").rstrip("\n")

    def close(self) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        stop_process(self._proc, 2.0)
        if self._proc.stdout is not None:
            self._proc.stdout.close()


def _release(agent: subprocess.Popen) -> None:
    """An agent interpreter that was never given a request: closing its stdin makes it exit, having done nothing."""
    if agent.stdin is not None:
        agent.stdin.close()
    try:
        agent.wait(STDOUT_CLOSED_WAIT_S)
    except subprocess.TimeoutExpired:
        stop_process(agent, STDOUT_CLOSED_WAIT_S)
    if agent.stdout is not None:
        agent.stdout.close()


class LocalBackend(Backend[LocalCluster]):
    """Runs the plan's nodes as node agents on this machine (gloo on CPU slots, or local GPUs)."""

    name: ClassVar[str] = "local"
    planning_class = LocalPlanning

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(cluster)
        self._warm: dict[int, tuple[tuple, subprocess.Popen]] = {}  # node index -> (_agent_key, agent) from ``warm``

    def host(self, plan: Plan | None, index: int) -> str:
        return "localhost"

    def _facts(self, plan: Plan) -> Preflight:
        """This machine's facts and, in the same probe, who holds the slots or GPUs the job needs."""
        wanted = leasing.preflight_request(self, plan, 0)
        request = dataclasses.replace(facts_request(plan, 0), leases=wanted)
        answer, error = self._facts_answer(plan, request)
        if answer is None:
            return Preflight(problems=[f"localhost: interpreter '{plan.python}' cannot run the node probe: {error}"
                                       " (cluster.yaml python)"])
        facts, problem = parse_facts("localhost", answer)
        if facts is None:
            return Preflight(problems=[problem or "localhost: no facts"])
        problems = node_problems("localhost", plan, facts)
        if not problems and wanted:
            problems = leasing.preflight_problems("localhost", plan, answer)
        return Preflight(problems=problems, facts={0: facts}, hint=leasing.hint(problems))

    def _facts_answer(self, plan: Plan, request: FactsRequest) -> tuple[dict | None, str | None]:
        """The facts probe's answer. Under this process's own interpreter it runs here, in process: the node is this
        machine and the interpreter the same, so the answer is the one a probe process would give, without the
        ~0.1 s of starting one on the way to the job's start. Any other interpreter is probed by running it."""
        if plan.python != sys.executable:
            return self.node_command(plan, 0, "facts", request, timeout=FACTS_TIMEOUT_S)
        from launcher.node import facts

        return json.loads(json.dumps(facts.answer(request))), None

    def lease_devices(self, plan: Plan | None, index: int) -> tuple[str, int]:
        local = self.cluster.local
        return ("gpu", local.gpus) if local.gpus else ("slot", local.slots or 1)

    def start(self, plan: Plan, context: StartContext) -> tuple[Plan, Sequence[LocalNode]]:
        """Every node's agent, once they all hold their leases (waiting for them under ``queue: wait``)."""
        return leasing.start_leased(self, plan, context, lambda: self._start_agents(plan, context))

    def warm(self, plan: Plan) -> None:
        """Start every node's agent interpreter now: it loads while preflight and the supervisor's set-up run, then
        waits for its request (``_start_agents`` writes it). One never given a request reads the end of its stdin
        when ``close`` closes it, and exits having done nothing (it holds no lease and started nothing)."""
        for node in plan.nodes:
            self._warm[node.index] = (self._agent_key(plan, node), self._spawn_agent(plan, node))

    def collect(self, plan: Plan, index: int, request: CleanRequest) -> tuple[dict | None, str | None]:
        """As the ``clean`` node command, in this process: the agents are this machine's, run with this environment
        (no interpreter started at every job's end)."""
        if request.job_id is None or request.filed_by is None:
            return None, "no job or job store to collect for"
        removed, kept = collect(request.job_id, request.filed_by)
        return {"removed": removed, "kept": kept}, None

    def close(self) -> None:
        """Let the agents started by ``warm`` and never used go."""
        warm, self._warm = self._warm, {}
        for _, proc in warm.values():
            _release(proc)

    @staticmethod
    def _agent_key(plan: Plan, node: NodePlan) -> tuple:
        """What an agent's process is started with: a warm one serves only a node that would be started the same."""
        return plan.python, node.cwd, plan.job_id

    def _spawn_agent(self, plan: Plan, node: NodePlan) -> subprocess.Popen:
        """Node ``node``'s agent interpreter, waiting for its request on stdin."""
        try:
            return subprocess.Popen(
                stdin_argv(plan.python, "agent"), cwd=node.cwd,
                env={**os.environ, "LAUNCH_JOB_ID": plan.job_id, "LAUNCH_NODE": str(node.index)},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            )
        except OSError as exc:
            if not os.path.isdir(node.cwd):  # Popen's error would name the interpreter, which is there
                raise NodeStartError(f"localhost: the job's workdir {node.cwd} is not a directory (cluster.yaml workdir)",
                                     node.index) from None
            raise NodeStartError(f"localhost: cannot run {plan.python}: {exc.strerror or exc}", node.index) from None

    def _agent_process(self, plan: Plan, node: NodePlan) -> subprocess.Popen:
        """The node's warm agent if ``warm`` started one for it as it would be started now, else a new one."""
        key, proc = self._warm.pop(node.index, (None, None))
        if proc is not None and key == self._agent_key(plan, node) and proc.poll() is None:
            return proc
        if proc is not None:
            _release(proc)
        return self._spawn_agent(plan, node)

    def _start_agents(self, plan: Plan, context: StartContext) -> tuple[Plan, list[LocalNode]]:
        handles: list[LocalNode] = []
        try:
            for node in plan.nodes:
                context.stage(Stage.START, node.index, node.host, StageState.RUNNING)
                lease = leasing.agent_lease(self, plan, node)
                start = agent_start(plan, node, context.grace, context.secrets, lease, context.generation, context.record)
                proc = self._agent_process(plan, node)
                handle = LocalNode(node.index, proc)
                handles.append(handle)
                assert proc.stdin is not None
                try:
                    proc.stdin.write(start.stdin)
                    proc.stdin.flush()
                except BrokenPipeError:
                    pass  # the agent exited at once: wait_started reports its output
            for handle in handles:
                handle.wait_leased()
            for handle in handles:
                handle.answer(go=True)
            for handle in handles:
                handle.wait_started()
                context.stage(Stage.START, handle.index, "localhost", StageState.DONE)
        except BaseException:
            for handle in handles:
                handle.answer(go=False)
            for handle in handles:
                handle.terminate(context.grace)
            raise
        return plan, handles

    def preflight(self, plan: Plan) -> Preflight:
        """The facts of this machine, and (unless the job waits for them) who holds the slots or GPUs it needs."""
        return self._facts(plan)

    def stream_command(self, plan: Plan, index: int, command: str, request: Request) -> LocalStream:
        argv = node_argv(plan.python, command, request)
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    start_new_session=True)
        except OSError as exc:
            raise NodeStartError(f"localhost: cannot run {plan.python}: {exc.strerror or exc}", index) from None
        return LocalStream(proc)

    def follow(self, plan: Plan, index: int, after: int, agent: tuple[int, int | None] | None = None,
               generation: int = 0) -> FollowHandle:
        """Node ``index``'s journal after line ``after``: a ``follow`` node command on this machine."""
        argv = node_argv(plan.python, "follow", follow_request(plan, index, after, generation))
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            raise NodeStartError(f"localhost: cannot run {plan.python}: {exc.strerror or exc}", index) from None
        assert proc.stdout is not None and proc.stderr is not None
        stdout, stderr = proc.stdout, proc.stderr

        def close() -> None:
            stdout.close()
            if proc.poll() is None:
                stop_process(proc, 1.0)
            handle.error = handle.error or (stderr.read(4096).decode("utf-8", "replace").strip()[-300:]
                                            or f"`follow` exited {proc.wait()}")
            stderr.close()

        handle = FollowHandle(self, plan, index, whole_lines(iter(lambda: os.read(stdout.fileno(), 65536), b"")), close, agent,
                              generation)
        return handle

    def run_on_node(self, plan: Plan | None, index: int, argv: list[str], timeout: float) -> CommandResult:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return CommandResult(124, "", f"`{argv[0]}` did not finish within {timeout:.0f} s")
        except OSError as exc:
            return CommandResult(127, "", f"cannot run {argv[0]}: {exc.strerror or exc}")
        return CommandResult(done.returncode, done.stdout, done.stderr)
