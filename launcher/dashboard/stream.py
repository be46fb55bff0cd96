"""Server-sent events: a job's log lines from where the reader left off, and a page's figures as they change.

A log event's id is the byte offset reached in each of the job's log files (``path=offset`` joined by ``|``,
paths relative to the job's run directory). A browser that reconnects sends it back as ``Last-Event-ID``: the
stream goes on from exactly there, so no line is lost or sent twice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from launcher.store.db import Store
from launcher.views.logs import LogQuery, LogReader

#: How often a stream reads the store and the logs again (what `launch logs --follow` and `status --watch` do).
POLL_S = 1.0


def event(data: Any, event_id: str | None = None, kind: str | None = None) -> str:
    """One SSE event (JSON data)."""
    head = (f"id: {event_id}\n" if event_id is not None else "") + (f"event: {kind}\n" if kind else "")
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n"


def encode_offsets(run_dir: Path, offsets: dict[Path, int]) -> str:
    return "|".join(f"{_relative(run_dir, path)}={end}" for path, end in sorted(offsets.items()))


def decode_offsets(run_dir: Path, text: str | None, paths: list[Path]) -> dict[Path, int]:
    """The offsets of an event id; a name that is not one of the job's log files, or a damaged id, is left out."""
    known = {_relative(run_dir, p): p for p in paths}
    out: dict[Path, int] = {}
    for part in (text or "").split("|"):
        name, _, end = part.rpartition("=")
        if name in known and end.isdigit():
            out[known[name]] = int(end)
    return out


def _relative(run_dir: Path, path: Path) -> str:
    try:
        return str(path.relative_to(run_dir))
    except ValueError:
        return str(path)


async def log_events(store: Store, ref: str, query: LogQuery, last_event_id: str | None,
                     poll_s: float = POLL_S, sleep: Callable[[float], Any] = asyncio.sleep) -> AsyncIterator[str]:
    """The job's log lines the query keeps, from ``last_event_id`` on; ends once the job has ended and all is sent."""
    reader = LogReader(store, ref, query)
    run_dir = store.run_dir(reader.job.id)
    reader.offsets.update(decode_offsets(run_dir, last_event_id, reader._paths()))
    while True:
        ended = reader.ended
        lines = await asyncio.to_thread(reader.new)
        if lines:  # one event a read: its id is where the next read starts
            yield event([line.text for line in lines], encode_offsets(run_dir, reader.offsets), "lines")
        if ended:
            yield event({"state": str(reader.job.state)}, kind="end")
            return
        await sleep(poll_s)


async def changes(compose: Callable[[], Any], done: Callable[[Any], bool], poll_s: float = POLL_S,
                  sleep: Callable[[float], Any] = asyncio.sleep) -> AsyncIterator[str]:
    """``compose()`` each ``poll_s``, sent when it changed; ends after a value ``done`` says is final."""
    sent = None
    while True:
        value = await asyncio.to_thread(compose)
        text = json.dumps(value, separators=(",", ":"), default=str)
        if text != sent:
            sent = text
            yield f"data: {text}\n\n"
        if done(value):
            return
        await sleep(poll_s)
