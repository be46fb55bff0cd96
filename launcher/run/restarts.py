"""The restart policy: whether a failed attempt is restarted, and which failures say a host is at fault."""

from __future__ import annotations

from launcher.backends.failures import Failure, FailureKind

NODE_FAULTS = (FailureKind.EXIT, FailureKind.LOST, FailureKind.OOM)


def node_at_fault(failure: Failure | None) -> bool:
    """Whether the failure is one node's own (its processes exited, were OOM-killed, or it was lost).

    A stall names the node heard from least recently, and a start or setup failure is reported by every
    node alike, so neither says which host is broken.
    """
    return failure is not None and failure.node is not None and failure.kind in NODE_FAULTS


def why_not_restart(attempt: int, failure: Failure | None, restarts: int, restart_on: str, leave_out: bool) -> str | None:
    """Why this failure is not restarted (None: restart). With ``leave_out`` (``leave_out_failed_nodes``) a
    node's own failure is restarted whatever its kind: a host that fails twice is replaced, so it need not repeat."""
    if attempt >= restarts:
        return f"no restart left (restarts: {restarts})" if restarts else "restarts: 0"
    replaceable = leave_out and node_at_fault(failure)
    if failure is not None and not failure.transient and restart_on != "any" and not replaceable:
        return ("not restarted: this failure would repeat (restart_on: transient restarts only lost nodes, "
                "network/NCCL errors, signals from outside and hangs after progress; set restart_on: any to restart anyway)")
    return None
