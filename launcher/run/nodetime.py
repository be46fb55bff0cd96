"""The node is the clock of record (DESIGN.md section 10): when a node did something, on the supervisor's clock,
whatever the time the supervisor read it; and whether the supervisor has caught up with its nodes after it was away.

A watcher places each line by the node's own stamp (``NodeClock.when``): the node's monotonic time plus the
smallest offset seen between it and the supervisor's clock at receipt (the fastest delivery's; it may grow by
``DRIFT`` of the time between lines, for the two clocks' drift), so lines read late (the supervisor paused,
asleep, or blocked on a locked store) keep the time they happened. ``Attention`` notices that the supervisor's
loop was away (a round that came ``AWAY_S`` late) and holds every verdict until each node has been heard from
since it came back: the supervisor has taken in what its nodes journaled meanwhile. A watcher stuck on one
line (its echo blocked: a foreground output nobody reads) is such an absence too (``hold``). A node that says
nothing at all holds them for at most ``limit`` seconds. Pure: times are passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from launcher.node.protocol import NodeTime

DRIFT = 1e-4  # 100 ppm: more than two computers' clocks drift apart
CLOCK_BACK_S = 1.0  # a node's monotonic clock that went back further: another boot, its offset taken afresh
AWAY_S = 5.0  # a loop round this late (its poll is 0.1 s), or a watcher on one line this long: what nodes sent waits


class NodeClock:
    """One node's monotonic clock placed on the supervisor's (``time.time()``), from the lines read so far."""

    def __init__(self) -> None:
        self._offset: float | None = None
        self._mono = 0.0
        self._received = 0.0

    def when(self, at: NodeTime | None, received: float) -> float:
        """When the node wrote a line stamped ``at`` that was read at ``received`` (``received`` without a stamp)."""
        if at is None:
            return received
        sample = received - at.mono
        if self._offset is None or at.mono < self._mono - CLOCK_BACK_S:
            self._offset = sample
        else:
            self._offset = min(sample, self._offset + DRIFT * max(0.0, received - self._received))
        self._mono, self._received = max(self._mono, at.mono), received
        return at.mono + self._offset


@dataclass(frozen=True)
class Away:
    """The supervisor's loop did not run from ``left`` to ``back``; ``caught_up`` once it had heard every node
    since (False: some node said nothing within the limit), at ``settled``."""

    left: float
    back: float
    caught_up: bool = False
    settled: float = 0.0
    what: str = "supervisor was away"

    @property
    def seconds(self) -> float:
        return self.back - self.left

    def describe(self) -> str:
        if self.caught_up:
            return f"{self.what} {self.seconds:.0f} s; caught up"
        return (f"{self.what} {self.seconds:.0f} s; not every node was heard from within "
                f"{self.settled - self.back:.0f} s after: judging on what came")


class Attention:
    """Whether the supervisor's loop may judge: it was not away, or it has caught up with every node since."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._last: tuple[float, float] | None = None  # (wall, monotonic) of the previous round
        self._away: Away | None = None

    def round(self, wall: float, mono: float) -> None:
        """A round of the loop begins (``time.time()``, ``time.monotonic()``: a laptop's sleep stops the second)."""
        if self._last is not None:
            gap = max(wall - self._last[0], mono - self._last[1])
            if gap >= AWAY_S:
                away = self._away
                self._away = Away(away.left, wall, what=away.what) if away is not None else Away(self._last[0], wall)
        self._last = (wall, mono)

    def hold(self, since: float, wall: float, what: str) -> None:
        """The loop runs but cannot take in what a node sends (``what``: its watcher has been stuck on one line since
        ``since``, its echo blocked): an absence until it is taken in again."""
        left = min(self._away.left, since) if self._away is not None else since
        self._away = Away(left, wall, what=self._away.what if self._away is not None else what)

    def settle(self, heard: Iterable[float | None], now: float) -> Away | None:
        """Once after an absence: the absence, when every node (``heard``: when each last wrote a line read) has
        been heard from since, or the limit passed. None otherwise (``waiting`` tells which)."""
        away = self._away
        if away is None:
            return None
        caught_up = all(t is not None and t >= away.back for t in heard)
        if not caught_up and now - away.back < self.limit:
            return None
        self._away = None
        return Away(away.left, away.back, caught_up, now, away.what)

    def ended(self, caught_up: bool, now: float) -> Away | None:
        """The absence the attempt ended in (its nodes ended while the loop was away), if any: ``caught_up`` once
        their last lines were read."""
        away, self._away = self._away, None
        return None if away is None else Away(away.left, away.back, caught_up, now, away.what)

    @property
    def waiting(self) -> bool:
        """Verdicts wait: the loop was away and has not caught up yet."""
        return self._away is not None
