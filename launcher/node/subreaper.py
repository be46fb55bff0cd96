"""The agent as its command's child subreaper: prctl hardening, its own children (helpers such as nvidia-smi and
clean-up commands) kept apart from the orphans it reaps.
Standard library only: it runs on nodes.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading

from . import proctree

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36

SPAWN = threading.Lock()  # held while the agent starts a child of its own, and while it reaps orphans
OWN: set[int] = set()  # the agent's own children (its command, nvidia-smi, clean-up): reaped by their waiters


def run_helper(argv: list[str], timeout: float, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)`` as a child the orphan reaper leaves to its waiter."""
    with SPAWN:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
        OWN.add(proc.pid)
    try:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    finally:
        with SPAWN:
            OWN.discard(proc.pid)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def reap_orphans() -> list[int]:
    """Reap the zombies re-parented to the agent (it is a child subreaper), never one of its own children.

    ``waitid(WNOWAIT)`` first names a waitable child without reaping it: none (the usual case, every second), or only
    orphans, costs no look through /proc, whose every process it would read (every process of the machine on a test
    bed of namespace hosts); the look is left for a child of the agent's own that has exited and waits for its
    waiter."""
    me, reaped = os.getpid(), list[int]()
    with SPAWN:
        while True:
            try:
                waitable = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return reaped
            if waitable is None:
                return reaped
            if waitable.si_pid in OWN:
                break
            with contextlib.suppress(ChildProcessError):
                os.waitpid(waitable.si_pid, os.WNOHANG)
                reaped.append(waitable.si_pid)
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in OWN:
                continue
            stat = proctree._stat(int(entry))
            if stat is None or stat[0] != me or stat[1] != "Z":
                continue
            try:
                os.waitpid(int(entry), os.WNOHANG)
                reaped.append(int(entry))
            except ChildProcessError:
                pass
    return reaped


def harden(prctl) -> bool:
    """Before any rank starts: make the agent undumpable (its /proc files, its fds above all, become root's: a
    rank of the same user cannot write the agent's framed lines through /proc/<agent>/fd/1) and its command's
    child subreaper; whether the subreaper is set (old kernels, other systems: the job tag alone finds processes)."""
    if prctl is None:
        return False
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    return prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def run_cleanup(commands: list[list[str]], grace: float) -> list[str]:
    """Run each clean-up command in order (stop a container, then remove it); the ones that failed, with why, or
    none when the last one succeeded: it removes the container however it went (``rm -f`` exits 0 when there is
    none), so a stop that found no container (it had exited with its command, and ``--rm`` removed it) is no
    failure, nor something left behind."""
    failed, last_ok = [], True
    for argv in commands:
        try:
            done = run_helper(argv, 30 + grace, cwd="/")
        except (OSError, subprocess.TimeoutExpired) as exc:
            failed.append(f"{' '.join(argv[:3])}: {exc}")
            last_ok = False
            continue
        last_ok = done.returncode == 0
        if not last_ok:
            failed.append(f"{' '.join(argv[:3])}: {(done.stderr or done.stdout).strip()[-200:]}")
    return [] if last_ok else failed


def libc_prctl():
    """libc's ``prctl``, or None where there is none (other systems)."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
