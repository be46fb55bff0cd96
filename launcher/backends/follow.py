"""Following a node's journal again (``launch_node follow``; docs/JOURNALS.md): the request, the reader of its
lines (the agent's ``exit``, ``lost``, a newer supervisor's ``fenced``) and the handle ``Backend.follow`` gives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from launcher.backends.base import NodeHandle
from launcher.backends.failures import LOST_NODE_EXIT
from launcher.backends.stopping import term_then_kill
from launcher.node.protocol import FollowRequest, Frame, FrameKind, SignalRequest, parse
from launcher.plan.planner import Plan

if TYPE_CHECKING:
    from launcher.backends.base import Backend


class Followed:
    """What a reader of a node's journal (``launch_node follow``) learns from the lines it passes on: the agent's
    ``@exit`` code, or its ``@lost`` reason (the agent died without one). A backend's follow handle wraps its line
    stream with ``through`` and answers ``poll`` from ``code``."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.exit: int | None = None
        self.lost: str | None = None
        self.fenced: dict | None = None  # the newer generation's record, when the node refused this reader

    def through(self, lines: Iterator[str]) -> Iterator[str]:
        for line in lines:
            parsed = parse(line)
            if isinstance(parsed, Frame) and parsed.kind is FrameKind.FENCED:  # not a journal line: the node's answer
                self.fenced = fenced_record(parsed)
                return
            if isinstance(parsed, Frame) and parsed.kind is FrameKind.EXIT:
                self.exit = parsed.get_int("code")
            elif isinstance(parsed, Frame) and parsed.kind is FrameKind.LOST:
                why = parsed.get_text("reason")
                self.lost = f"{self.host}: its node agent is gone without an exit ({why or 'no reason given'})"
            yield line

    def code(self) -> int | None:
        """The agent's exit code, LOST_NODE_EXIT once it is known lost, None while neither is known."""
        if self.exit is not None:
            return self.exit
        return LOST_NODE_EXIT if self.lost is not None else None


class FollowHandle(NodeHandle):
    """A node followed through its journal (``Backend.follow``): ``lines`` the journal's lines after those the
    reader had, until its agent's ``@exit`` (or ``@lost``); ``poll`` answers from them; ``terminate`` signals
    the agent by PID and start time (when recorded) through the backend's ``signal`` node command.
    ``error``: why the stream ended when it ended without an answer (the reader then tries again)."""

    def __init__(self, backend: Backend, plan: Plan, index: int, lines: Iterator[str], close: Callable[[], None],
                 agent: tuple[int, int | None] | None, generation: int) -> None:
        self.index = index
        self.pid = agent[0] if agent else None
        self.start_ticks: int | None = agent[1] if agent else None
        self._backend, self._plan, self._generation = backend, plan, generation
        self._followed = Followed(backend.host(plan, index))
        self._source, self._close = lines, close
        self._ended = threading.Event()

    def lines(self) -> Iterator[str]:
        try:
            yield from self._followed.through(self._source)
        finally:
            self._close()
            self.lost_reason = self.lost_reason or self._followed.lost
            self._ended.set()

    def poll(self) -> int | None:
        return LOST_NODE_EXIT if self.lost_reason is not None else self._followed.code()

    @property
    def fenced(self) -> dict | None:
        """The newer supervisor generation's record when the node refused to be followed by this one."""
        return self._followed.fenced

    def terminate(self, grace: float) -> None:
        """TERM the agent (it ends its node's processes and journals @exit), then KILL it; the sweep does the rest."""
        if self.poll() is not None or self.pid is None:
            return
        term_then_kill(self._signal, lambda wait: self._ended.wait(wait) or self.poll() is not None, grace, kill_wait=5.0)

    def _signal(self, sig: int) -> None:
        assert self.pid is not None
        self._backend.fenced_command(self._plan, self.index, "signal",
                                     SignalRequest(pid=self.pid, signal=int(sig), start_ticks=self.start_ticks),
                                     self._generation, timeout=30)


def whole_lines(chunks: Iterator[bytes]) -> Iterator[str]:
    """The whole (newline-ended) lines of a byte stream, decoded; a last line without its newline is not one
    (a reader that resumes gets it again, whole)."""
    pending = bytearray()
    for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            pending += chunk[start:end]
            yield pending.decode("utf-8", "replace")
            pending.clear()
            start = end + 1
        pending += chunk[start:]


def follow_request(plan: Plan, index: int, after: int, generation: int = 0) -> FollowRequest:
    """The ``follow`` node command's request: node ``index``'s journal after line ``after``, for a supervisor of
    ``generation`` (refused with a ``fenced`` frame once the node records a newer one)."""
    return FollowRequest(plan.job_id, index, after, generation)


def fenced_record(frame: Frame) -> dict:
    """The generation record of a ``fenced`` frame (``{"generation": N, "pid", "host"}``), as far as it reads."""
    return {"generation": frame.get_int("generation"), "pid": frame.get_int("pid"), "host": frame.get_text("host", 200)}
