"""Run a program on a pseudo-terminal of a fixed size and read back the screen it leaves (pyte)."""

from __future__ import annotations

import os
import select
import subprocess
import termios
import time
from dataclasses import dataclass

import pyte


@dataclass
class TerminalRun:
    returncode: int
    raw: bytes             # everything the program wrote, escape codes included
    screen: list[str]      # the screen's lines at the end (right-trimmed), as a user would see them

    @property
    def text(self) -> str:
        return "\n".join(line for line in self.screen if line)


def run_in_terminal(argv: list[str], env: dict[str, str], cols: int = 100, rows: int = 200,
                    timeout: float = 60) -> TerminalRun:
    """Run ``argv`` with stdin, stdout and stderr on a new pty of ``cols`` x ``rows`` until it exits."""
    master, slave = os.openpty()
    termios.tcsetwinsize(slave, (rows, cols))
    env = {**env, "COLUMNS": str(cols), "LINES": str(rows), "TERM": "xterm-256color"}
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    raw = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the program and every holder of the pty are gone
                break
            if not chunk:
                break
            raw += chunk
        else:
            proc.kill()
            raise TimeoutError(f"{argv} still running after {timeout} s; it wrote: {bytes(raw[-2000:])!r}")
    finally:
        os.close(master)
    screen = pyte.Screen(cols, rows)
    pyte.ByteStream(screen).feed(bytes(raw))
    return TerminalRun(proc.wait(timeout=10), bytes(raw), [line.rstrip() for line in screen.display])


class ControllingTerminal:
    """A program started as a terminal emulator or sshd starts a login shell: a session leader whose controlling
    terminal is a new pty. Its output is read (and kept) by a thread, so it never blocks on a full pty; ``type``
    writes keys (``\\x03`` is Ctrl-C: SIGINT from the line discipline); ``hang_up`` closes the terminal as a closed
    window or a dropped SSH session does: the kernel sends SIGHUP, and writes to the pty fail from then on."""

    def __init__(self, argv: list[str], env: dict[str, str], cols: int = 200, rows: int = 50) -> None:
        import fcntl
        import threading

        self._master, slave = os.openpty()
        termios.tcsetwinsize(slave, (rows, cols))
        env = {**env, "COLUMNS": str(cols), "LINES": str(rows), "TERM": "xterm-256color"}
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True,
                                     start_new_session=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
        os.close(slave)
        self.raw = bytearray()
        self._lock, self._closing = threading.Lock(), threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while not self._closing.is_set():
            ready, _, _ = select.select([self._master], [], [], 0.1)
            if not ready:
                continue
            try:
                chunk = os.read(self._master, 65536)
            except OSError:
                return
            if not chunk:
                return
            with self._lock:
                self.raw += chunk

    @property
    def text(self) -> str:
        with self._lock:
            return bytes(self.raw).decode(errors="replace")

    def type(self, keys: bytes) -> None:
        os.write(self._master, keys)

    def hang_up(self) -> None:
        self._closing.set()
        self._reader.join()
        os.close(self._master)
