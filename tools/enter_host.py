"""The step that enters a testbed host: run inside its fresh UTS + mount namespaces.

``ip netns exec lt-hI unshare --uts --mount python -I -S tools/enter_host.py
--hostname lt-hI [--bind SRC DST]... [--detach] -- COMMAND...`` sets the hostname,
makes the bind mounts, mounts cgroup v1 hierarchies on /sys/fs/cgroup (``ip netns
exec`` remounts /sys and leaves it empty; slurmd and runc refuse to start without
them), then executes COMMAND. Every mount is private to that mount namespace and goes
with it. Run by path with ``-I -S``: stdlib only, imports nothing of ours.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import sys
from collections.abc import Sequence

CGROUP_ROOT = "/sys/fs/cgroup"
CGROUP_CONTROLLERS = ("cpuset", "memory", "freezer", "devices", "pids")
CGROUP_NAMED = ("systemd",)
MS_BIND = 4096  # <sys/mount.h>


def _mount(source: str, target: str, fstype: str = "", options: str = "", flags: int = 0) -> None:
    """mount(2), without a process per mount; OSError naming ``target`` on failure."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(source.encode(), target.encode(), fstype.encode(), flags, options.encode()) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def _mount_cgroups() -> None:
    """A tmpfs on CGROUP_ROOT with the v1 hierarchies slurmd and runc need (this mount namespace only)."""
    _mount("cgroup", CGROUP_ROOT, "tmpfs", "mode=755")
    for name, options in [(c, c) for c in CGROUP_CONTROLLERS] + [(n, f"none,name={n}") for n in CGROUP_NAMED]:
        target = os.path.join(CGROUP_ROOT, name)
        os.mkdir(target)
        _mount("cgroup", target, "cgroup", options)


def _boot(argv: Sequence[str]) -> None:
    """Inside a host's fresh UTS + mount namespaces: set it up (hostname, bind mounts,
    cgroup v1 hierarchies), then exec the command.

    ``argv``: ``--hostname NAME [--bind SRC DST]... [--detach] -- COMMAND...``.
    With ``--detach`` the command runs in a new session, orphaned, and its PID is
    printed: its parent is then not the caller, which never has to reap it.
    """
    split = list(argv).index("--")
    parser = argparse.ArgumentParser(prog="testbed-boot")
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--bind", nargs=2, action="append", default=[], metavar=("SOURCE", "TARGET"))
    parser.add_argument("--detach", action="store_true")
    options = parser.parse_args(argv[:split])
    command = list(argv[split + 1:])
    try:
        socket.sethostname(options.hostname)
        for source, target in options.bind:
            _mount(source, target, flags=MS_BIND)
        _mount_cgroups()
    except OSError as exc:
        sys.exit(f"testbed-boot: {options.hostname}: {exc}")
    if options.detach:
        child = os.fork()
        if child:
            print(child, flush=True)
            os._exit(0)
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.exit(f"testbed-boot: {options.hostname}: cannot run {command[0]}: {exc}")


if __name__ == "__main__":
    _boot(sys.argv[1:])
