"""A node's log file, bounded: rank output is untrusted, and a rank printing in a loop filled 535 MB.

``CappedLog`` is what the supervisor's relay writes a node's lines through, in place of a plain
file: it appends up to ``MAX_LOG_BYTES`` for the node and attempt, then writes one last line
saying so, has one ``log_capped`` event added to the job (``on_cap``), and drops the rest (the live tail, the
verdicts and the metric records are not affected: only what is kept on disk).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MAX_LOG_BYTES = 100 * 1024 * 1024  # one node, one attempt
CAPPED = "log_capped"


class CappedLog:
    """Append text to ``path`` until ``max_bytes``; then one marker line and one ``log_capped`` event."""

    def __init__(self, path: Path, node: int, on_cap: Callable[[str, str, dict[str, Any]], None],
                 max_bytes: int = MAX_LOG_BYTES) -> None:
        """``on_cap(kind, message, data)``: the event to add to the job once the cap is reached."""
        self.path, self.node, self.on_cap, self.max_bytes = Path(path), node, on_cap, max_bytes
        self._handle = open(self.path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115 - closed in close()
        self.size = os.fstat(self._handle.fileno()).st_size
        self.capped = self.size >= max_bytes

    def write(self, text: str) -> int:
        """Write ``text`` if it fits under the cap (whole lines are never cut); the characters written."""
        if self.capped:
            return 0
        data = text.encode("utf-8", "replace")
        if self.size + len(data) > self.max_bytes:
            self._cap()
            return 0
        self._handle.write(text)
        self.size += len(data)
        return len(text)

    def _cap(self) -> None:
        self.capped = True
        limit = f"{self.max_bytes >> 20} MiB" if self.max_bytes >= 1 << 20 else f"{self.max_bytes} bytes"
        message = (f"node {self.node}: its log reached {limit}, the most launch keeps "
                   "for a node; later lines are not kept")
        self._handle.write(f"{time.time():.3f} [{self.node}] launch: {message}\n")  # as the relay writes lines
        self._handle.flush()
        self.on_cap(CAPPED, message, {"node": self.node, "limit": self.max_bytes, "path": str(self.path)})

    def flush(self) -> None:
        self._handle.flush()

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> CappedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
