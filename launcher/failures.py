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
