"""Read a job's per-node log files back, filtered by node and rank, optionally following."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

from launcher.store import TERMINAL, Store

_PREFIX = re.compile(r"^\[(\d+)(?:/(\d+))?\] ")
_TIME = re.compile(r"^\d+\.\d{3} ")


def log_files(store: Store, job: dict, node: int | None, attempt: int | None) -> list[Path]:
    """The job's log files for one attempt (default: the latest), in node order."""
    attempt = job["attempt"] if attempt is None else attempt
    rows = [r for r in store.nodes(job["id"], attempt) if node is None or r["node"] == node]
    return [Path(r["log_path"]) for r in rows if r.get("log_path")]


def keep(line: str, rank: int | None) -> bool:
    """True if ``line`` belongs to ``rank`` (or no rank filter is set)."""
    if rank is None:
        return True
    match = _PREFIX.match(line)
    return bool(match and match[2] is not None and int(match[2]) == rank)


def print_logs(
    store: Store,
    job_ref: str,
    *,
    node: int | None = None,
    rank: int | None = None,
    attempt: int | None = None,
    follow: bool = False,
    out: Callable[[str], None] = print,
    poll_s: float = 0.25,
) -> None:
    """Print the logs; with ``follow``, keep printing until the job has ended."""
    job = store.job(job_ref)
    offsets: dict[Path, int] = {}
    while True:
        for path in log_files(store, job, node, attempt):
            if not path.exists():
                continue
            with open(path, "rb") as handle:
                handle.seek(offsets.get(path, 0))
                data = handle.read()
            complete = data[: data.rfind(b"\n") + 1]
            offsets[path] = offsets.get(path, 0) + len(complete)
            for line in complete.decode("utf-8", errors="replace").splitlines():
                line = _TIME.sub("", line, count=1)
                if keep(line, rank):
                    out(line)
        if not follow:
            return
        state = store.job(job["id"])["state"]
        if state in TERMINAL:
            follow = False
            continue
        time.sleep(poll_s)
