"""Failure attribution from real-format torchrun, NCCL, CUDA and kernel lines."""

from __future__ import annotations

import pytest

from launcher.failures import describe, explain, parse_agent_failure, precedence, signal_name

TORCHRUN_REPORT = """\
[1] E1130 11:55:21.093000 14062 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 14341) of binary: /usr/bin/python
[1] Root Cause (first observed failure):
[1] [0]:
[1]   time      : 2026-11-30_11:55:20
[1]   host      : gpu-02
[1]   rank      : 11 (local_rank: 3)
[1]   exitcode  : -9 (pid: 14341)
[1]   error_file: <N/A>
""".splitlines()


def test_torchrun_root_cause_is_parsed():
    found = parse_agent_failure(TORCHRUN_REPORT)
    assert found["rank"] == 11 and found["local_rank"] == 3
    assert found["exit_code"] == -9 and found["signal"] == "SIGKILL" and found["pid"] == 14341
    assert found["failed_at"] == pytest.approx(11 * 3600 + 55 * 60 + 21.093)


def test_oom_killer_is_named_from_the_kernel_log():
    kernel = ["[Mon Nov 30 11:55:20 2026] Out of memory: Killed process 14341 (python) total-vm:9GB, anon-rss:8GB"]
    reason = explain({"exit_code": -9, "pid": 14341}, [], kernel)
    assert reason.startswith("killed by the kernel's OOM killer") and "14341" in reason
    other = ["[Mon Nov 30 11:55:20 2026] Out of memory: Killed process 999 (python)"]
    assert "no OOM line" in explain({"exit_code": -9, "pid": 14341}, [], other)


@pytest.mark.parametrize(
    "line,expected",
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB", "CUDA out of memory"),
        ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600012 milliseconds", "NCCL watchdog timeout"),
        ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5", "NCCL unhandled system error"),
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "GPU Xid error"),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "uncorrectable ECC error"),
        ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4321", "a peer rank went away"),
    ],
)
def test_known_error_lines_are_recognised(line, expected):
    assert explain({"exit_code": 1}, ["some output", line, "Traceback tail"]).startswith(expected)


def test_crash_signals_are_decoded():
    assert signal_name(-11) == "SIGSEGV" and signal_name(-6) == "SIGABRT" and signal_name(1) is None
    assert "crashed (SIGSEGV)" in explain({"exit_code": -11}, ["nothing known"])


def test_describe_names_node_rank_and_cause():
    text = describe({"node": 1, "host": "gpu-02", "rank": 11, "exit_code": -9, "signal": "SIGKILL",
                     "reason": "killed by the kernel's OOM killer"})
    assert text == "first failure: node 1 (gpu-02), rank 11, exit code -9 (SIGKILL): killed by the kernel's OOM killer"


OWN_FAILURE = {"node": 1, "rank": 3, "exit_code": 1, "failed_at": 50.0}
# A rank on another node that only saw rank 3 go away, though its agent noticed first.
ECHO = {"node": 0, "rank": 0, "exit_code": 1, "failed_at": 10.0, "reason": explain({"exit_code": 1}, [
    "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234"])}


def test_the_cause_precedes_its_echoes():
    lost_node = {"node": 1, "exit_code": 255}
    assert sorted([ECHO, OWN_FAILURE, lost_node], key=precedence) == [lost_node, OWN_FAILURE, ECHO]
    earlier = {**OWN_FAILURE, "node": 0, "failed_at": 40.0}
    assert min([OWN_FAILURE, earlier], key=precedence) is earlier
    killed_agent = {"node": 0, "exit_code": -9}
    assert min([OWN_FAILURE, killed_agent], key=precedence) is killed_agent


def test_a_node_whose_report_was_not_read_does_not_outrank_a_named_rank():
    unread = {"node": 0, "exit_code": 1}
    assert sorted([unread, ECHO, OWN_FAILURE], key=precedence) == [OWN_FAILURE, ECHO, unread]


def test_a_lost_node_is_explained_by_the_backend_note():
    assert explain({"exit_code": 255}, ["[1] [launch] connection to lt-h2 lost: keepalive timed out"]) == (
        "connection to lt-h2 lost: keepalive timed out")
