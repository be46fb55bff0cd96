"""Secrets named in a job's ``secrets:`` come from the submitter's environment only.

Their values are passed to the ranks' environment and never written to the
store, a dry-run, ``status`` or the logs `launch` writes (lines are masked).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from launcher.errors import SpecError

MIN_SECRET_CHARS = 8  # masking a shorter value would hide (and so reveal) every place its characters appear


def read_secrets(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of the named secrets; every missing or too short one is reported at once."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    names = list(names)
    missing = [n for n in names if not env.get(n)]
    if missing:
        raise SpecError(
            f"secrets: {', '.join(missing)} not set in your environment; the job lists "
            f"{'it' if len(missing) == 1 else 'them'} under 'secrets:', whose values come only from the submitter's environment"
        )
    short = [n for n in names if len(env[n]) < MIN_SECRET_CHARS]
    if short:
        raise SpecError(
            f"secrets: {', '.join(short)} {'is' if len(short) == 1 else 'are'} shorter than {MIN_SECRET_CHARS} characters: "
            "launch masks a secret's value wherever it appears in the logs, and masking so short a value would hide "
            "every place those characters appear (and so reveal it); put a value that is not secret under env: instead"
        )
    return {n: env[n] for n in names}
