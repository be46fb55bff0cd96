"""The job's secrets masked in what its ranks print, before the agent journals it (the journal is kept on the node,
and `launch attach --cluster` reads it back into a store that has no secret to mask with).

The same rule as the supervisor's ``launcher.plan.shell.mask``: every secret value becomes ``****``, and every line
of one that has 8 characters or more (with and without its indentation), repeated until none is left, so a
multi-line secret (a PEM key) printed a line at a time is masked too. On bytes: the relay's lines are not decoded.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import re
from collections.abc import Callable

MASK = b"****"
MIN_MASKED_LINE = 8


def masker(secrets: dict[str, str]) -> Callable[[bytes], bytes] | None:
    """A function that masks ``secrets``' values in a line of output; None when there is none to mask."""
    whole = {value.encode() for value in secrets.values() if value}
    if not whole:
        return None
    pieces: set[bytes] = set()
    for value in whole:
        for line in (*value.split(b"\n"), *value.splitlines()):
            pieces.update(text for text in (line, line.strip()) if len(text) >= MIN_MASKED_LINE)
    pieces.update(value for value in whole if len(value) > len(MASK))
    values, parts = _alternation(whole), _alternation(pieces) if pieces else None

    def mask(line: bytes) -> bytes:
        line = values.sub(MASK, line)
        if parts is not None:
            count = 1
            while count:
                line, count = parts.subn(MASK, line)
        return line

    return mask


def _alternation(texts: set[bytes]) -> re.Pattern[bytes]:
    return re.compile(b"|".join(re.escape(text) for text in sorted(texts, key=lambda t: (-len(t), t))))
