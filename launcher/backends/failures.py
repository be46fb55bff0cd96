"""The failure record: which node and rank failed first, how, why, and whether a restart can help.

Trust: the record's facts come from launch's own observations (a node agent's exit code, a lost
connection, the kernel log, the process tree the agent sampled). Rank output is untrusted: it
may only choose one of the fixed explanations in ``KNOWN_ERRORS`` or name a rank within the
job's world size through torchrun's failure report; its text never becomes a reason. torchrun's
structured error file (``RecordedError``) comes first: the exit code torchrun saw for its first failed
rank, and that rank's recorded exception (untrusted too: it only chooses among ``KNOWN_ERRORS``).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from launcher.store.states import FailureKind  # with the job's states: the store keeps a job's failure kind

LOST_NODE_EXIT = 255  # what a backend's poll() says for a node whose agent died unseen or went out of reach
DEEPSPEED_KILLED_EXIT = 247  # DeepSpeed's launcher exits 256 - 9 when a rank got SIGKILL
SHELL_KILLED_EXIT = 137  # 128 + 9: a shell's or a container runtime's code for SIGKILL


class Failure(BaseModel):
    """The first failure of an attempt, as ``status --json`` shows it under ``first_failure``."""

    model_config = ConfigDict(extra="ignore")

    kind: FailureKind = FailureKind.EXIT
    node: int | None = None
    host: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    signal: str | None = None
    pid: int | None = None
    observed: int | None = Field(None, description="when the supervisor saw the node fail, as a sequence number it "
                                 "assigns (its failure report, else its exit): the order of failures across nodes")
    detected_at: float | None = None
    step: int | None = None
    stalled_s: float | None = None
    reason: str | None = None
    transient: bool = Field(False, description="whether a restart can help (restart_on: transient)")
    last_lines: list[str] = Field(default_factory=list)

    def describe(self) -> str:
        """One line for users: where it failed first and how."""
        if self.kind in (FailureKind.STALL, FailureKind.HANG, FailureKind.INTERNAL, FailureKind.PREFLIGHT):
            return self.reason or self.kind.value
        where = f"node {self.node}"
        if self.host:
            where += f" ({self.host})"
        if self.rank is not None:
            where += f", rank {self.rank}"
        how = f"exit code {self.exit_code}" if self.exit_code is not None else "lost"
        if self.signal:
            how += f" ({self.signal})"
        if self.kind in (FailureKind.START, FailureKind.LEASES):
            how = "could not start"
        reason = f": {self.reason}" if self.reason else ""
        return f"first failure: {where}, {how}{reason}"


def signal_name(code: int | None) -> str | None:
    """``SIGKILL`` for -9 (a negative exit code is a signal), else None."""
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


_RANK = re.compile(r"^\s*rank\s*:\s*(\d{1,7})\s*\(local_rank:\s*(\d{1,7})\)")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d{1,4})\s*\(pid:\s*(\d{1,9})\)")
_ROOT = "Root Cause (first observed failure)"
_DISPLAY_PREFIX = re.compile(r"^\[\d+(?:/\d+)?\] ")
_AGENT_FAILED = re.compile(r"^[EWI]\d{4} \d\d:\d\d:\d\d(?:\.\d+)? .*\] failed \(exitcode: -?\d+\)")


class AgentReport(BaseModel):
    """What torchrun's failure report (in a node's output) names: the root-cause rank and its exit; with its
    error file, the rank's recorded exception (``message``, untrusted)."""

    rank: int | None = None
    local_rank: int | None = None
    exit_code: int | None = None
    pid: int | None = None
    message: str | None = None


@dataclass(frozen=True)
class RecordedError:
    """What a node's torchrun recorded in its structured error file (``launcher.node.torchelastic``): its first
    failed rank's exception as that rank's ``@record`` wrote it (or torchrun's own), and the exit code torchrun
    saw for that rank (None for torchrun's own error)."""

    message: str
    exit_code: int | None


def with_recorded(recorded: RecordedError | None, reports: list[AgentReport]) -> list[AgentReport]:
    """The node's failed ranks, torchrun's error file first: its exit code and message go to the root cause
    (the same rank torchrun's report names first: both are its first failure); the report's text still names
    the rank, and the other failures. Without a file, the report as it is."""
    if recorded is None:
        return reports
    root = reports[0] if reports else AgentReport()
    update: dict[str, object] = {"message": recorded.message}
    if recorded.exit_code is not None:
        update["exit_code"] = recorded.exit_code
    return [root.model_copy(update=update), *reports[1:]]


