"""Explain a failed node from its output: which rank, which exit code or signal, and why."""

from __future__ import annotations

import re
import signal
from typing import Any

_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
_HOST = re.compile(r"^\s*host\s*:\s*(\S+)")
_ROOT = "Root Cause (first observed failure)"
_DISPLAY_PREFIX = re.compile(r"^\[\d+(?:/\d+)?\] ")
LOST_NODE_EXIT = 255  # what a backend's poll() says for a node whose agent died unseen or went out of reach
_FAILED_AT = re.compile(r"^[EWI]\d{4} (\d\d):(\d\d):(\d\d(?:\.\d+)?) .*\] failed \(exitcode: (-?\d+)\)")


def signal_name(code: int | None) -> str | None:
    """``SIGKILL`` for -9 (a negative exit code is a signal), else None."""
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def parse_agent_failure(lines: list[str]) -> dict[str, Any]:
    """The root-cause rank and exit code from torchrun's failure report, if present.

    Lines may carry the ``[node/rank] `` display prefix. ``failed_at`` is the
    time of day (seconds) of the agent's "failed (exitcode...)" line, which
    orders failures across nodes more finely than their exits are noticed.
    """
    found: dict[str, Any] = {}
    failed_at = None
    in_root = False
    for raw in lines:
        line = _DISPLAY_PREFIX.sub("", raw, count=1)
        if failed_at is None and (match := _FAILED_AT.match(line)):
            failed_at = int(match[1]) * 3600 + int(match[2]) * 60 + float(match[3])
        if _ROOT in line:
            in_root, found = True, {}
            continue
        if not in_root:
            continue
        if match := _RANK.match(line):
            found["rank"], found["local_rank"] = int(match[1]), int(match[2])
        elif match := _EXIT.match(line):
            found["exit_code"], found["pid"] = int(match[1]), int(match[2])
        elif match := _HOST.match(line):
            found["host"] = match[1]
    if "exit_code" in found:
        found["signal"] = signal_name(found["exit_code"])
    if failed_at is not None:
        found["failed_at"] = failed_at
    return found


# (pattern, what it means, whether it is only the echo of another rank's failure)
# for lines in a failing rank's output, most specific first.
KNOWN_ERRORS: tuple[tuple[re.Pattern[str], str, bool], ...] = tuple(
    (re.compile(pattern, re.I), meaning, echo)
    for pattern, meaning, echo in (
        (r"CUDA out of memory|OutOfMemoryError", "CUDA out of memory: lower micro_batch, or use zero2/zero3 (see `launch plan`)", False),
        (r"Watchdog caught collective operation timeout", "NCCL watchdog timeout: a collective waited on a rank that stopped (check the other nodes)", True),
        (r"unhandled system error", "NCCL unhandled system error: usually the network (interface, IB HCA, firewall) between nodes", False),
        (r"\bXid\b", "GPU Xid error reported by the driver (see the node's kernel log)", False),
        (r"uncorrectable ECC error", "uncorrectable ECC error: a faulty GPU; drain this node", False),
        (r"illegal memory access", "CUDA illegal memory access (a kernel bug or a corrupted GPU)", False),
        (r"NCCL error|NCCL WARN", "NCCL error (run with env NCCL_DEBUG=INFO for details)", False),
        (r"Connection (closed|reset) by peer", "a peer rank went away (it failed or its node was lost)", True),
    )
)
ECHOES = frozenset(meaning for _, meaning, echo in KNOWN_ERRORS if echo)
_LAUNCH_NOTE = re.compile(r"\[launch\] (.*\blost\b.*)")
_OOM_KILL = re.compile(r"(out of memory: Killed process (\d+)|oom-kill:.*\bpid=(\d+))", re.I)


def explain(failure: dict[str, Any], rank_lines: list[str], kernel_log: list[str] = ()) -> str | None:
    """Why a rank failed, from its last lines, its signal and the node's kernel log."""
    code = failure.get("exit_code")
    pid = failure.get("pid")
    if code == -9:
        for line in kernel_log:
            match = _OOM_KILL.search(line)
            if match and (pid is None or str(pid) in (match[2], match[3])):
                return f"killed by the kernel's OOM killer (host memory): {line.strip()}"
    for line in reversed(rank_lines):
        if match := _LAUNCH_NOTE.search(line):
            return match[1]
        for pattern, meaning, _ in KNOWN_ERRORS:
            if pattern.search(line):
                return meaning
    if code in (-6, -11, -7, -4):
        return f"the process crashed ({signal_name(code)}): see its last lines"
    if code == -9:
        return "killed (SIGKILL): by the OOM killer, a user or a scheduler; no OOM line in the kernel log"
    return None


def agent_lost(exit_code: int | None) -> bool:
    """Whether a node agent's exit code says the agent itself died or went out of reach (not that a rank failed):
    unknown, killed by a signal, or 255 (the SSH and Ray backends' code for a lost node)."""
    return exit_code is None or exit_code < 0 or exit_code == LOST_NODE_EXIT


def precedence(failure: dict[str, Any]) -> tuple:
    """Sort key: which of several failures came first, the cause rather than its echoes.

    A node whose agent died or whose connection was lost comes first, then a
    rank that failed on its own, then ranks that only saw a peer go away, then
    a node that exited normally without a failure report we could read (a
    launcher that names no rank, or a report still in the pipe); within a
    class, the earliest agent "failed" time, then node order.
    """
    if failure.get("rank") is None:
        klass = 0 if agent_lost(failure.get("exit_code")) else 3
    elif failure.get("reason") in ECHOES:
        klass = 2
    else:
        klass = 1
    failed_at = failure.get("failed_at")
    return (klass, failed_at is None, failed_at or 0.0, failure.get("node", 0))


def describe(failure: dict[str, Any]) -> str:
    """One line for users: where it failed first and how."""
    if failure.get("stalled_s") is not None:
        return failure["reason"]
    where = f"node {failure.get('node')}"
    if failure.get("host"):
        where += f" ({failure['host']})"
    if failure.get("rank") is not None:
        where += f", rank {failure['rank']}"
    code = failure.get("exit_code")
    how = f"exit code {code}" if code is not None else "lost"
    if failure.get("signal"):
        how += f" ({failure['signal']})"
    reason = f": {failure['reason']}" if failure.get("reason") else ""
    return f"first failure: {where}, {how}{reason}"
