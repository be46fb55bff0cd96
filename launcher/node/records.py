"""Small JSON records that processes leave for each other on a node, written atomically and read with bounds
(another user may have written them), and what /proc says of a process: its user and its start time.
Standard library only: it runs on nodes."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import stat

RECORD_LIMIT = 4096  # bytes of a record read (others' files: bounded)


def uid_of(pid: int) -> int | None:
    """The real uid of ``pid`` (from /proc/PID/status: right even for an undumpable agent)."""
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def start_ticks(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def user_name(uid: int | None) -> str:
    if uid is None:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def read_json(path: str) -> dict | None:
    """A JSON object from another process's file, bounded; None if missing, unreadable or not an object."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = json.loads(os.read(fd, RECORD_LIMIT))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(data))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
