"""Which rank of a failed node failed, how and why: a ``Failure`` from what its watcher saw.

The facts come from launch's own observations (the agent's exit code, a lost connection, the
kernel log, the PIDs the agent sampled); rank output only picks among ``failures.KNOWN_ERRORS``.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass

from launcher.backends import failures
from launcher.backends.base import Backend
from launcher.backends.failures import Failure, FailureKind
from launcher.plan.planner import Plan
from launcher.run.liveness import Liveness
from launcher.run.watcher import NodeWatcher

PROGRESS_PROXY_S = 120.0  # a program neither reporting nor observed (no step hooks) that ran this long has progressed


@dataclass(frozen=True)
class NodeExit:
    """A node's exit code and when the supervisor noticed it (its sequence of observations)."""

    code: int
    observed: int


def node_failure(plan: Plan, backend: Backend, live: Liveness, watcher: NodeWatcher, ended: NodeExit) -> Failure:
    """The node's failure: for each rank torchrun's report names, a failure classified from that rank's own
    lines; the one that came first by ``failures.precedence`` (its own error before an echo of a peer's).
    It is ordered against other nodes by when its failure report was seen, else its exit."""
    node = plan.nodes[watcher.handle.index]
    seen = watcher.seen()
    code, tail = ended.code, seen.tail
    observed = seen.reported if seen.reported is not None else ended.observed
    decided = watcher.handle.scheduler_failure  # a scheduler's verdict (Slurm), trusted
    if decided is not None:
        return decided.model_copy(update={
            "node": node.index, "host": node.host, "exit_code": code, "signal": failures.signal_name(code),
            "detected_at": time.time(), "last_lines": tail[-20:], "observed": observed})
    lost = seen.agent_exit is None and (watcher.handle.lost_reason is not None or failures.agent_lost(code))
    reports = failures.with_recorded(seen.recorded, failures.parse_agent_failure(tail, plan.world_size)) or [
        failures.AgentReport()]
    why_lost = watcher.handle.lost_reason or (
        f"its node agent was killed ({failures.signal_name(code)}) before it could report" if code and code < 0 else None)
    base = Failure(kind=FailureKind.LOST if lost else FailureKind.EXIT, node=node.index, host=node.host,
                   exit_code=code, detected_at=time.time(), reason=why_lost if lost else None, observed=observed)
    pids = seen.pids | {r.pid for r in reports if r.pid}
    oom = None
    if not lost and pids:
        oom = failures.oom_kill(backend.kernel_log(plan, node.index), pids, live.started)
    killed = failures.oom_pid(oom) if oom else None
    rank_by_pid = {sample.pid: rank for rank, sample in seen.samples.items()}
    rank_pids = set(rank_by_pid) | {r.pid for r in reports if r.pid}
    named = {r.rank for r in reports if r.rank is not None}
    if named and killed is not None and killed in rank_by_pid and rank_by_pid[killed] not in named:
        # torchrun reported only the peers that saw the killed rank go: the kernel's line names it
        reports.append(failures.AgentReport(rank=rank_by_pid[killed], pid=killed, exit_code=-signal.SIGKILL))
    # with launch's step hooks in the ranks, steps are observed: no step seen is no step taken
    observed = any(n.step_hooks for n in plan.nodes)
    progressed = live.reporting or (not observed and time.time() - live.started >= PROGRESS_PROXY_S)
    candidates = []
    for report in reports:
        failure = base.model_copy(update=report.model_dump(exclude_none=True, exclude={"message"}))
        failure = failure.model_copy(update={"signal": failures.signal_name(failure.exit_code)})
        rank_prefix = f"[{node.index}/{failure.rank}] "
        rank_lines = [line for line in tail if line.startswith(rank_prefix)]
        # the OOM line explains this failure unless it names another rank's process
        own_oom = None if failure.pid is not None and killed in rank_pids - {failure.pid} else oom
        if own_oom is not None and failure.rank is None and killed is not None:
            failure = failure.model_copy(update={"rank": rank_by_pid.get(killed), "pid": killed})
        # the rank's recorded exception is read first (last, as classify reads the lines from the end)
        lines = [*(rank_lines or tail), *([report.message] if report.message else [])]
        failure = failures.classify(failure, lines, own_oom, progressed, live.last_step)
        candidates.append(failure.model_copy(update={"last_lines": (rank_lines[-20:] or tail[-20:])}))
    return min(candidates, key=failures.precedence)
