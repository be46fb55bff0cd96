"""The driver's handle on one node of a Ray job (``RayNode``): its agent's output pulled from the node's actor
(``launcher.backends.ray.actor``) in batches, its exit code, a node lost when its actor dies or falls silent, terminate.
"""

from __future__ import annotations

from collections.abc import Iterator

from launcher.backends import stopping
from launcher.backends.agents import agent_exit_code
from launcher.backends.base import NodeHandle
from launcher.backends.failures import LOST_NODE_EXIT

PULL_WAIT_S = 0.5
SILENCE_S = 10.0


class RayNode(NodeHandle):
    """A node agent's run, seen from the driver: output pulled in batches, exit code, terminate."""

    def __init__(self, index: int, actor, pid: int | None, ray) -> None:
        self.index = index
        self.pid = pid
        self._actor = actor
        self._ray = ray
        self._code: int | None = None

    def lines(self) -> Iterator[str]:
        """Output lines until the agent reports the exit; a last line says why if the agent is lost."""
        ray = self._ray
        while True:
            try:
                batch, code = ray.get(self._actor.pull.remote(PULL_WAIT_S), timeout=PULL_WAIT_S + SILENCE_S)
            except ray.exceptions.GetTimeoutError:
                self._lost(f"no answer from its Ray agent for {SILENCE_S:.0f} s (node down or cut off)")
                return
            except ray.exceptions.RayError as exc:  # the actor died, or its node, or the connection
                self._lost(f"its Ray agent died: {first_line(exc)}")
                return
            yield from batch
            if code is not None:
                self._exited(code)
                return

    def _exited(self, code: int) -> None:
        self._code = agent_exit_code(code) if code >= 0 else code

    def _lost(self, why: str) -> None:
        self.lost_reason = f"node {self.index} lost: {why}"
        self._code = LOST_NODE_EXIT

    def poll(self) -> int | None:
        """The agent's exit code once it has exited (asked of its actor: its output need not have been read);
        LOST_NODE_EXIT once the actor is gone; None while it runs or while the actor is slow to answer."""
        if self._code is not None:
            return self._code
        ray = self._ray
        try:
            code = ray.get(self._actor.exit_code.remote(), timeout=PULL_WAIT_S)
        except ray.exceptions.GetTimeoutError:
            return None  # lines() decides, after SILENCE_S, whether the node is lost
        except ray.exceptions.RayError as exc:
            self._lost(f"its Ray agent died: {first_line(exc)}")
            return self._code
        if code is not None:
            self._exited(code)
        return self._code

    def terminate(self, grace: float) -> None:
        """End the node's process group and tagged processes through its actor."""
        ray = self._ray
        try:
            ray.get(self._actor.terminate.remote(grace), timeout=grace + stopping.KILL_AFTER_S + SILENCE_S)
        except ray.exceptions.RayError:
            return  # actor gone with its node: the sweep that follows reports what is left


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (Ray's run long), or its type's name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
