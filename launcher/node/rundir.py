"""A job's private run directory on a node, under this user's private root, created and checked component by
component (another user's, a symlink or one open to others is refused); and which job stores followed the job there
and which have filed it (``followed/STORE``, ``filed/STORE``): the directory goes once every one has.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import os
import pwd
import re
import stat


class RunDirError(Exception):
    """The run directory cannot be used safely (another user's, a symlink, too open)."""


def run_root() -> str:
    """This user's private root for run directories: $XDG_RUNTIME_DIR/launch, else /tmp/launch-UID."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and _owned_private(os.lstat(runtime)):
        return os.path.join(runtime, "launch")
    return f"/tmp/launch-{os.getuid()}"


def _owned_private(info: os.stat_result) -> bool:
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def who(uid: int) -> str:
    """``NAME (uid N)``, or ``uid N`` for a uid without a name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def private_dir(path: str) -> str:
    """Create ``path`` (mode 0700) if missing and check it: a directory, not a symlink, this user's,
    closed to others; and its parent is this user's or root's and, if others may write it, sticky. A refusal names
    the path, its owner and what to do."""
    parent = os.path.dirname(path.rstrip("/")) or "/"
    info = os.lstat(parent)
    if info.st_uid not in (0, os.getuid()) or (info.st_mode & 0o002 and not info.st_mode & stat.S_ISVTX):
        raise RunDirError(f"{parent} may be changed by other users (owner {who(info.st_uid)}, mode "
                          f"{oct(info.st_mode & 0o7777)})")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise RunDirError(f"{path} is a symlink (to {os.readlink(path)}, made by {who(info.st_uid)}), not a directory: "
                          "refusing to use it (whoever planted it could read your jobs' files): remove it, or have an "
                          "administrator remove it")
    if not stat.S_ISDIR(info.st_mode):
        raise RunDirError(f"{path} is not a directory (a file of {who(info.st_uid)}): refusing to use it: remove it, "
                          "or have an administrator remove it")
    if info.st_uid != os.getuid():
        raise RunDirError(f"{path} belongs to {who(info.st_uid)}, not to this user ({who(os.getuid())}): refusing to "
                          "use it (another user may have created it first, to stop or watch your jobs): ask them or "
                          "an administrator to remove it")
    if info.st_mode & 0o077:
        raise RunDirError(f"{path} is open to other users (mode {oct(info.st_mode & 0o777)}): refusing to use it: it is "
                          f"yours, so `chmod 700 {path}` makes it usable")
    return path


def job_run_dir(job_id: str, root: str | None = None) -> str:
    """The job's run directory on this node, created and checked component by component."""
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise RunDirError(f"bad job id {job_id!r}")
    root = private_dir(root or run_root())
    return private_dir(os.path.join(root, job_id))


STORE_ID = re.compile(r"[0-9a-f]{32}")  # a job store's id (``launcher.run.identity.store_id``)
FOLLOWED, FILED = "followed", "filed"


def mark_store(run_dir: str, store: str, filed: bool = False) -> None:
    """Record in ``run_dir`` that the job store ``store`` follows the job here (``filed``: has filed all of it)."""
    if not STORE_ID.fullmatch(store):
        raise RunDirError(f"bad job store id {store!r}")
    folder = private_dir(os.path.join(run_dir, FILED if filed else FOLLOWED))
    os.close(os.open(os.path.join(folder, store), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600))


def stores(run_dir: str, filed: bool = False) -> set[str]:
    """The job stores that followed the job in ``run_dir`` (``filed``: that have filed all of it)."""
    try:
        names = os.listdir(os.path.join(run_dir, FILED if filed else FOLLOWED))
    except OSError:
        return set()
    return {name for name in names if STORE_ID.fullmatch(name)}
