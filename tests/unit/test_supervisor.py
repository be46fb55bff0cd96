"""The supervisor's decisions on a scripted in-memory backend: success, first failure, restarts,
hang verdicts with stacks, untrusted records, its own errors. Real processes: tests/integration."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.backends.leasing import TAKEN_FIRST
from launcher.cli import submit as submit_cli
from launcher.run import supervisor as supervisor_module
from launcher.run.liveness import Liveness
from launcher.run.orchestrate import stored_spec
from launcher.run.supervisor import Supervisor
from launcher.spec import JobSpec
from launcher.store.db import Store
from launcher.store.states import FailureKind, JobState
from tests.unit.fakes import FakeBackend, NodeScript, output, record, sample

CLUSTER = cluster_spec(
    name="two", backend="ssh", python="/usr/bin/python3", workdir="/work",
    nodes=[{"host": f"h{i}", "address": f"10.0.0.{i}", "gpus": 0, "slots": 2} for i in (1, 2)],
)


def kernel_oom() -> list[str]:
    """A kernel log whose OOM-killer line (for PID 4242) the fake backend stamps with the time it is read,
    as dmesg --time-format iso prints it."""
    return ["{now},1+00:00 Out of memory: Killed process 4242 (python) total-vm:9GB, anon-rss:8GB"]


TORCHRUN_FAILED = [
    output("E1130 11:55:21.093000 14062 api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 4243) of binary: python"),
    output("Root Cause (first observed failure):"),
    output("  rank      : 3 (local_rank: 1)"),
    output("  exitcode  : 1 (pid: 4243)"),
]


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor_module, "SETTLE_S", 0.2)
    monkeypatch.setattr(supervisor_module, "REPORT_WAIT_S", 0.5)
    monkeypatch.setattr(supervisor_module, "POLL_S", 0.01)


def _run(tmp_path: Path, attempts: list[list[NodeScript]], job: dict | None = None, **backend_options):
    spec = JobSpec(name="unit", entrypoint=["python", "t.py"], resources={"nodes": 2, "nproc_per_node": 2},
                   max_steps=4, **(job or {}))
    plan = plan_job(spec, CLUSTER, "unit-00000001", rdzv_port=29500)
    store = Store(tmp_path / "home")
    store.create_job(plan, stored_spec(spec, CLUSTER, run_check=True))
    backend = FakeBackend(CLUSTER, attempts, **backend_options)
    warnings: list[str] = []
    sup = Supervisor(store, plan, backend, grace=0.1, restarts=spec.restarts, restart_on=spec.restart_on,
                     stall_timeout=spec.watch.stall_timeout, warn=warnings.append)
    state = sup.run()
    return state, store.job(plan.job_id), store, backend, warnings


def test_a_job_whose_nodes_exit_zero_succeeds_and_is_swept(tmp_path: Path) -> None:
    state, row, store, backend, _ = _run(tmp_path, [[NodeScript([record(0, 4)]), NodeScript([record(2, 4)])]])
    assert state == JobState.SUCCEEDED and row.state == "SUCCEEDED"
    assert backend.swept_nodes == 2 and backend.closed, "each node swept once"
    assert {(m.rank, m.node, m.host) for m in store.metrics(row.id)} == {(0, 0, "h1"), (2, 1, "h2")}


def test_the_rank_that_failed_is_named_not_the_peer_that_saw_it_go(tmp_path: Path) -> None:
    echo = NodeScript([output("[0]: RuntimeError: [pair.cc:534] Connection closed by peer [10.0.0.2]:4321"),
                       output("Root Cause (first observed failure):"), output("  rank      : 0 (local_rank: 0)"),
                       output("  exitcode  : 1 (pid: 99)")], code=1)
    state, row, *_ = _run(tmp_path, [[echo, NodeScript(TORCHRUN_FAILED, code=1)]])
    failure = row.first_failure
    assert state == JobState.FAILED and (failure["node"], failure["rank"], failure["host"]) == (1, 3, "h2")


def test_a_lost_node_is_restarted_and_the_job_succeeds(tmp_path: Path) -> None:
    attempts = [[NodeScript(code=None), NodeScript(lost="connection to h2 lost: keepalive timed out")],
                [NodeScript(), NodeScript()]]
    state, row, store, backend, _ = _run(tmp_path, attempts, {"restarts": 1})
    assert state == JobState.SUCCEEDED and row.attempt == 1 and len(backend.started) == 2
    [restart] = [e for e in store.events(row.id) if e["kind"] == "restarting"]
    assert restart["data"]["kind"] == "lost" and restart["data"]["transient"] is True
    assert "connection to h2 lost" in restart["message"]


def test_an_oom_kill_is_named_and_not_restarted_blindly(tmp_path: Path) -> None:
    killed = NodeScript([sample(1.0, {"rank": 2, "pid": 4242, "pids": [4242], "cpu_s": 1.0})], code=-9)
    state, row, store, backend, _ = _run(tmp_path, [[NodeScript(code=None), killed]], {"restarts": 2},
                                         kernel_log=kernel_oom())
    assert state == JobState.FAILED and len(backend.started) == 1, "the OOM killer would strike again"
    assert row.first_failure["kind"] == "oom" and "OOM killer" in row.reason and "4242" in row.reason
    assert "not restarted: this failure would repeat" in row.reason
    assert [e["kind"] for e in store.events(row.id)].count("no_restart") == 1


def test_the_oom_killed_rank_is_named_even_when_torchrun_blames_or_names_only_its_peer(tmp_path: Path) -> None:
    report = [output("[1/2]:RuntimeError: [pair.cc:534] Connection closed by peer [127.0.0.1]:4321"),
              output("E1130 11:55:21.093000 14062 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 4241)"),
              output("Failures:"), output("  rank      : 3 (local_rank: 1)"),
              output("  exitcode  : -9 (pid: 4242)"),
              output("Root Cause (first observed failure):"), output("  rank      : 2 (local_rank: 0)"),
              output("  exitcode  : 1 (pid: 4241)")]
    samples = [sample(time.time(), *({"rank": rank, "pid": pid, "pids": [pid], "cpu_s": 1.0, "rss_bytes": 1,
                                      "rss_peak_bytes": 1} for rank, pid in ((2, 4241), (3, 4242))))]
    only_the_peer = report[:2] + report[5:]
    for lines in (report, only_the_peer):
        state, row, *_ = _run(tmp_path / str(len(lines)), [[NodeScript(code=None), NodeScript(samples + lines, code=1)]],
                              kernel_log=kernel_oom())
        failure = row.first_failure
        assert state == JobState.FAILED and failure["kind"] == "oom"
        assert (failure["rank"], failure["pid"], failure["signal"]) == (3, 4242, "SIGKILL")


def test_restart_on_any_restarts_what_would_repeat(tmp_path: Path) -> None:
    killed = NodeScript([sample(1.0, {"rank": 2, "pid": 4242, "pids": [4242], "cpu_s": 1.0})], code=-9)
    state, row, *_ = _run(tmp_path, [[NodeScript(code=None), killed], [NodeScript(), NodeScript()]],
                          {"restarts": 1, "restart_on": "any"}, kernel_log=kernel_oom())
    assert state == JobState.SUCCEEDED and row.attempt == 1


def test_a_silent_idle_job_is_hung_with_every_ranks_stack_and_the_odd_one_named(tmp_path: Path) -> None:
    stacks = {0: {"ranks": [{"rank": r, "pid": 10 + r, "stack": "Thread 0x1 (idle)\n    barrier (t.py:9)"} for r in (0, 1)]},
              1: {"ranks": [{"rank": 2, "pid": 12, "stack": "Thread 0x2 (idle)\n    barrier (t.py:9)"},
                            {"rank": 3, "pid": 13, "stack": "Thread 0x3 (idle)\n    sleep (t.py:4)"}]}}
    def ranks(*numbers: int) -> str:  # every rank process exists on its node, alive and idle (no CPU time)
        return sample(time.time(), *({"rank": r, "pid": 10 + r, "pids": [10 + r], "cpu_s": 1.0, "rss_bytes": 1,
                                      "rss_peak_bytes": 1} for r in numbers))

    state, row, store, backend, _ = _run(tmp_path, [[NodeScript([ranks(0, 1)], code=None), NodeScript([ranks(2, 3)], code=None)]],
                                         {"watch": {"stall_timeout": 0.5}}, stacks=stacks)
    assert state == JobState.FAILED
    assert row.first_failure["kind"] == "hang" and "hung before the first step" in row.reason
    assert "rank 3 on node 1 (h2) stands apart" in row.reason
    kept = json.loads((Path(row.run_dir) / "stacks-attempt0.json").read_text())
    assert [r["rank"] for r in kept["ranks"]] == [0, 1, 2, 3]
    assert all(node.terminated for node in backend.started[0])


# py-spy's dump of a DeepSpeed rank stuck on a build lock a killed build left (as in deepspeedai/DeepSpeedExamples#302)
ON_BUILD_LOCK = """Thread 46930 (idle): "MainThread"
    wait (torch/utils/file_baton.py:42)
    _jit_compile (torch/utils/cpp_extension.py:1522)
    load (torch/utils/cpp_extension.py:1284)
    jit_load (deepspeed/ops/op_builder/builder.py:480)
    load (deepspeed/ops/op_builder/builder.py:449)
    __init__ (deepspeed/runtime/engine.py:377)
    initialize (deepspeed/__init__.py:156)
    main (main.py:273)
    <module> (main.py:328)
