"""The node side of waiting for leases: ``leases`` (who holds what here, and could a job have its devices now),
``lease-setup`` (as root: ``leases.set_up``) and ``wait`` (hold the job's ticket in this host's queue and say,
line by line, whether its turn has come).

``wait`` prints a JSON line ``{"ready": bool, ...the survey...}`` at once and whenever that changes, and
keeps its ticket until its stdin closes (the supervisor closes it once the job's agents hold their leases,
or gives up). Standard library only: it runs on nodes.
"""

from __future__ import annotations

import json
import os
import select
import sys
import time
from collections.abc import Callable

from . import leases
from .protocol import LeaseRequest

POLL_S = 0.25
GPU_LOOK_S = 2.0  # nvidia-smi's processes change without a lease moving: look again this often on GPU nodes
PLACE_LOST_S = 30.0  # a ticket whose turn came (first, its devices free) and that took no lease this long loses its place
TURN_LOOK_S = 1.0  # while such a turn runs out, look again this often though nothing moved


class Places:
    """A waiter's memory of the tickets ahead of it: the first one's turn has come when enough devices are free for
    it; if it has not leased ``PLACE_LOST_S`` later (a job waiting for another host too, or a ticket held by a
    process that never leases) it loses its place to the tickets behind it, for as long as it waits."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.passed: set[tuple[int, float]] = set()  # (pid, since) of the tickets that lost their place
        self.turn: tuple[tuple[int, float], float] | None = None  # the first ticket ahead, and when its turn came

    def ahead(self, waiting: list[leases.Ticket], job: str, since: float, free: int) -> list[leases.Ticket]:
        """The tickets still ahead of a ticket of ``job`` that arrived at ``since``, ``free`` devices being free."""
        now = self.clock()
        while True:
            before = leases.ahead(waiting, job, since, frozenset(self.passed))
            first = before[0] if before and before[0].count <= free else None
            key = (first.pid, first.since) if first else None
            if key is None:
                self.turn = None
                return before
            if self.turn is None or self.turn[0] != key:
                self.turn = (key, now)
            if now - self.turn[1] < PLACE_LOST_S:
                return before
            self.passed.add(key)
            self.turn = None

    def pending(self) -> bool:
        """A turn is running out: look again though nothing moved."""
        return self.turn is not None


def state(req: LeaseRequest, since: float | None = None, places: Places | None = None) -> dict:
    """This host's devices of the request's kind, and whether ``count`` of them are the job's to take now: for a job
    whose ticket arrived at ``since`` (``places``: its waiter's memory), or one without a ticket (behind them all)."""
    found = leases.survey(req.kind, req.capacity, req.dir)
    free = found.free(req.allow_shared)
    if since is not None and places is not None:
        before = places.ahead(found.waiting, req.job, since, len(free))
    else:
        before = leases.ahead(found.waiting, req.job, since)
    return {**found.as_json(), "ready": len(free) >= req.count and not before,
            "free": len(free), "wanted": req.count, "ahead": [t.as_json() for t in before]}


def answer(req: LeaseRequest) -> dict:
    """``state``, or ``{"error": why}`` when this host's leases cannot be read."""
    try:
        return state(req)
    except (leases.LeaseError, OSError) as exc:
        return {"error": str(exc)}


def probe(req: LeaseRequest) -> int:
    print(json.dumps(answer(req)), flush=True)
    return 0


def set_up(req: LeaseRequest) -> int:
    """``lease-setup`` (root): the lease directory and the request's lock files made root's (``leases.set_up``),
    then ``answer``, with ``set_up``: what was changed."""
    try:
        done = leases.set_up(req.kind, req.capacity, req.dir)
    except (leases.LeaseError, OSError) as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 0
    print(json.dumps({**answer(req), "set_up": done}), flush=True)
    return 0


def _changes(directory: str) -> tuple[str, int]:
    """What moves when a lease or a ticket is taken or let go: the flocks held on this machine, the directory's
    entries (records and tickets are renamed into it). Cheap: two reads a poll, however many wait."""
    try:
        with open("/proc/locks") as handle:
            flocks = "".join(line for line in handle.read(1 << 22).splitlines(keepends=True) if " FLOCK " in line)
    except OSError:
        flocks = str(time.monotonic())  # unreadable: look every time
    return flocks, os.stat(directory).st_mtime_ns


def wait(req: LeaseRequest) -> int:
    """Hold a ticket and report this host's state when it changes, until stdin closes."""
    record = {"job": req.job, "from": req.origin}
    try:
        with leases.ticket(record, req.count, req.dir) as path:
            directory = leases.lease_dir(req.dir)
            since, places = os.lstat(path).st_ctime, Places()
            shown, seen, looked = None, None, 0.0
            while True:
                changes = _changes(directory)
                if (changes != seen or (places.pending() and time.monotonic() - looked > TURN_LOOK_S)
                        or (req.kind == "gpu" and time.monotonic() - looked > GPU_LOOK_S)):
                    seen, looked = changes, time.monotonic()
                    now = state(req, since, places)
                    key = json.dumps(now, sort_keys=True)
                    if key != shown:
                        print(json.dumps(now), flush=True)
                        shown = key
                readable, _, _ = select.select([sys.stdin], [], [], POLL_S)
                if readable and not os.read(sys.stdin.fileno(), 4096):
                    return 0
    except (leases.LeaseError, OSError) as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        return 1
