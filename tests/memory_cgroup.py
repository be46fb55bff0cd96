"""A memory-limited cgroup for tests that need the kernel's OOM killer, on cgroup v1 or v2.

A rank joins it (writes its pid to ``cgroup.procs``) and allocates past the limit. v1: a group
under the memory controller's hierarchy with ``memory.limit_in_bytes``. v2: a group under the
unified hierarchy's root with ``memory.max`` (and ``memory.swap.max`` 0, so the excess is killed,
not swapped), the memory controller enabled for the root's children if it is not already.
Created and removed here; skipped, with the reason, where neither can be made.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.helpers import wait_for

V1_MEMORY = "/sys/fs/cgroup/memory"


def cgroup2_mounts(mountinfo: str) -> list[str]:
    """The mount points of cgroup2 file systems in ``/proc/self/mountinfo`` text."""
    points = []
    for line in mountinfo.splitlines():
        fields, _, after = line.partition(" - ")
        if after.split(" ", 1)[0] == "cgroup2":
            points.append(fields.split()[4].replace("\\040", " "))
    return points


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


def _write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _v2_parent() -> tuple[str | None, str]:
    """(a cgroup v2 directory whose children can have a memory limit, or None; why not)."""
    mounts = [m for m in cgroup2_mounts(_read("/proc/self/mountinfo")) if "memory" in _read(f"{m}/cgroup.controllers").split()]
    if not mounts:
        return None, "no cgroup2 hierarchy has the memory controller"
    root = mounts[0]
    if "memory" not in _read(f"{root}/cgroup.subtree_control").split():
        try:
            _write(f"{root}/cgroup.subtree_control", "+memory")
        except OSError as exc:  # EBUSY: processes in a non-root group (a container's cgroup namespace)
            return None, f"cannot enable the memory controller for {root}'s children: {exc}"
    return root, ""


@contextmanager
def memory_cgroup(name: str, limit_bytes: int) -> Iterator[str]:
    """A fresh cgroup limited to ``limit_bytes`` of memory; its directory. Removed once its processes are gone."""
    if os.geteuid() != 0:
        pytest.skip("needs root to make a memory cgroup that provokes a real OOM kill")
    if os.path.isdir(V1_MEMORY):
        path = os.path.join(V1_MEMORY, f"{name}-{os.getpid()}")
        os.mkdir(path)
        _write(os.path.join(path, "memory.limit_in_bytes"), str(limit_bytes))
    else:
        parent, why = _v2_parent()
        if parent is None:
            pytest.skip(f"neither the cgroup v1 memory controller nor a usable cgroup v2 one: {why}")
        path = os.path.join(parent, f"{name}-{os.getpid()}")
        os.mkdir(path)
        _write(os.path.join(path, "memory.max"), str(limit_bytes))
        if os.path.exists(os.path.join(path, "memory.swap.max")):
            _write(os.path.join(path, "memory.swap.max"), "0")
    try:
        yield path
    finally:
        wait_for(lambda: not _read(os.path.join(path, "cgroup.procs")).strip(), timeout=10)
        os.rmdir(path)
