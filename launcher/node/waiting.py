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

from . import leases
from .protocol import LeaseRequest

POLL_S = 0.25
GPU_LOOK_S = 2.0  # nvidia-smi's processes change without a lease moving: look again this often on GPU nodes


def state(req: LeaseRequest) -> dict:
    """This host's devices of the request's kind, and whether ``count`` of them are the job's to take now."""
    found = leases.survey(req.kind, req.capacity, req.dir)
    before = leases.ahead(found.waiting, req.job, req.order or time.time())
    free = found.free(req.allow_shared)
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
        with leases.ticket(record, req.order, req.count, req.dir):
            directory = leases.lease_dir(req.dir)
            shown, seen, looked = None, None, 0.0
            while True:
                changes = _changes(directory)
                if changes != seen or (req.kind == "gpu" and time.monotonic() - looked > GPU_LOOK_S):
                    seen, looked = changes, time.monotonic()
                    now = state(req)
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