def is_agent_failed_line(line: str) -> bool:
    """Whether a line (display prefix allowed) is torchrun's "failed (exitcode: ...)" line: its node's first sign of failure.

    The line's own time of day is not used to order failures: it is node-local (clocks differ between nodes)
    and wraps at midnight. The supervisor orders failures by when it saw these lines instead.
    """
    return _AGENT_FAILED.match(_DISPLAY_PREFIX.sub("", line, count=1)) is not None


def parse_agent_failure(lines: Iterable[str], world_size: int | None = None) -> list[AgentReport]:
    """The ranks torchrun's failure report names, the root cause first, then the other failures.

    Lines may carry the ``[node/rank] `` display prefix. A rank outside ``world_size`` is ignored.
    Empty when there is no report (another launcher, or the report is still in the pipe).
    """
    sections: dict[str, list[AgentReport]] = {"root": [], "other": []}
    section: list[AgentReport] | None = None
    for raw in lines:
        line = _DISPLAY_PREFIX.sub("", raw, count=1)
        if _ROOT in line or line.strip() == "Failures:":
            section = sections["root" if _ROOT in line else "other"] = []
            continue
        if section is None:
            continue
        if (match := _RANK.match(line)) and (world_size is None or int(match[1]) < world_size):
            section.append(AgentReport(rank=int(match[1]), local_rank=int(match[2])))
        elif (match := _EXIT.match(line)) and section and section[-1].exit_code is None:
            section[-1].exit_code, section[-1].pid = int(match[1]), int(match[2])
    root = sections["root"][:1]
    return root + [r for r in sections["other"] if not root or r.rank != root[0].rank]


# (pattern, what it means, whether it is only the echo of another rank's failure, whether a restart can help)
# for lines in a failing rank's output, most specific first.
KNOWN_ERRORS: tuple[tuple[re.Pattern[str], str, bool, bool], ...] = tuple(
    (re.compile(pattern, re.I), meaning, echo, transient)
    for pattern, meaning, echo, transient in (
        (r"CUDA out of memory|OutOfMemoryError", "CUDA out of memory: lower micro_batch, or use zero2/zero3 (see `launch plan`)", False, False),
        (r"Watchdog caught collective operation timeout",
         "NCCL watchdog timeout: a collective waited on a rank that stopped (check the other nodes)", True, True),
        (r"unhandled system error", "NCCL unhandled system error: usually the network (interface, IB HCA, firewall) between nodes", False, True),
        (r"\bXid\b", "GPU Xid error reported by the driver (see the node's kernel log)", False, True),
        (r"uncorrectable ECC error", "uncorrectable ECC error: a faulty GPU; drain this node", False, True),
        (r"illegal memory access", "CUDA illegal memory access (a kernel bug or a corrupted GPU)", False, False),
        (r"NCCL error|NCCL WARN", "NCCL error (run with env NCCL_DEBUG=INFO for details)", False, True),
        (r"terminate called without an active exception", "a C++ thread was still running when the process ended: with gloo or NCCL, "
         "free the model, then call torch.distributed.destroy_process_group() at the end of the program", False, False),
        (r"Connection (closed|reset) by peer", "a peer rank went away (it failed or its node was lost)", True, True),
        (r"^(ModuleNotFoundError|ImportError|SyntaxError)\b", "the program could not be imported (a missing module or a syntax error)", False, False),
    )
)
ECHOES = frozenset(meaning for _, meaning, echo, _ in KNOWN_ERRORS if echo)
# A scheduler's verdict on a node it ended because another node of the job failed (Slurm's NODE_FAIL): never the cause
ENDED_FOR_ANOTHER_NODE = "ended by the scheduler because another node of the job failed"
_OOM_KILL = re.compile(r"(out of memory: Killed process (\d+)|oom-kill:.*\bpid=(\d+))", re.I)
_KERNEL_TIME = re.compile(r"^\s*(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")
KILLED_CODES = (-signal.SIGKILL, SHELL_KILLED_EXIT, DEEPSPEED_KILLED_EXIT)


