"""Podman test images without a registry, and podman inside testbed hosts. Stdlib only; needs root,
podman and runc (``scripts/setup.sh --test``). See docs/CONTAINERS.md, section "Tests".

The image is a root file system skeleton imported with ``podman import``: empty ``/usr`` (the host's is
bind-mounted read-only at run time), ``bin lib lib64 sbin`` as links into it, the few ``/etc`` files a
dynamically linked interpreter needs (no keys, no shadow), and empty ``proc sys dev tmp run``. Its
containers run the host's virtualenv through read-only mounts (``python_mounts``).

Inside a testbed host (tools/testbed.py), runc needs the cgroup v1 hierarchies that every host mounts
when it boots, and every host shares ``/var/lib/containers`` unless it is given a store of its own
(``own_image_store``), which acts in the mount namespace of the host's sshd, the one SSH sessions see.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools import testbed as tb

SKELETON_VERSION = 1
DEFAULT_IMAGE = f"localhost/launch-test:{SKELETON_VERSION}"
RUNTIME_CONF = Path("/etc/containers/containers.conf.d/50-launch-tests.conf")
RUNTIME_CONF_TEXT = ("# Written by launch's test set-up (tools/container_image.py, scripts/setup.sh --test):\n"
                     "# crun fails on these hosts' hybrid cgroups; runc works.\n[engine]\nruntime = \"runc\"\n")
# This VM lacks CAP_SYS_RESOURCE: podman's default rlimits fail ("setrlimit ...: Operation not permitted").
SITE_OPTIONS = ("--ulimit", "nofile=16384:16384", "--ulimit", "nproc=8192:8192")
ETC_ENTRIES = ("passwd", "group", "nsswitch.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d",
               "localtime", "os-release", "host.conf")
EMPTY_DIRS = {"usr": 0o755, "etc": 0o755, "proc": 0o555, "sys": 0o555, "dev": 0o755, "run": 0o755,
              "root": 0o700, "home": 0o755, "var": 0o755, "tmp": 0o1777, "var/tmp": 0o1777}
USR_LINKS = ("bin", "lib", "lib64", "sbin")
# Podman's state that a host keeps to itself with its own store: images and containers, run-time
# state, libpod's state (exit files, events, the "alive" marker), and /dev/shm (libpod's lock segment).
OWN_STORE_DIRS = ("/var/lib/containers", "/run/containers", "/run/libpod")
COMMAND_TIMEOUT_S = 120.0


class ContainerImageError(RuntimeError):
    """A podman or mount step failed; the message says which and why."""


@dataclass(frozen=True)
class ImageBuild:
    name: str
    built: bool      # False: the image was already there
    seconds: float


def _run(argv: Sequence[str], *, timeout: float = COMMAND_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ContainerImageError(f"`{' '.join(argv)}` failed: {exc}") from exc
    if check and done.returncode != 0:
        raise ContainerImageError(f"`{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()}")
    return done


def ensure_runtime_conf(path: Path = RUNTIME_CONF) -> bool:
    """Make runc podman's default runtime through a drop-in file; True when it was (re)written."""
    if path.exists() and path.read_text() == RUNTIME_CONF_TEXT:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(RUNTIME_CONF_TEXT)
    return True


def image_exists(name: str = DEFAULT_IMAGE) -> bool:
    return _run(["podman", "image", "exists", name], check=False).returncode == 0


CLAIMS_DIR = "opt/launch-claims"


def write_rootfs_tar(path: Path, etc: Path = Path("/etc"), claims: Mapping[str, str] | None = None) -> None:
    """The skeleton root file system as a tar archive at ``path``; ``claims`` (package -> version) adds
    dist-info metadata under /opt/launch-claims, so that an image can report other package versions."""
    with tarfile.open(path, "w") as tar:
        for package, version in (claims or {}).items():
            metadata = f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n".encode()
            info = tarfile.TarInfo(f"{CLAIMS_DIR}/{package}-{version}.dist-info/METADATA")
            info.size, info.mode = len(metadata), 0o644
            tar.addfile(info, io.BytesIO(metadata))
        for name, mode in EMPTY_DIRS.items():
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)
        for name in USR_LINKS:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, f"usr/{name}", 0o777
            tar.addfile(info)
        for name in ETC_ENTRIES:
            if os.path.lexists(etc / name):
                tar.add(etc / name, arcname=f"etc/{name}")
        marker = f"launch test image {SKELETON_VERSION}\n".encode()
        info = tarfile.TarInfo("etc/launch-test-image")
        info.size, info.mode = len(marker), 0o644
        tar.addfile(info, io.BytesIO(marker))


