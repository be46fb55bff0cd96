"""A stream's bytes as whole lines, each cut at a bound in linear time: the agent's relay of its command's output
and DeepSpeed's rank streams (``rankrelay``) both read through it.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

LINE_LIMIT = 64 * 1024
READ_CHUNK = 64 * 1024


def bounded_lines(read: Callable[[], bytes], limit: int = LINE_LIMIT) -> Iterator[list[bytes]]:
    """The whole lines (without their newline) of each ``read()`` until it returns b"", each cut at ``limit`` bytes
    with a note of what was dropped; a last line without its newline comes at the end."""
    pending = bytearray()
    dropped = 0

    def add(piece: bytes) -> None:
        nonlocal dropped
        room = max(0, limit - len(pending))
        pending.extend(piece[:room])
        dropped += len(piece) - min(room, len(piece))

    def emit() -> bytes:
        nonlocal dropped
        note = f" [launch: line cut at {limit} bytes; {dropped} more dropped]".encode() if dropped else b""
        line = bytes(pending) + note
        pending.clear()
        dropped = 0
        return line

    while chunk := read():
        batch = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            add(chunk[start:end])
            batch.append(emit())
            start = end + 1
        add(chunk[start:])
        if batch:
            yield batch
    if pending or dropped:
        yield [emit()]
