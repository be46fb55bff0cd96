"""Real Unix users for tests of what one user may do to another's jobs (leases, docs/LEASES.md).

``unix_users`` makes them once per session with ``useradd`` (unlocked, as sshd without PAM needs), each with
an SSH key the testbed's hosts accept, its own LAUNCH_HOME and known_hosts, and removes them afterwards with
everything that was opened to them (the modes of /root and the testbed's directories, its authorized_keys).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.testbed_fixture import USERS_BED, Beds

ROOT = Path(__file__).resolve().parent.parent
USER_NAMES = ("lt-user-a", "lt-user-b", "lt-user-c")


@dataclass(frozen=True)
class User:
    """A test user: its ids, its private directory (LAUNCH_HOME, key, known_hosts) and how to run as it."""

    name: str
    uid: int
    gid: int
    dir: Path

    @property
    def home(self) -> Path:
        return self.dir / "launch-home"

    @property
    def key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        """Each testbed host's name to its address (the testbed's own ssh_config logs in as root)."""
        return self.dir / "ssh_config"

    def env(self, **extra: str) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": pwd.getpwuid(self.uid).pw_dir,
                "USER": self.name, "LAUNCH_HOME": str(self.home), "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8", **extra}

    def popen(self, args: list[str], env: dict[str, str]) -> subprocess.Popen:
        """`launch ARGS` as this user."""
        return subprocess.Popen([sys.executable, "-m", "launcher", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env, cwd=self.dir, user=self.uid,
                                group=self.gid, extra_groups=[])

    def run(self, args: list[str], env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
        proc = self.popen(args, env)
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            proc.terminate()
            proc.communicate(timeout=60)
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def python(self, code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        """``python -c CODE`` as this user."""
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                              user=self.uid, group=self.gid, extra_groups=[])


def _opened(path: Path, modes: dict[Path, int]) -> None:
    """Let every user traverse ``path`` (its old mode kept in ``modes`` to restore)."""
    mode = path.stat().st_mode
    if not mode & stat.S_IXOTH:
        modes.setdefault(path, stat.S_IMODE(mode))
        path.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _end_processes_of(uid: int) -> None:
    """SIGKILL, by pid, whatever a test user left running."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as handle:
                    owner = next(int(line.split()[1]) for line in handle if line.startswith("Uid:"))
                if owner == uid:
                    os.kill(int(entry), signal.SIGKILL)
            except (OSError, StopIteration, ValueError):
                pass


@pytest.fixture(scope="session")
def unix_users(testbeds: Beds) -> Iterator[dict[str, User]]:
    """The users of USER_NAMES, by name, able to log in to the hosts of bed USERS_BED with their own keys."""
    testbed = testbeds.get(USERS_BED)
    base = Path(tempfile.mkdtemp(prefix="lt-users-", dir="/tmp"))
    base.chmod(0o755)
    authorized = testbed.base_dir / "authorized_keys"
    original_keys = authorized.read_text()
    modes: dict[Path, int] = {}
    users: dict[str, User] = {}
    try:
        for name in USER_NAMES:
            subprocess.run(["userdel", "-r", name], capture_output=True)  # one a killed session left behind
            subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)
            subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)
            entry = pwd.getpwnam(name)
            user = User(name, entry.pw_uid, entry.pw_gid, base / name)
            user.dir.mkdir(mode=0o700)
            shutil.copy(testbed.known_hosts, user.known_hosts)
            user.ssh_config.write_text("".join(f"Host {h.name}\n    HostName {h.address}\n" for h in testbed.hosts))
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(user.key)], check=True)
            for path in (user.dir, *user.dir.iterdir()):
                os.chown(path, user.uid, user.gid)
            with authorized.open("a") as handle:
                handle.write(user.key.with_suffix(".pub").read_text())
            users[name] = user
        for path in (Path(sys.executable).resolve().parent, authorized.parent):
            for parent in [path, *path.parents]:
                _opened(parent, modes)
        yield users
    finally:
        for user in users.values():
            _end_processes_of(user.uid)
        for name in USER_NAMES:
            subprocess.run(["userdel", "-r", name], capture_output=True)
        authorized.write_text(original_keys)
        for path, mode in modes.items():
            path.chmod(mode)
        shutil.rmtree(base, ignore_errors=True)
