"""The one place where an argv, an environment and a directory become a shell command.

Remote backends (SSH) run one string through the remote user's shell. Every
value is quoted with ``shlex.quote``, so `;`, `$(...)`, quotes, spaces,
newlines and non-ASCII text reach the program verbatim.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence


def render_command(argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None) -> str:
    """``cd CWD && exec env K=V ... ARGV`` with every part quoted."""
    if not argv:
        raise ValueError("render_command needs a non-empty argv")
    parts = []
    if cwd:
        parts.append(f"cd {shlex.quote(cwd)} &&")
    parts.append("exec")
    if env:
        parts.append("env")
        parts.extend(shlex.quote(f"{key}={value}") for key, value in env.items())
    parts.append(shlex.join(argv))
    return " ".join(parts)


def mask(value: str, secrets: Mapping[str, str]) -> str:
    """Replace every secret value in ``value`` with ``****``."""
    for secret in sorted((s for s in secrets.values() if s), key=len, reverse=True):
        value = value.replace(secret, "****")
    return value
