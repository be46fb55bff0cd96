"""The one place where an argv, an environment and a directory become a shell command, and secrets are masked.

Remote backends (SSH) run one string through the remote user's shell. Every
value is quoted with ``shlex.quote``, so `;`, `$(...)`, quotes, spaces,
newlines and non-ASCII text reach the program verbatim. A relative directory is
written ``./DIR``, so ``cd`` never reads it as an option (``-x``) or as ``-``
(the previous directory), and CDPATH is not searched.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Mapping, Sequence

MASK = "****"
MIN_MASKED_LINE = 8


def render_command(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None,
                   replace_shell: bool = True) -> str:
    """``cd CWD && exec env K=V ... ARGV`` with every part quoted.

    With ``replace_shell=False`` the shell stays and waits, so a program killed by a signal still
    ends with an exit status (128+N) that SSH reports (paramiko drops SSH's exit-signal message).
    """
    if not argv:
        raise ValueError("render_command needs a non-empty argv")
    if argv[0].startswith("-"):
        raise ValueError(f"render_command: the program {argv[0]!r} would be read as an option")
    parts = []
    if cwd:
        parts.append(f"cd {shlex.quote(cwd if cwd.startswith('/') else './' + cwd)} &&")
    if replace_shell:
        parts.append("exec")
    if env:
        parts.append("env")
        parts.extend(shlex.quote(f"{key}={value}") for key, value in env.items())
    parts.append(shlex.join(argv))
    if not replace_shell:
        parts.append("; exit $?")  # a second command: bash would otherwise exec the last one itself
    return " ".join(parts)


def mask(value: str, secrets: Mapping[str, str]) -> str:
    """Replace every secret value in ``value`` with ``****``, and every line of one that has 8 characters or more.

    A multi-line secret (a PEM key, a JSON credential) reaches a log one line at a
    time, so its lines are masked wherever they appear, with and without their
    indentation. Masking repeats until no such piece is left, so replacing one
    piece cannot join the text around it into another.
    """
    whole, pieces = _masked_pieces(tuple(secrets.values()))
    if whole is not None:
        value = whole.sub(MASK, value)
    if pieces is not None:
        while True:
            value, count = pieces.subn(MASK, value)
            if not count:
                break
    return value


@functools.lru_cache(maxsize=16)
def _masked_pieces(values: tuple[str, ...]) -> tuple[re.Pattern[str] | None, re.Pattern[str] | None]:
    """(whole values, lines of 8+ characters): two patterns, longest alternatives first."""
    whole = {value for value in values if value}
    pieces: set[str] = set()
    for value in whole:
        for line in (*value.split("\n"), *value.splitlines()):
            pieces.update(text for text in (line, line.strip()) if len(text) >= MIN_MASKED_LINE)
    pieces.update(value for value in whole if len(value) > len(MASK))
    return _alternation(whole), _alternation(pieces)


def _alternation(texts: set[str]) -> re.Pattern[str] | None:
    if not texts:
        return None
    return re.compile("|".join(re.escape(text) for text in sorted(texts, key=lambda t: (-len(t), t))))
