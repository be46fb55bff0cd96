"""A scheduler's time-limit warning passed on to the ranks: SIGUSR1 to each rank that handles it, once the
warning file exists (Slurm's ``--signal``, docs/SLURM.md).
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from . import proctree
from .journal import Output

WARN_POLL_S = 1.0
WARN_UNHANDLED_S = 30.0  # ranks that still do not handle SIGUSR1 this long after the warning are named


def forward_warning(job_id: str, node: int | None, out: Output, path: str, relayed: threading.Event) -> None:
    """Once ``path`` exists (a scheduler's time limit is near), SIGUSR1 to every rank of this node that
    handles it, as soon as it does (ranks may still be starting) and once each, until the command ends;
    never to the launcher (torchrun dies of SIGUSR1) nor to ranks that would die of it."""
    while not relayed.wait(WARN_POLL_S):
        if os.path.exists(path):
            break
    else:
        return
    warned_at = time.monotonic()
    signalled: set[tuple[int, int]] = set()
    told_unhandled = False
    while True:
        procs = proctree.job_procs(job_id, node)
        by_pid = {proc.pid: proc for proc in procs}
        unhandled = []
        for tree in proctree.rank_trees(procs):
            proc = by_pid[tree.pid]
            if (proc.pid, proc.start_ticks) in signalled:
                continue
            if proctree.catches(proc.pid, signal.SIGUSR1) and proctree.signal_if(proc.pid, proc.start_ticks,
                                                                                 signal.SIGUSR1):
                signalled.add((proc.pid, proc.start_ticks))
                out.note(f"launch: the time limit is near: rank {tree.rank} (pid {proc.pid}) got SIGUSR1")
            else:
                unhandled.append(tree)
        if unhandled and not told_unhandled and time.monotonic() - warned_at >= WARN_UNHANDLED_S:
            told_unhandled = True
            ranks = ", ".join(str(tree.rank) for tree in unhandled)
            out.note(f"launch: the time limit is near: rank(s) {ranks} do not handle SIGUSR1: not signalled")
        if relayed.wait(WARN_POLL_S):
            return
