"""Before launch, on every node: copy the local workdir (opt-in) and run the ``setup:`` commands.

``sync_workdir`` (a local directory) is copied to the cluster's ``workdir`` on
each node over SFTP. Files whose size and modification time already match are
skipped, so a second launch copies only what changed; ``.git`` and
``__pycache__`` directories are left out. Each file lands under a temporary
name and is renamed into place, so a process reading it never sees half a file.

``setup:`` commands then run one after the other in the workdir, each through
``sh -c``, tagged with the job id; the first failure stops the launch. What
both steps did is written to ``setup-nodeK.log`` in the job's run directory.
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import paramiko

from launcher.backends.ssh.connection import Connection
from launcher.errors import LaunchError
from launcher.plan.planner import NodePlan
from launcher.spec.cluster import ClusterSpec

EXCLUDED_DIRS = frozenset({".git", "__pycache__"})
SETUP_STALL_S = 3600.0


@dataclass
class SyncResult:
    """What a sync did: remote paths copied, how many files were already up to date, paths skipped."""

    copied: list[str] = field(default_factory=list)
    unchanged: int = 0
    skipped: list[str] = field(default_factory=list)


def prepare_node(conn: Connection, cluster: ClusterSpec, node: NodePlan, job_id: str, log_path: Path) -> None:
    """Sync the workdir (if configured) and run every setup command on one node; log to ``log_path``."""
    host = conn.target.alias
    with open(log_path, "a", encoding="utf-8") as log:
        if cluster.sync_workdir:
            local = Path(cluster.sync_workdir).expanduser()
            done = sync_workdir(conn, local, node.cwd, suffix=f"{job_id}.{node.index}")
            log.write(f"sync {local} -> {host}:{node.cwd}: {len(done.copied)} copied, {done.unchanged} unchanged\n")
            log.writelines(f"  copied  {path}\n" for path in done.copied)
            log.writelines(f"  skipped {path} (not a readable regular file)\n" for path in done.skipped)
        env = {"LAUNCH_JOB_ID": job_id, "LAUNCH_NODE": str(node.index)}
        for command in cluster.setup:
            run_setup(conn, command, node.cwd, env, log, log_path)


def run_setup(conn: Connection, command: str, cwd: str, env: dict[str, str], log: TextIO, log_path: Path) -> None:
    """Run one setup command (``sh -c``) in ``cwd``; LaunchError with its last lines if it fails."""
    log.write(f"$ {command}\n")
    log.flush()
    result = conn.run(["sh", "-c", command], env, cwd, timeout=SETUP_STALL_S, combine=True)
    log.write(result.out)
    log.write(f"[exit {result.code}]\n")
    log.flush()
    if result.code != 0:
        tail = " | ".join(result.out.strip().splitlines()[-5:]) or "no output"
        raise LaunchError(
            f"{conn.target.alias}: setup command `{command}` exited {result.code}: {tail} (full output: {log_path})"
        )


def sync_workdir(conn: Connection, local: Path, remote: str, suffix: str = "launch") -> SyncResult:
    """Copy ``local`` to ``remote`` on the host, skipping files whose size and mtime match."""
    if not local.is_dir():
        raise LaunchError(f"sync_workdir: '{local}' is not a local directory")
    result = SyncResult()
    sftp = conn.sftp()
    try:
        _makedirs(sftp, remote)
        for dirpath, dirnames, filenames in os.walk(local):
            dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
            relative = Path(dirpath).relative_to(local)
            target_dir = posixpath.join(remote, relative.as_posix()) if relative.parts else remote
            present = _listing(sftp, target_dir)
            for name in sorted(filenames):
                _sync_file(sftp, Path(dirpath) / name, target_dir, name, present.get(name), suffix, result)
    except OSError as exc:
        raise LaunchError(f"{conn.target.alias}: sync_workdir to {remote} failed: {exc}") from None
    finally:
        sftp.close()
    return result


def _sync_file(
    sftp: paramiko.SFTPClient,
    source: Path,
    target_dir: str,
    name: str,
    remote: paramiko.SFTPAttributes | None,
    suffix: str,
    result: SyncResult,
) -> None:
    destination = posixpath.join(target_dir, name)
    try:
        info = source.stat()
    except OSError:
        result.skipped.append(destination)
        return
    if not stat.S_ISREG(info.st_mode):
        result.skipped.append(destination)
        return
    if remote is not None and remote.st_size == info.st_size and remote.st_mtime == int(info.st_mtime):
        result.unchanged += 1
        return
    temporary = posixpath.join(target_dir, f".{name}.{suffix}.tmp")
    sftp.put(str(source), temporary)
    sftp.chmod(temporary, stat.S_IMODE(info.st_mode))
    sftp.utime(temporary, (info.st_atime, info.st_mtime))
    sftp.posix_rename(temporary, destination)
    result.copied.append(destination)


def _listing(sftp: paramiko.SFTPClient, path: str) -> dict[str, paramiko.SFTPAttributes]:
    """The entries of a remote directory, creating it when missing."""
    try:
        return {entry.filename: entry for entry in sftp.listdir_attr(path)}
    except FileNotFoundError:
        _makedirs(sftp, path)
        return {}


def _makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    """``mkdir -p`` over SFTP; a directory another node made meanwhile (shared filesystem) is fine."""
    try:
        sftp.stat(path)
    except FileNotFoundError:
        parent = posixpath.dirname(path.rstrip("/"))
        if parent and parent != path:
            _makedirs(sftp, parent)
        try:
            sftp.mkdir(path)
        except OSError:
            sftp.stat(path)
