"""An in-memory backend for unit tests of the supervisor's decisions (restarts, verdicts, attribution).

Each attempt is scripted: per node, the framed lines its agent prints, then either an exit code or
a wait until terminated; ``{now}`` in a kernel-log line becomes the time it is read. Nothing runs;
a test of the supervisor takes milliseconds. The real backends are tested with real processes
in tests/integration.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime

from launcher.backends.base import Backend, CommandResult, NodeHandle, Preflight, StartContext
from launcher.backends.failures import Failure
from launcher.backends.leasing import LeasesBusy
from launcher.errors import NodeStartError
from launcher.node.protocol import FrameKind, encode_frame, encode_output
from launcher.plan.planner import Plan
from launcher.spec.cluster import ClusterSpec


@dataclass
class NodeScript:
    """What one node does in one attempt: print ``lines``, then exit ``code`` (None: run until terminated)."""

    lines: list[str] = field(default_factory=list)
    code: int | None = 0
    lost: str | None = None
    fail_start: str | None = None
    busy: bool = False  # fail_start is another job holding the node's leases (LeasesBusy)
    wait_for: threading.Event | None = None  # printed only once this is set (another node's lines were read)
    then: threading.Event | None = None  # set once the supervisor has read all of ``lines``
    broken: bool = False  # the stream breaks after ``lines``: no exit known (out of contact)


def output(text: str) -> str:
    return encode_output(text).decode()


def sample(t: float, *ranks: dict) -> str:
    return encode_frame(FrameKind.SAMPLE, {"t": t, "ranks": list(ranks)}).decode()


def record(rank: int, step: int) -> str:
    """A metric record on rank ``rank``'s stream (torchrun's ``[rank]: `` prefix)."""
    return output(f"[{rank}]: @@launch " + json.dumps({"v": 1, "rank": rank, "step": step, "samples": 8, "interval_s": 0.1,
                                            "step_time_s": 0.1, "mem_peak_bytes": 1}))


class FakeNode(NodeHandle):
    def __init__(self, index: int, script: NodeScript) -> None:
        self.index = index
        self.pid = 1000 + index
        self.decided: Failure | None = None  # a scheduler's verdict on the node (``scheduler_failure``)
        self._script = script
        self._code: int | None = None
        self._done = threading.Event()
        self._stopped = threading.Event()
        self.terminated = False

    def lines(self) -> Iterator[str]:
        if self._script.wait_for is not None:
            self._script.wait_for.wait()
        yield from self._script.lines
        if self._script.then is not None:
            self._script.then.set()  # the reader asked for the line after the last: it has handled them all
        if self._script.broken:
            self.error = "connection lost"
            return
        if self._script.code is None and self._script.lost is None:
            self._stopped.wait()
        if self._script.lost is not None:
            self.lost_reason = self._script.lost
            self._code = 255
        else:
            self._code = -15 if self._stopped.is_set() else self._script.code
            yield encode_frame(FrameKind.EXIT, {"code": self._code}).decode()
        self._done.set()

    @property
    def scheduler_failure(self) -> Failure | None:
        return self.decided

    def poll(self) -> int | None:
        if self.lost_reason is not None:
            return 255
        return self._code if self._done.is_set() else None

    def terminate(self, grace: float) -> None:
        self.terminated = True
        if self._script.broken:
            return
        self._stopped.set()
        self._done.wait(5)


class FakeBackend(Backend):
    """Plays ``attempts[i]`` (one NodeScript per node) at the i-th start; remembers what it was asked."""

    name = "fake"

    def __init__(self, cluster: ClusterSpec, attempts: list[list[NodeScript]], kernel_log: list[str] | None = None,
                 stacks: dict[int, dict] | None = None) -> None:
        super().__init__(cluster)
        self.attempts = attempts
        self.started: list[list[FakeNode]] = []
        self.kernel = kernel_log or []
        self.stack_answers = stacks or {}
        self.swept_nodes = 0
        self.collected: list[tuple[int, object]] = []  # (node, request) of each `clean` once the job was filed
        self.closed = False
        self.followed: list[tuple[int, int]] = []
        self.unreachable: list[int] = []
        #: a node whose stream breaks is followed again
        self.capabilities = replace(self.capabilities, follows=any(script.broken for attempt in attempts for script in attempt))

    def follow(self, plan, index, after, agent=None, generation=0):
        self.followed.append((index, after))
        raise OSError(f"h{index + 1}: cannot connect: connection refused")

    def node_unreachable(self, index: int) -> None:
        self.unreachable.append(index)

    def preflight(self, plan: Plan) -> Preflight:
        return Preflight()

    def start(self, plan: Plan, context: StartContext) -> tuple[Plan, list[FakeNode]]:
        scripts = self.attempts[len(self.started)]
        for index, script in enumerate(scripts):
            if script.fail_start:
                self.started.append([])
                raise (LeasesBusy if script.busy else NodeStartError)(script.fail_start, index)
        nodes = [FakeNode(index, script) for index, script in enumerate(scripts)]
        self.started.append(nodes)
        return plan, nodes

    def run_on_node(self, plan: Plan | None, index: int, argv: list[str], timeout: float) -> CommandResult:
        raise AssertionError("the fake backend answers node commands in node_command")

    def node_command(self, plan, index, command, request, timeout=60.0):
        if command in ("end", "list"):
            self.swept_nodes += command == "end"
            return {"pids": []}, None
        if command == "facts":
            now = datetime.now().isoformat(timespec="seconds")  # the kernel stamps a line when it writes it
            return {"kernel_log": [line.replace("{now}", now) for line in self.kernel]}, None
        if command == "stacks":
            return self.stack_answers.get(index, {"ranks": []}), None
        if command == "clean":
            self.collected.append((index, request))
            return {"removed": [request.job_id], "kept": {}}, None
        raise AssertionError(f"unexpected node command {command}")

    def close(self) -> None:
        self.closed = True
