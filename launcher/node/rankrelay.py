"""DeepSpeed's per-node launcher with each rank's output on a pipe of its own: the program ``rankstreams`` runs in
the launcher's interpreter (``python -u -c PROGRAM ...``), with ``linecut`` beside it.

DeepSpeed's launcher starts its ranks with ``subprocess.Popen``; here its module sees a ``Popen`` that gives each
rank a pipe of its own (stdout and stderr) and a thread that writes the rank's whole lines, each behind ``PREFIX``
(as torchrun's tee does with the plan's template) and cut at ``LINE_LIMIT`` bytes (``linecut``), a read's lines in one write under a lock.
The rest of the launcher is DeepSpeed's own (``--enable_each_rank_log``, files a rank, is left as DeepSpeed does it).
Standard library only, besides DeepSpeed's launcher, imported when ``main`` runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
import types

from .linecut import LINE_LIMIT, READ_CHUNK, bounded_lines

# Before each line of a rank, here and (the plan's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE) in torchrun's tee. The space
# sets a rank's empty line ("[1]: ") apart from the keys of torchrun's own failure report ("[1]:" alone).
PREFIX = "[{rank}]: "
# PREFIX as a regular expression capturing the rank: how every reader of a rank's line (the supervisor's record
# parser, the agent's step watch) finds it
PREFIX_PATTERN = re.escape(PREFIX).replace(re.escape("{rank}"), r"(\d{1,7})")
DRAIN_S = 5.0  # a process a rank left may hold its pipe open: the agent ends it
_lock = threading.Lock()
_relays: list[threading.Thread] = []


def _write(data: bytes) -> None:
    with _lock:
        while data:
            try:
                data = data[os.write(1, data):]
            except OSError:
                return


def relay(fd: int, prefix: bytes) -> None:
    """Write the whole lines read from ``fd`` to stdout, each behind ``prefix``, until the pipe closes."""
    with open(fd, "rb", buffering=0) as pipe:
        for batch in bounded_lines(lambda: pipe.read(READ_CHUNK) or b"", LINE_LIMIT):
            _write(b"".join(prefix + line + b"\n" for line in batch))


class Popen(subprocess.Popen):
    """``subprocess.Popen`` as DeepSpeed's launcher calls it for a rank: its output on a pipe of its own, relayed."""

    def __init__(self, args, *rest, **kwargs) -> None:
        if rest or kwargs.get("stdout") is not None:
            super().__init__(args, *rest, **kwargs)
            return
        read, write_end = os.pipe()
        try:
            super().__init__(args, stdout=write_end, stderr=write_end, **kwargs)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write_end)
        rank = (kwargs.get("env") or os.environ).get("RANK", "?")
        thread = threading.Thread(target=relay, args=(read, PREFIX.format(rank=rank).encode()), daemon=True)
        thread.start()
        _relays.append(thread)


def main() -> None:
    """Run DeepSpeed's launcher (its arguments in ``sys.argv[1:]``) with ``Popen`` in its ``subprocess``."""
    from deepspeed.launcher import launch

    launch.subprocess = types.ModuleType("subprocess")
    launch.subprocess.__dict__.update(vars(subprocess), Popen=Popen)
    sys.argv[0] = launch.__file__
    try:
        launch.main()
    finally:
        deadline = time.monotonic() + DRAIN_S
        for thread in _relays:
            thread.join(max(0.0, deadline - time.monotonic()))
