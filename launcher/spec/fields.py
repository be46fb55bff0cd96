"""Bounded value types shared by the job and cluster specs.

Text fields come in two kinds: ``Line`` (names, paths, hosts, users: one line, no
control characters) and ``Arg`` (program arguments, env values, shell commands:
any text but NUL, which no argv or environment can carry). Both have a length
cap that ``launch schema`` shows. Environment variable names are POSIX names;
the ones launch sets itself to tag and attribute a job's processes are reserved.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, Field

MAX_LINE = 4096
MAX_ARG = 128 * 1024  # Linux's limit on one argument or NAME=VALUE string (MAX_ARG_STRLEN)
MAX_ENV_NAME = 255
MAX_NODES = 4096
MAX_PROCS_PER_NODE = 1024
MAX_STEPS = 10**12
WEEK_S = 7 * 24 * 3600.0

# Control characters, and the invisible ones that change how a line reads: zero-width, direction marks and
# overrides (U+202E shows "exe.txt" for "txt.exe"), line and paragraph separators, the BOM.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Read by launch's metric reporter in the ranks: a job may set these (README: LAUNCH_METRICS=0 turns it off).
USER_LAUNCH_KNOBS = frozenset({"LAUNCH_METRICS", "LAUNCH_METRICS_EVERY"})
RESERVED_EXACT = frozenset({"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"})


def _one_line(value: str) -> str:
    found = _CONTROL.search(value)
    if found:
        raise ValueError(
            f"contains the {'control' if ord(found.group()) < 0x100 else 'invisible or direction-changing'} "
            f"character U+{ord(found.group()):04X} at position {found.start()}; "
            "this value is one line of plain text"
        )
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError(
            f"contains a NUL character at position {value.index(chr(0))}, which no argument or environment value can carry"
        )
    return value


Line = Annotated[str, Field(max_length=MAX_LINE), AfterValidator(_one_line)]
NonEmptyLine = Annotated[str, Field(min_length=1, max_length=MAX_LINE), AfterValidator(_one_line)]
Name = Annotated[str, Field(min_length=1, max_length=255), AfterValidator(_one_line)]
Arg = Annotated[str, Field(max_length=MAX_ARG), AfterValidator(_no_nul)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


def reserved_reason(name: str) -> str | None:
    """Why ``name`` cannot be set by a job, or None if it can."""
    if name in RESERVED_EXACT:
        return "launch sets it to prefix every rank's lines with its node and rank"
    if name.startswith("LAUNCH_") and name not in USER_LAUNCH_KNOBS:
        return "launch sets LAUNCH_* names itself to tag the job's processes (cancel and sweeps find them by it)"
    return None


def _env_name(name: str) -> str:
    if not _ENV_NAME.fullmatch(name):
        raise ValueError(
            f"{name[:40]!r} is not an environment variable name (letters, digits and '_', not starting with a digit)"
        )
    reason = reserved_reason(name)
    if reason:
        raise ValueError(f"{name} is reserved: {reason}")
    return name


EnvName = Annotated[
    str, Field(max_length=MAX_ENV_NAME, json_schema_extra={"pattern": f"^{_ENV_NAME.pattern}$"}), AfterValidator(_env_name),
]