Thread 47073 (idle): "Thread-1"
    wait (threading.py:324)
"""


def test_ranks_waiting_on_a_stale_build_lock_are_called_so_in_the_hang_verdict(tmp_path: Path) -> None:
    stacks = {0: {"ranks": [{"rank": r, "pid": 10 + r, "stack": ON_BUILD_LOCK} for r in (0, 1)]},
              1: {"ranks": [{"rank": 2, "pid": 12, "stack": ON_BUILD_LOCK},
                            {"rank": 3, "pid": 13, "stack": 'Thread 3 (idle): "MainThread"\n    barrier (main.py:9)'}]}}

    def ranks(*numbers: int) -> str:
        return sample(time.time(), *({"rank": r, "pid": 10 + r, "pids": [10 + r], "cpu_s": 1.0, "rss_bytes": 1,
                                      "rss_peak_bytes": 1} for r in numbers))

    state, row, *_ = _run(tmp_path, [[NodeScript([ranks(0, 1)], code=None), NodeScript([ranks(2, 3)], code=None)]],
                          {"watch": {"stall_timeout": 0.5}}, stacks=stacks)
    assert state == JobState.FAILED and row.first_failure["kind"] == "hang"
    assert "rank(s) 0-2 wait on torch's build lock of a JIT-built op (torch's FileBaton.wait)" in row.reason
    assert "TORCH_EXTENSIONS_DIR/<op>/lock" in row.reason


def test_a_hang_elsewhere_says_nothing_of_build_locks(tmp_path: Path) -> None:
    from launcher.views.stacks import RankStack, StackReport

    report = StackReport(taken_at=0.0, attempt=0, ranks=[
        RankStack(0, 0, "h1", 10, 'Thread 1 (idle): "MainThread"\n    wait (threading.py:324)\n    main (main.py:3)')])
    assert report.on_build_lock is None


def test_a_job_that_keeps_printing_is_alive(tmp_path: Path) -> None:
    chatty = NodeScript([output(f"epoch {i}") for i in range(3)], code=0)
    state, *_ = _run(tmp_path, [[chatty, NodeScript()]], {"watch": {"stall_timeout": 0.5}})
    assert state == JobState.SUCCEEDED


def test_untrusted_records_are_dropped_and_counted_and_node_comes_from_the_channel(tmp_path: Path) -> None:
    hostile = [output('[0]: @@launch {"v":1,"rank":0,"step":1,"samples":"x","interval_s":1}'),
               output('[0]: @@launch {"v":1,"rank":"x","step":1}'),
               output('[0]: @@launch {"v":1,"rank":0,"step":99999999999999999999999}'),
               output('[0]: @@launch {"v":1,"rank":0,"step":2,"loss":NaN}'),
               output('[0]: @@launch {"v":1,"rank":0,"step":3,"node":7,"host":"evil"}')]
    state, row, store, _, warnings = _run(tmp_path, [[NodeScript(hostile), NodeScript()]])
    assert state == JobState.SUCCEEDED
    [accepted] = store.metrics(row.id)
    assert (accepted.step, accepted.node, accepted.host) == (3, 0, "h1")
    assert len(warnings) == 1 and "metric record dropped" in warnings[0]


def test_a_node_that_cannot_start_fails_the_job_naming_it(tmp_path: Path) -> None:
    state, row, *_ = _run(tmp_path, [[NodeScript(), NodeScript(fail_start="h2: setup command `make` exited 2")]])
    assert state == JobState.FAILED and row.first_failure["kind"] == "start" and row.failure_kind == FailureKind.START
    assert row.first_failure["node"] == 1 and "setup command" in row.reason


def test_leases_taken_by_another_job_are_the_jobs_stored_failure_kind(tmp_path: Path) -> None:
    """`launch submit` exits 3 for a job whose leases another job took first: it reads the stored kind, whatever the
    reason's words."""
    busy = NodeScript(fail_start="h2 GPU 0: job quicker holds it", busy=True)
    state, row, store, *_ = _run(tmp_path, [[NodeScript(), busy]])
    assert state == JobState.FAILED and row.failure_kind == FailureKind.LEASES == row.first_failure["kind"]
    assert submit_cli._lost_the_leases(row)
    store.update_job(row.id, failure_kind=FailureKind.START, reason=f"{TAKEN_FIRST}: quoted by a rank")
    assert not submit_cli._lost_the_leases(store.job(row.id))


