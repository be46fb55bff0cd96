"""DeepSpeed's per-node launcher with each rank's output on a pipe of its own.

Unchanged, DeepSpeed's launcher lets every rank inherit its stdout: one pipe, no rank on a line, and
two ranks' lines merged where print() wrote a text and its newline apart. ``with_rank_streams`` runs
the launcher as ``RANK_STREAMS`` instead: a thread a rank writes the rank's whole lines, each behind
``[RANK]:`` (as torchrun's tee does), in one write under a lock, cut at LIMIT bytes; the rest of the
launcher is DeepSpeed's own. Standard library only: it runs on nodes.
"""

from __future__ import annotations

import base64
import json

from .safepath import SAFE_PATH

DEEPSPEED_LAUNCH = ("-m", "deepspeed.launcher.launch")  # launcher.plan.commands.DEEPSPEED_MODULE, as the plan writes it

# ``--enable_each_rank_log`` (files a rank) is left as DeepSpeed does it. Runs in the launcher's interpreter:
# ``python -u -c RANK_STREAMS ...``.
RANK_STREAMS = SAFE_PATH + r"""
import os, subprocess, threading, time, types
from deepspeed.launcher import launch

LIMIT, DRAIN_S = 64 * 1024, 5.0
lock, relays = threading.Lock(), []


def write(data):
    with lock:
        while data:
            try:
                data = data[os.write(1, data):]
            except OSError:
                return


def relay(fd, prefix):
    pending, dropped = bytearray(), 0

    def add(piece):
        nonlocal dropped
        room = max(0, LIMIT - len(pending))
        pending.extend(piece[:room])
        dropped += len(piece) - min(room, len(piece))

    def emit():
        nonlocal dropped
        note = f" [launch: line cut at {LIMIT} bytes; {dropped} more dropped]".encode() if dropped else b""
        write(prefix + bytes(pending) + note + b"\n")
        pending.clear()
        dropped = 0

    with open(fd, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                add(chunk[start:end])
                emit()
                start = end + 1
            add(chunk[start:])
    if pending or dropped:
        emit()


class Popen(subprocess.Popen):
    def __init__(self, args, *rest, **kwargs):
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
        thread = threading.Thread(target=relay, args=(read, f"[{rank}]:".encode()), daemon=True)
        thread.start()
        relays.append(thread)


launch.subprocess = types.ModuleType("subprocess")
launch.subprocess.__dict__.update(vars(subprocess), Popen=Popen)
sys.argv[0] = launch.__file__
try:
    launch.main()
finally:
    deadline = time.monotonic() + DRAIN_S  # a process a rank left may hold its pipe open: the agent ends it
    for thread in relays:
        thread.join(max(0.0, deadline - time.monotonic()))
"""


def with_rank_streams(argv: list[str]) -> list[str]:
    """``argv`` with DeepSpeed's launcher run as ``RANK_STREAMS`` (each rank's lines whole and prefixed); else as is."""
    for at in range(len(argv) - 1):
        if (argv[at], argv[at + 1]) == DEEPSPEED_LAUNCH:
            return [*argv[:at], "-c", RANK_STREAMS, *argv[at + 2:]]
    return list(argv)


def on_devices(argv: list[str], devices: list[int]) -> list[str]:
    """``argv`` with DeepSpeed's launcher given this node's leased GPUs: it sets CUDA_VISIBLE_DEVICES itself, from
    its ``--world_info`` entry for ``--node_rank`` (the plan's 0..n-1), over the agent's. Other commands as they are."""
    if not any((argv[at], argv[at + 1]) == DEEPSPEED_LAUNCH for at in range(len(argv) - 1)):
        return list(argv)
    rank = next((arg.partition("=")[2] for arg in argv if arg.startswith("--node_rank=")), "")
    shown = []
    for arg in argv:
        if arg.startswith("--world_info=") and rank.isdigit():
            world = json.loads(base64.urlsafe_b64decode(arg.partition("=")[2]))
            node = list(world)[int(rank)]
            if len(world[node]) == len(devices):
                world[node] = list(devices)
            arg = "--world_info=" + base64.urlsafe_b64encode(json.dumps(world).encode()).decode()
        shown.append(arg)
    return shown
