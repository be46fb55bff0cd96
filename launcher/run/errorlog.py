"""A supervisor's own errors: each kept with its traceback in the job's run directory (``supervisor-errors.log``),
never raised; a clean-up step that fails is noted (and filed as an event) and the others go on."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from launcher.store.db import Store

ERRORS_LOG = "supervisor-errors.log"


def note(run_dir: Path, text: str) -> None:
    """Keep an error of launch's own (with its traceback) in ``run_dir``; never raises (the disk may be full)."""
    entry = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {text}\n{traceback.format_exc()}\n"
    try:
        with open(run_dir / ERRORS_LOG, "a", encoding="utf-8") as handle:
            handle.write(entry)
    except OSError:
        try:
            sys.stderr.write(entry)
        except (OSError, ValueError):
            pass  # nowhere left to say it; the job's reason says what was lost


def guarded(what: str, step: Callable[[], object], run_dir: Path, store: Store, job_id: str) -> None:
    """Run a clean-up step; its error is noted (and filed as an event if the store allows), never raised."""
    try:
        step()
    except Exception as exc:  # noqa: BLE001 - one failed clean-up step must not stop the others or the finish
        note(run_dir, f"{what} failed: {exc!r}")
        try:
            store.add_event(job_id, "internal_error", f"{what} failed: {exc!r}")
        except Exception:  # noqa: BLE001 - noted above already
            pass
