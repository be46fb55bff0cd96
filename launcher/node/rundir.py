"""A job's private run directory on a node, under one of this user's private roots, created and checked component by
component (another user's, a symlink or one open to others is refused); and which job stores followed the job there
and which have filed it (``followed/STORE``, ``filed/STORE``): the directory goes once every one has.

The root new run directories go in is ``$XDG_RUNTIME_DIR/launch`` when that directory is this user's and closed to
others, else ``/tmp/launch-UID-XXXXXXXXXXXX``: made by ``mkdir`` under a random name and found again by its owner,
so no other user can make it first or take its place (a name planted there is only skipped). Without a runtime
directory, readers look a job up in every root of this user's in /tmp (``roots``): two agents may have made one
each at once, and ``/tmp/launch-UID`` is the root before, whose jobs stay found while they run.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import os
import pwd
import re
import stat

TMP_DIR = "/tmp"  # where a root is made when there is no runtime directory
MAKE_TRIES = 100  # random names tried before a root is given up (each taken already: someone floods the names)


class RunDirError(Exception):
    """The run directory cannot be used safely (another user's, a symlink, too open)."""


def run_root() -> str:
    """The root this user's new run directories go in on this node: ``$XDG_RUNTIME_DIR/launch``, else the first by
    name of this user's ``/tmp/launch-UID-*`` directories, made (mode 0700) when there is none."""
    runtime = _runtime_root()
    if runtime is not None:
        return runtime
    found = _tmp_roots()
    if found:
        return found[0]
    check_parent(TMP_DIR)
    for _ in range(MAKE_TRIES):
        try:
            os.mkdir(os.path.join(TMP_DIR, f"launch-{os.getuid()}-{os.urandom(6).hex()}"), 0o700)
            break
        except FileExistsError:
            continue
    else:
        raise RunDirError(f"cannot make a run root in {TMP_DIR}: {MAKE_TRIES} random names were all taken")
    return _tmp_roots()[0]  # two made at once: both agents take the same one, and readers look in both


def roots() -> list[str]:
    """Every root this user's run directories may be in on this node, ``run_root()``'s first; none is made here:
    ``$XDG_RUNTIME_DIR/launch`` alone where it is the root, else this user's ``/tmp/launch-UID-*`` and
    ``/tmp/launch-UID`` (the root before, whose jobs stay found)."""
    runtime = _runtime_root()
    if runtime is not None:
        return [runtime]
    legacy = os.path.join(TMP_DIR, f"launch-{os.getuid()}")
    try:
        mine = _mine(os.lstat(legacy))
    except FileNotFoundError:
        mine = False
    return [*_tmp_roots(), *([legacy] if mine else [])]


def _runtime_root() -> str | None:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and _owned_private(os.lstat(runtime)):
        return os.path.join(runtime, "launch")
    return None


def _tmp_roots() -> list[str]:
    """This user's ``/tmp/launch-UID-*`` directories (never a symlink, nor another user's), by name."""
    name = re.compile(rf"launch-{os.getuid()}-[0-9a-f]{{12}}")
    with os.scandir(TMP_DIR) as entries:
        return sorted(entry.path for entry in entries
                      if name.fullmatch(entry.name) and _mine(entry.stat(follow_symlinks=False)))


def _mine(info: os.stat_result) -> bool:
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()


def _owned_private(info: os.stat_result) -> bool:
    return _mine(info) and not info.st_mode & 0o077


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
    check_parent(os.path.dirname(path.rstrip("/")) or "/")
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


def check_parent(parent: str) -> None:
    """Refuse ``parent`` as the place of a private directory unless it is this user's or root's and, if others may
    write it, sticky (so that no one else can rename or remove what is made there)."""
    info = os.lstat(parent)
    if info.st_uid not in (0, os.getuid()) or (info.st_mode & 0o002 and not info.st_mode & stat.S_ISVTX):
        raise RunDirError(f"{parent} may be changed by other users (owner {who(info.st_uid)}, mode "
                          f"{oct(info.st_mode & 0o7777)})")


def job_run_dir(job_id: str, root: str | None = None) -> str:
    """The job's run directory on this node, checked component by component: in ``root`` when given, else the
    one it has in any root of this user's, else made in ``run_root()``."""
    _check_id(job_id)
    root = root or _holding(job_id) or run_root()
    return private_dir(os.path.join(private_dir(root), job_id))


def existing_run_dir(job_id: str) -> str | None:
    """The job's run directory on this node, checked, if any root of this user's has one (never made here)."""
    root = _holding(_check_id(job_id))
    return job_run_dir(job_id, root) if root is not None else None


def _check_id(job_id: str) -> str:
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise RunDirError(f"bad job id {job_id!r}")
    return job_id


def _holding(job_id: str) -> str | None:
    """The first of this user's roots with an entry named ``job_id``."""
    return next((root for root in roots() if os.path.lexists(os.path.join(root, job_id))), None)


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
