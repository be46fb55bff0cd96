"""Secrets named in a job's ``secrets:`` come from the submitter's environment only.

Their values are passed to the ranks' environment and never written to the
store, a dry-run, ``status`` or the logs `launch` writes (lines are masked).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from launcher.errors import SpecError


def read_secrets(names: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The values of the named secrets; every missing one is reported at once."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    names = list(names)
    missing = [n for n in names if not env.get(n)]
    if missing:
        raise SpecError(
            f"secrets: {', '.join(missing)} not set in your environment; the job lists "
            f"{'it' if len(missing) == 1 else 'them'} under 'secrets:', whose values come only from the submitter's environment"
        )
    return {n: env[n] for n in names}