def test_a_supervisor_error_ends_the_job_failed_not_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug in launch")

    monkeypatch.setattr(Supervisor, "_first_failure", broken)
    state, row, store, backend, _ = _run(tmp_path, [[NodeScript(code=3), NodeScript(code=None)]])
    assert state == JobState.FAILED and row.reason.startswith("launch internal error: ZeroDivisionError")
    assert (Path(row.run_dir) / "supervisor-errors.log").read_text().count("ZeroDivisionError") >= 1
    assert backend.swept_nodes >= 2


def _torchrun_failed(clock: str, rank: int, pid: int) -> list[str]:
    return [output(f"E1130 {clock} 14062 api.py:1002] failed (exitcode: 1) local_rank: {rank % 2} (pid: {pid})"),
            output("Root Cause (first observed failure):"), output(f"  rank      : {rank} (local_rank: {rank % 2})"),
            output(f"  exitcode  : 1 (pid: {pid})")]


def test_the_first_failure_is_the_one_the_supervisor_saw_first_whatever_the_nodes_clocks_say(tmp_path: Path) -> None:
    # node 0 fails just before midnight by its clock; node 1 fails later, its clock already past midnight
    # (or simply behind): the time of day on torchrun's lines would put node 1 first
    node0_read = threading.Event()
    first = NodeScript(_torchrun_failed("23:59:59.900000", 1, 501), code=1, then=node0_read)
    later = NodeScript(_torchrun_failed("00:00:00.100000", 3, 502), code=1, wait_for=node0_read)
    state, row, *_ = _run(tmp_path, [[first, later]])
    failure = row.first_failure
    assert state == JobState.FAILED and (failure["node"], failure["rank"]) == (0, 1)


def test_only_the_supervisors_loop_writes_what_it_knows_of_the_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # node threads that write the liveness state while the loop reads it made a healthy job FAILED
    # ("dictionary changed size during iteration"); they only describe what they saw now
    writers: set[str] = set()
    for name in ("sample", "progress", "output"):
        original = getattr(Liveness, name)
        monkeypatch.setattr(Liveness, name, lambda self, *args, _f=original: (
            writers.add(threading.current_thread().name), _f(self, *args))[1])
    seen = threading.Event()
    busy = [sample(float(t), {"rank": r, "pid": 40 + r, "pids": [40 + r], "cpu_s": float(t)}) for t in range(3) for r in (0, 1)]
    node0 = NodeScript(busy + [record(0, 1), output("epoch 1")], code=None, then=seen)
    node1 = NodeScript([output("failing")], code=1, wait_for=seen)
    state, row, *_ = _run(tmp_path, [[node0, node1]])
    assert state == JobState.FAILED and row.first_failure["node"] == 1
    assert writers == {threading.current_thread().name}
