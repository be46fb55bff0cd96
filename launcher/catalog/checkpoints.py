"""A recipe's checkpoint directory as the ranks and the submitting side both read it (standard library only).

One folder per saved step (``step_00000500``), a ``latest`` file naming the newest complete one (DeepSpeed's
convention), and ``launch_job``: which job saved it, and at which step (JSON, written by rank 0 once ``latest``
is). A job resumes its own checkpoints (a restart, an elastic re-plan); another job's only when its spec says
``checkpoint: {resume: true}``, so that a reused ``checkpoint.dir`` never silently continues someone else's run.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

LATEST = "latest"
OWNER = "launch_job"
MAX_OWNER_BYTES = 4096
_TAG = re.compile(r"^step_(\d{1,12})$")


@dataclass(frozen=True)
class Saved:
    """The newest checkpoint of a directory: its tag, the step it was saved after, the job that saved it (None: a
    checkpoint launch did not record, or not readable)."""

    tag: str
    step: int | None
    job: str | None

    def describe(self, directory: str) -> str:
        whose = f"job {self.job}" if self.job else "a run launch did not record"
        return f"{directory} holds the checkpoint of {whose} after step {self.step if self.step is not None else '?'}"


def tag_for(step: int) -> str:
    """The folder name of the checkpoint taken after ``step`` optimizer steps."""
    return f"step_{step:08d}"


def latest_tag(directory: str | os.PathLike) -> str | None:
    """The newest complete checkpoint's tag in ``directory``, or None when there is none."""
    marker = Path(directory) / LATEST
    try:
        tag = marker.read_text(errors="replace").strip() if marker.is_file() else ""
    except OSError:
        return None
    return tag or None


def saved(directory: str | os.PathLike) -> Saved | None:
    """The newest checkpoint in ``directory`` and who saved it; None when it holds none (or cannot be read)."""
    tag = latest_tag(directory)
    if tag is None:
        return None
    match = _TAG.match(tag)
    job = None
    try:
        with open(Path(directory) / OWNER, "rb") as handle:
            record = json.loads(handle.read(MAX_OWNER_BYTES))
        if isinstance(record, dict) and record.get("tag") == tag and isinstance(record.get("job"), str):
            job = record["job"][:200]
    except (OSError, ValueError):
        pass
    return Saved(tag[:200], int(match[1]) if match else None, job)


def write_owner(directory: str | os.PathLike, job: str, tag: str) -> None:
    """Record that ``job`` saved the checkpoint ``tag`` (after ``latest`` names it), atomically."""
    temporary = Path(directory) / f".{OWNER}.tmp"
    temporary.write_text(json.dumps({"job": job, "tag": tag}) + "\n")
    os.replace(temporary, Path(directory) / OWNER)


def refusal(directory: str, found: Saved, job: str) -> str | None:
    """Why job ``job`` may not resume ``found`` without ``checkpoint.resume``: another job's checkpoint (None: its
    own, or one that no job recorded, as a checkpoint launch did not write)."""
    if found.job is None or found.job == job:
        return None
    return (f"{found.describe(directory)}: job {job} would continue that run; set checkpoint.resume: true to "
            f"continue it (--set checkpoint.resume=true), or give another checkpoint.dir")