def build_image(name: str = DEFAULT_IMAGE, *, rebuild: bool = False, host: tb.Host | None = None,
                claims: Mapping[str, str] | None = None) -> ImageBuild:
    """Import the skeleton as ``name`` into the local store (of ``host`` when given), unless it is there.

    ``claims`` (package -> version) makes ``importlib.metadata`` in the image report those versions
    (their dist-info directory first on PYTHONPATH): an image whose torch differs, for version checks."""
    start = time.monotonic()
    prefix = _host_prefix(host) if host else []
    if not rebuild and _run([*prefix, "podman", "image", "exists", name], check=False).returncode == 0:
        return ImageBuild(name=name, built=False, seconds=time.monotonic() - start)
    previous = _run([*prefix, "podman", "image", "inspect", "--format", "{{.Id}}", name], check=False)
    with tempfile.TemporaryDirectory(prefix="launch-image-") as tmp:
        archive = Path(tmp) / "rootfs.tar"
        write_rootfs_tar(archive, claims=claims)
        changes = ["--change", "CMD=[\"/bin/sh\"]"]
        if claims:
            changes += ["--change", f"ENV=PYTHONPATH=/{CLAIMS_DIR}"]
        _run([*prefix, "podman", "import", *changes, str(archive), name])
    if previous.returncode == 0:  # the image it replaced, now untagged (kept if a container uses it)
        _run([*prefix, "podman", "rmi", previous.stdout.strip()], check=False)
    return ImageBuild(name=name, built=True, seconds=time.monotonic() - start)


def python_mounts(python: str = sys.executable, extra: Sequence[str] = ()) -> list[str]:
    """Read-only mounts (``SRC:SRC:ro``) that let a container of the image run ``python`` as on the host:
    ``/usr``, the interpreter's installation (a pyenv root), the virtualenv, every directory on its
    ``sys.path`` outside those (``.pth`` files), and ``extra`` (e.g. a source tree installed editable)."""
    probe = "import json, sys; print(json.dumps([sys.base_prefix, sys.prefix, *sys.path]))"
    paths = json.loads(_run([python, "-I", "-c", probe]).stdout)
    wanted = ["/usr", *(os.path.realpath(p) for p in [*paths, *extra] if p and os.path.isdir(p))]
    kept: list[str] = []
    for path in sorted(set(wanted), key=len):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return [f"{path}:{path}:ro" for path in kept]


# ---------------------------------------------------------------- inside testbed hosts

def _sshd_pid(host: tb.Host) -> int:
    pid = tb.sshd_pid(host)
    if pid is None:
        raise ContainerImageError(f"{host.name}: sshd is not running; its mount namespace is the host's")
    return pid


def _host_prefix(host: tb.Host) -> list[str]:
    """argv prefix entering ``host`` as its SSH sessions see it: its sshd's mount, network and UTS namespaces."""
    return ["nsenter", "-t", str(_sshd_pid(host)), "-m", "-n", "-u", "--"]


def in_host(host: tb.Host, argv: Sequence[str], *, timeout: float = COMMAND_TIMEOUT_S,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside ``host`` (the namespaces of its sshd) and capture its output."""
    return _run([*_host_prefix(host), *argv], timeout=timeout, check=check)


def _mount_points(host: tb.Host) -> set[str]:
    """The mount points of ``host``'s sshd mount namespace."""
    lines = Path(f"/proc/{_sshd_pid(host)}/mountinfo").read_text().splitlines()
    return {line.split()[4] for line in lines}


def own_store_dir(host: tb.Host) -> Path:
    """Where ``host``'s own podman state lives on the machine (under the testbed's base_dir)."""
    return host.dir / "containers"


def give_own_image_store(host: tb.Host) -> Path:
    """Give ``host`` podman state of its own (idempotent): per-host directories bound over
    OWN_STORE_DIRS and a tmpfs on /dev/shm, in its mount namespace. Images and containers made in
    it are invisible to the machine and the other hosts, and theirs to it."""
    root = own_store_dir(host)
    mounted = _mount_points(host)
    for target in OWN_STORE_DIRS:
        if target in mounted:
            continue
        source = root / target.strip("/").replace("/", "-")
        source.mkdir(parents=True, exist_ok=True, mode=0o700)
        in_host(host, ["mkdir", "-p", target])
        in_host(host, ["mount", "--bind", str(source), target])
    if "/dev/shm" not in mounted:
        in_host(host, ["mount", "-t", "tmpfs", "-o", "mode=1777", "shm", "/dev/shm"])
    return root


def drop_own_image_store(host: tb.Host) -> None:
    """Remove ``host``'s containers, unmount its own state and delete it: it shares the machine's again."""
    mounted = _mount_points(host)
    if OWN_STORE_DIRS[0] in mounted:
        in_host(host, ["podman", "rm", "--all", "--force", "--time", "0"], check=False)
    for target in (*OWN_STORE_DIRS, "/dev/shm"):
        if target in mounted:
            in_host(host, ["umount", "--recursive", target])
    shutil.rmtree(own_store_dir(host), ignore_errors=True)


@contextlib.contextmanager
def own_image_store(host: tb.Host) -> Iterator[Path]:
    """``host`` has its own, empty podman state inside the block; the shared one again after it."""
    path = give_own_image_store(host)
    try:
        yield path
    finally:
        drop_own_image_store(host)
