"""Ending a node agent: TERM, then KILL if it lingers; the one loop every backend uses.

Standard library only: the Ray actor (``launcher.backends.ray.actor``) runs it on the cluster's nodes,
where it is sent by value.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

#: beyond the grace period: the agent itself ends its command (TERM, KILL after grace), then the job's tagged processes
KILL_AFTER_S = 10.0


def term_then_kill(send: Callable[[int], object], ended: Callable[[float | None], bool], grace: float,
                   kill_wait: float | None = None) -> bool:
    """``send`` SIGTERM and wait (``ended(seconds)``: whether it ended within them) ``grace`` + KILL_AFTER_S;
    then SIGKILL and wait ``kill_wait`` seconds (None: until it ends). Whether it ended."""
    for sig, wait in ((signal.SIGTERM, grace + KILL_AFTER_S), (signal.SIGKILL, kill_wait)):
        send(sig)
        if ended(wait):
            return True
    return False


def stop_process(proc: subprocess.Popen, grace: float) -> None:
    """End a node agent this process started (see ``term_then_kill``); nothing if it has already exited."""
    if proc.poll() is None:
        term_then_kill(proc.send_signal, lambda wait: _exited(proc, wait), grace)


def _exited(proc: subprocess.Popen, timeout: float | None) -> bool:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return False
    return True
