"""Loss of contact is not loss of a node (DESIGN.md section 9): when to follow a node again, when it is lost.

A node whose stream broke without its agent's ``@exit`` is *out of contact*: its watcher follows its
journal again from the lines it has (``launch_node follow``), with ``retry_delay`` between tries. It is
called lost only on evidence (``verdict``): its agent's ``@lost`` (that is the follow handle's own exit
code), or it stays unreachable (a try failed, or has hung for ``PENDING_EVIDENCE_S``) while the job
stops progressing (no step, and no busy rank where nothing reports steps, on the other nodes for
``stall_window``) or another node failed, or for longer than the agents wait unattended. Pure: the
supervisor's loop calls it with what it observed; unit tests call it with numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.run.liveness import Liveness

RETRY_S = (0.5, 1.0, 2.0, 4.0)  # then every RETRY_S[-1] seconds
PENDING_EVIDENCE_S = 3.0  # a try that has neither connected nor failed by then counts as a failed one
MIN_STALL_S = 5.0
MAX_STALL_S = 15.0  # with SSH keepalives (4 s) and one try, a dead host is lost within about 20 s
UNATTENDED_MARGIN_S = 30.0  # past the agents' own unattended clock: they have ended the job by themselves


def retry_delay(tries: int) -> float:
    """Seconds before the next try to follow a node again, after ``tries`` failed ones."""
    return RETRY_S[min(tries, len(RETRY_S) - 1)]


@dataclass(frozen=True)
class OutOfContact:
    """A node whose stream broke: since when, the tries that failed and the last one's error, and since when
    the try now under way has been going (None between tries)."""

    node: int
    host: str
    since: float
    tries: int = 0
    error: str | None = None
    trying_since: float | None = None

    def unreachable(self, now: float) -> bool:
        """Evidence that the node cannot be reached (not only a silent channel)."""
        pending = self.trying_since is not None and now - self.trying_since >= PENDING_EVIDENCE_S
        return self.tries > 0 or pending

    def why(self, now: float) -> str:
        if self.error is not None:
            return self.error
        return f"no answer within {now - (self.trying_since or now):.0f} s"


@dataclass(frozen=True)
class Pulse:
    """What the other nodes show: their newest sign of progress (a step, else a busy rank or a line), how far
    apart their steps come (0: unknown), and whether one of them failed."""

    last: float | None
    gap: float = 0.0
    others_failed: bool = False


def pulse(live: Liveness, node: int, others_failed: bool) -> Pulse:
    """The Pulse of every node but ``node``: its steps when the job reports them, else its ranks' activity."""
    others = [seen for seen in live.ranks.values() if seen.node != node]
    steps = [seen.step_at for seen in others if seen.step_at is not None]
    if live.reporting:
        return Pulse(max(steps) if steps else None, live.longest_gap, others_failed)
    active = [seen.active_at for seen in others if seen.active_at is not None]
    return Pulse(max([*active, *([live.output_at] if live.output_at else [])], default=None), 0.0, others_failed)


def stall_window(gap: float) -> float:
    """How long the job may show no progress before an unreachable node is called lost: three of its usual
    gaps between steps, within MIN_STALL_S..MAX_STALL_S."""
    return min(MAX_STALL_S, max(MIN_STALL_S, 3 * gap))


def verdict(contact: OutOfContact, job: Pulse, now: float, unattended_s: float | None) -> str | None:
    """Why the node out of ``contact`` is lost, or None while it is only out of contact."""
    out_for = now - contact.since
    if unattended_s is not None and out_for >= unattended_s + UNATTENDED_MARGIN_S:
        return (f"{contact.host} out of contact for {out_for:.0f} s, longer than watch.unattended_timeout "
                f"({unattended_s:g} s): its agent has ended the job there ({contact.why(now)})")
    if not contact.unreachable(now):
        return None
    if job.others_failed:
        return f"{contact.host} unreachable ({contact.why(now)}) while other nodes failed"
    quiet = now - max(job.last or contact.since, contact.since)
    window = stall_window(job.gap)
    if quiet >= window:
        return (f"{contact.host} unreachable ({contact.why(now)}) for {out_for:.0f} s while the job made no "
                f"progress on the other nodes for {quiet:.0f} s")
    return None
