"""The cluster's leases as `launch queue` reads them, asked of the nodes at most once per ``EVERY_S`` however many
pages, streams and scrapes want them."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from launcher.errors import LaunchError
from launcher.run import queue
from launcher.run.queue import NodeQueue, Waiter
from launcher.spec.cluster import ClusterSpec

#: The least time between two readings of every node's leases (`launch queue` asks each node over its connection).
EVERY_S = 5.0


@dataclass(frozen=True)
class Reading:
    """Every node's devices and the waiting jobs at ``t``; ``error`` where the cluster could not be read at all."""

    t: float
    nodes: list[NodeQueue]
    waiting: list[Waiter]
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        """``launch queue --json``, with when it was read, each holder's ``who`` line, and the error."""
        data = queue.queue_json(self.nodes, self.waiting)
        for node, shown in zip(self.nodes, data["nodes"]):
            shown["lines"] = [line.split(": ", 1)[-1] for line in queue.queue_lines([node], [])[:-1]]
        return {"t": self.t, "error": self.error, **data}


class Leases:
    """One cluster's leases, read again once the last reading is ``every_s`` old (one reader at a time)."""

    def __init__(self, cluster: ClusterSpec, every_s: float = EVERY_S) -> None:
        self.cluster = cluster
        self.every_s = every_s
        self._lock = threading.Lock()
        self._last: Reading | None = None

    def read(self) -> Reading:
        with self._lock:
            if self._last is None or time.time() - self._last.t >= self.every_s:
                try:
                    nodes, waiting = queue.read_queue(self.cluster)
                    self._last = Reading(time.time(), nodes, waiting)
                except LaunchError as exc:
                    self._last = Reading(time.time(), [], [], str(exc))
            return self._last
