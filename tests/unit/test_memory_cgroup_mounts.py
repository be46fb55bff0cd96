"""The OOM tests' cgroup helper finds cgroup v2 mounts in /proc/self/mountinfo (tests/memory_cgroup.py)."""

from __future__ import annotations

from tests.memory_cgroup import cgroup2_mounts

HYBRID = """\
35 24 0:30 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
40 35 0:35 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,memory
"""
UNIFIED = """\
29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
30 23 0:27 / /mnt/my\\040cgroups rw,relatime shared:5 - cgroup2 none rw
"""


def test_a_hybrid_host_has_one_cgroup2_mount_and_v1_ones_are_not_counted() -> None:
    assert cgroup2_mounts(HYBRID) == ["/sys/fs/cgroup/unified"]


def test_a_unified_host_lists_every_cgroup2_mount_with_spaces_decoded() -> None:
    assert cgroup2_mounts(UNIFIED) == ["/sys/fs/cgroup", "/mnt/my cgroups"]


def test_no_cgroup2_mount() -> None:
    assert cgroup2_mounts("") == []
