"""Failure attribution from real-format torchrun, NCCL, CUDA and kernel lines."""

from __future__ import annotations

import pytest

from launcher.backends.failures import (
    Failure,
    FailureKind,
    classify,
    is_agent_failed_line,
    oom_kill,
    parse_agent_failure,
    precedence,
    signal_name,
)

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
    [found] = parse_agent_failure(TORCHRUN_REPORT)
    assert (found.rank, found.local_rank, found.exit_code, found.pid) == (11, 3, -9, 14341)


def test_torchruns_failed_line_is_recognised_with_or_without_the_display_prefix():
    assert is_agent_failed_line(TORCHRUN_REPORT[0]) and is_agent_failed_line(TORCHRUN_REPORT[0][4:])
    assert not any(is_agent_failed_line(line) for line in TORCHRUN_REPORT[1:])
    assert not is_agent_failed_line("[1] epoch 3 failed (exitcode: 1) as a rank printed it")


def test_every_rank_the_report_names_is_read_the_root_cause_first():
    report = [
        "Failures:", "[1]:", "  rank      : 1 (local_rank: 1)", "  exitcode  : 1 (pid: 201)",
        "Root Cause (first observed failure):", "[0]:", "  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 200)",
    ]
    assert [(r.rank, r.pid) for r in parse_agent_failure(report)] == [(0, 200), (1, 201)]


def test_a_rank_outside_the_world_size_is_not_believed():
    assert parse_agent_failure(TORCHRUN_REPORT, world_size=8) == []


KERNEL = ["2026-11-30T11:55:20,123456+00:00 Out of memory: Killed process 14341 (python) total-vm:9GB, anon-rss:8GB"]


def test_oom_killer_is_named_from_the_kernel_log_for_a_process_of_the_job():
    assert "14341" in oom_kill(KERNEL, [14341, 14342])
    assert oom_kill(KERNEL, [999]) is None, "another process's OOM kill is not this job's"
    late_start = 1e10
    assert oom_kill(KERNEL, [14341], since=late_start) is None, "an OOM line from before the attempt is ignored"


def test_an_oom_kill_is_named_whatever_code_the_launcher_turned_it_into():
    for code in (-9, 137, 247):
        failure = classify(Failure(exit_code=code), [], oom_kill(KERNEL, [14341]), progressed=True)
        assert failure.kind == FailureKind.OOM and failure.reason.startswith("killed by the kernel's OOM killer")
        assert failure.transient is False


@pytest.mark.parametrize(
    "line,expected,transient",
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 79.15 GiB", "CUDA out of memory", False),
        ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600012 milliseconds", "NCCL watchdog timeout", True),
        ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5", "NCCL unhandled system error", True),
        ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", "GPU Xid error", True),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "uncorrectable ECC error", True),
        ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4321", "a peer rank went away", True),
        ("ModuleNotFoundError: No module named 'flash_attn'", "the program could not be imported", False),
        ("terminate called without an active exception", "a C++ thread was still running when the process ended", False),
    ],
)
def test_known_error_lines_are_recognised(line, expected, transient):
    failure = classify(Failure(exit_code=1), ["some output", line, "Traceback tail"], None, progressed=True)
    assert failure.reason.startswith(expected) and failure.transient is transient


def test_a_rank_cannot_write_its_own_failure_reason():
    lines = ["[launch] node 3 lost: I say so", "[launch] connection to gpu-01 lost: forged"]
    failure = classify(Failure(exit_code=1), lines, None, progressed=True)
    assert failure.reason is None or "forged" not in failure.reason and "I say so" not in failure.reason


def test_crash_signals_are_decoded():
    assert signal_name(-11) == "SIGSEGV" and signal_name(-6) == "SIGABRT" and signal_name(1) is None
    assert "crashed (SIGSEGV)" in classify(Failure(exit_code=-11), ["nothing known"], None, True).reason


def test_an_error_before_the_first_step_is_not_transient_and_after_it_is():
    assert classify(Failure(exit_code=1), ["ValueError: bad"], None, progressed=False).transient is False
    assert classify(Failure(exit_code=1), ["ValueError: bad"], None, progressed=True).transient is True


def test_describe_names_node_rank_and_cause():
    failure = Failure(node=1, host="gpu-02", rank=11, exit_code=-9, signal="SIGKILL",
                      reason="killed by the kernel's OOM killer")
    assert failure.describe() == (
        "first failure: node 1 (gpu-02), rank 11, exit code -9 (SIGKILL): killed by the kernel's OOM killer")


OWN_FAILURE = Failure(node=1, rank=3, exit_code=1, observed=50)
# A rank on another node that only saw rank 3 go away, though the supervisor saw its report first.
ECHO = classify(Failure(node=0, rank=0, exit_code=1, observed=10), [
    "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234"], None, True)


def test_the_cause_precedes_its_echoes():
    lost_node = Failure(kind=FailureKind.LOST, node=1, exit_code=255)
    assert sorted([ECHO, OWN_FAILURE, lost_node], key=precedence) == [lost_node, OWN_FAILURE, ECHO]
    earlier = OWN_FAILURE.model_copy(update={"node": 2, "observed": 40})
    assert min([OWN_FAILURE, earlier], key=precedence) is earlier
    killed_agent = Failure(node=0, exit_code=-9)
    assert min([OWN_FAILURE, killed_agent], key=precedence) is killed_agent


def test_a_node_whose_report_was_not_read_does_not_outrank_a_named_rank():
    unread = Failure(node=0, exit_code=1)
    assert sorted([unread, ECHO, OWN_FAILURE], key=precedence) == [OWN_FAILURE, ECHO, unread]
