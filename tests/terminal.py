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