def oom_kill(kernel_log: Sequence[str], pids: Iterable[int], since: float | None = None) -> str | None:
    """The kernel's OOM-killer line that killed one of ``pids`` (the job's processes on the node), if any.

    Lines are ``dmesg --time-format iso`` lines; with ``since`` (epoch seconds) older ones are ignored,
    so a reused PID from an earlier OOM kill is not blamed.
    """
    wanted = {str(pid) for pid in pids}
    for line in reversed(kernel_log):
        match = _OOM_KILL.search(line)
        if not match or (match[2] or match[3]) not in wanted:
            continue
        if since is not None and (stamp := _KERNEL_TIME.match(line)):
            try:
                if datetime.fromisoformat(stamp[1]).timestamp() < since - 1:
                    continue
            except ValueError:
                pass
        return line.strip()[:300]
    return None


def oom_pid(line: str) -> int | None:
    """The PID an OOM-killer line names."""
    match = _OOM_KILL.search(line)
    return int(match[2] or match[3]) if match else None


def classify(failure: Failure, rank_lines: Sequence[str], oom_line: str | None, progressed: bool,
             step: int | None = None) -> Failure:
    """Fill in ``kind``, ``reason`` and ``transient`` from launch's observations and the rank's last lines.

    ``progressed``: whether the attempt made progress (a metric record arrived) before it failed;
    an exception raised before the first step will be raised again, so it is not transient.
    ``step``: the last step observed (a record's), said in the reason of an error after it.
    """
    code = failure.exit_code
    if oom_line is not None:
        return failure.model_copy(update={
            "kind": FailureKind.OOM, "transient": False,
            "reason": f"killed by the kernel's OOM killer (host memory): {oom_line}",
        })
    if failure.kind == FailureKind.LOST:
        return failure.model_copy(update={"transient": True})
    for line in reversed(rank_lines):
        for pattern, meaning, _, transient in KNOWN_ERRORS:
            if pattern.search(_DISPLAY_PREFIX.sub("", line, count=1).lstrip()):
                return failure.model_copy(update={"reason": meaning, "transient": transient})
    if code in (-6, -11, -7, -4):
        return failure.model_copy(update={"reason": f"the process crashed ({signal_name(code)}): see its last lines",
                                          "transient": False})
    if code in KILLED_CODES:
        return failure.model_copy(update={
            "reason": "killed (SIGKILL) by a user, a scheduler or the OOM killer; no OOM-killer line names the job's processes",
            "transient": True,
        })
    if code is not None and code < 0:
        return failure.model_copy(update={"reason": f"ended by {signal_name(code)} from outside the job", "transient": True})
    if not progressed:
        reason: str | None = "it failed before the first step (an error that will repeat on a restart)"
    else:
        reason = f"it failed after step {step}, the last step observed (see its last lines)" if step else None
    return failure.model_copy(update={"reason": reason, "transient": progressed})


def agent_lost(exit_code: int | None) -> bool:
    """Whether a node agent's exit code says the agent itself died or went out of reach (not that a rank failed):
    unknown, killed by a signal, or 255 (the backends' code for a lost node)."""
    return exit_code is None or exit_code < 0 or exit_code == LOST_NODE_EXIT


def precedence(failure: Failure) -> tuple[int, bool, int, int]:
    """Sort key: which of several failures came first, the cause rather than its echoes.

    A node lost or killed by the OOM killer comes first, then a rank that failed on its own,
    then ranks that only saw a peer go away, then a node that exited without a failure report
    we could read (a launcher that names no rank, or a report still in the pipe), last a node the
    scheduler ended because another failed; within a
    class, the one the supervisor observed first (``observed``), then node order.
    """
    if failure.reason is not None and failure.reason.startswith(ENDED_FOR_ANOTHER_NODE):
        klass = 4
    elif failure.kind in (FailureKind.LOST, FailureKind.OOM):
        klass = 0
    elif failure.rank is None:
        klass = 0 if agent_lost(failure.exit_code) else 3
    elif failure.reason in ECHOES:
        klass = 2
    else:
        klass = 1
    return (klass, failure.observed is None, failure.observed or 0, failure.node or 0)
