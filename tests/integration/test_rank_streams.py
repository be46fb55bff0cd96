"""Every rank's line reaches the supervisor whole and behind its ``[rank]: `` prefix under DeepSpeed's launcher
(real ``deepspeed.launcher.launch`` on CPU, through the node agent), and a record is filed as the rank whose
stream it came on: two ranks print at once, one of them hostile."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from launcher.metrics.record import MetricRecord, Rejected, parse_line
from launcher.node import rankstreams
from launcher.node.ship import node_argv
from launcher.plan.commands import deepspeed_argv
from tests.helpers import output_texts

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).resolve().parents[1] / "programs" / "rank_streams.py"
LINES = 400


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_deepspeed_ranks_printing_at_once_arrive_as_whole_lines_each_behind_its_rank(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    job_id = f"streams-{os.getpid()}"
    argv = deepspeed_argv(sys.executable, [2], 0, "127.0.0.1", _free_port(), (True, [str(PROGRAM)]))
    env = {"LAUNCH_JOB_ID": job_id, "LAUNCH_NODE": "0", "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1",
           "RANK_STREAMS_READY": str(ready), "RANK_STREAMS_LINES": str(LINES)}
    request = {"job_id": job_id, "node": 0, "argv": argv, "env": env, "cwd": str(tmp_path), "grace": 1.0}
    (tmp_path / "runtime").mkdir(mode=0o700)  # the node's run root: $XDG_RUNTIME_DIR/launch
    done = subprocess.run(node_argv(sys.executable, "agent", request), capture_output=True, text=True, timeout=300,
                          env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "runtime")})
    shutil.rmtree(tmp_path / "runtime", ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    output = output_texts(done.stdout.splitlines())

    for rank in (0, 1):
        printed = [line for line in output if re.search(r"rank \d (line|err) ", line)]
        mine = [line for line in printed if line.startswith(f"[{rank}]: ")]
        assert [line for line in mine if " line " in line] == [f"[{rank}]: rank {rank} line {i} {'x' * 40}" for i in range(LINES)]
        assert [line for line in mine if " err " in line] == [f"[{rank}]: rank {rank} err {i}" for i in range(0, LINES, 50)]
    assert all(re.fullmatch(r"\[(\d)\]: rank \1 (line \d+ x{40}|err \d+)", line)
               for line in output if re.search(r"rank \d (line|err) ", line)), "a line merged with another, or lost its rank"

    parsed = [parse_line(line, world_size=2, node=0, host="h") for line in output]
    records = [result for result in parsed if isinstance(result, MetricRecord)]
    assert [(record.rank, record.step) for record in records] == [(0, 1)]
    assert [result.reason for result in parsed if isinstance(result, Rejected)] == [
        "a record claiming rank 0 on the stream of rank 1"]
    assert output.count("[1]: ") == 1, "rank 1's empty line, behind its prefix like any other"
    assert "[1]: debug: sending @@launch " in "\n".join(output), "a print that contains the marker is output, not a record"
    assert rankstreams.DEEPSPEED_LAUNCH == ("-m", argv[argv.index("-m") + 1]), "the agent knows the plan's spelling"


def test_the_relay_is_the_shipped_module_and_cuts_a_ranks_lines_with_linecut(capfd: pytest.CaptureFixture[str]) -> None:
    from launcher.node import linecut, rankrelay

    carried = json.loads(ast.literal_eval(rankstreams.program().split("json.loads(", 1)[1].split(")\n", 1)[0]))
    assert carried == {name: Path(module.__file__).read_text(encoding="utf-8")
                       for name, module in (("linecut", linecut), ("rankrelay", rankrelay))}
    read, write = os.pipe()
    with open(write, "wb") as rank:  # more than a pipe holds: the relay reads while the rank writes
        writer = threading.Thread(target=rank.write, args=(b"first\n" + b"x" * (linecut.LINE_LIMIT + 10) + b"\nlast",))
        writer.start()
        relaying = threading.Thread(target=rankrelay.relay, args=(read, rankrelay.PREFIX.format(rank=3).encode()))
        relaying.start()
        writer.join()
    relaying.join(30)
    assert capfd.readouterr().out.splitlines() == [
        "[3]: first", "[3]: " + "x" * linecut.LINE_LIMIT + f" [launch: line cut at {linecut.LINE_LIMIT} bytes; 10 more dropped]",
        "[3]: last"]
