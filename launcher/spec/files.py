"""Files a user names (a spec, deepspeed.config, ssh key/known_hosts/config, LAUNCH_HOME, report --out).

Every such file is checked before it is read: ``~user`` must name a user of this machine, and
the path must be a regular file (a FIFO would block the read for ever, ``/dev/zero`` never ends,
a directory cannot be read) no larger than the caller's bound. The file is opened without
blocking and checked again on the open descriptor, so what is read is what was checked.
Errors are ``SpecError``: one line naming the file and what it should be.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from launcher.errors import SpecError


def expand_user(text: str | os.PathLike[str], what: str) -> Path:
    """``text`` with a leading ``~`` or ``~user`` expanded; SpecError when the user is unknown here."""
    path = Path(text)
    try:
        return path.expanduser()
    except (RuntimeError, KeyError):  # Path.expanduser: "Could not determine home directory."
        head = str(text).split("/", 1)[0]
        user = head[1:]
        if user:
            raise SpecError(f"{what}: '{text}': there is no user '{user}' on this machine ({head} names that user's "
                            "home directory); give the path itself") from None
        raise SpecError(f"{what}: '{text}': this process has no home directory (HOME is unset and the user has "
                        "none); give the path itself") from None


def kind_of(mode: int) -> str:
    """What a file of this mode is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _check(path: Path, info: os.stat_result, what: str, max_bytes: int) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise SpecError(f"{what}: {path} is {kind_of(info.st_mode)}, not a regular file")
    if info.st_size > max_bytes:
        raise SpecError(f"{what}: {path} holds {info.st_size} bytes, more than the {_size(max_bytes)} it may; "
                        "is it the right file?")


def _size(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 and not count % (1 << 20) else f"{count >> 10} KiB"


def check_regular(path: Path, what: str, max_bytes: int, *, missing_ok: bool = False) -> bool:
    """True if ``path`` is a regular file of at most ``max_bytes`` (symlinks followed); False if it does not
    exist and ``missing_ok``; SpecError otherwise."""
    try:
        info = path.stat()
    except FileNotFoundError:
        if missing_ok:
            return False
        raise SpecError(f"{what}: {path} does not exist") from None
    except OSError as exc:
        raise SpecError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    _check(path, info, what, max_bytes)
    return True


def read_regular(path: Path, what: str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; SpecError for anything else (never blocks)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise SpecError(f"{what}: {path} does not exist") from None
    except OSError as exc:
        raise SpecError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    try:
        _check(path, os.fstat(fd), what, max_bytes)  # before fdopen, which refuses a directory with its own error
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise SpecError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > max_bytes:  # it grew since the check
        raise SpecError(f"{what}: {path} holds more than the {_size(max_bytes)} it may; is it the right file?")
    return data
