"""However a supervised job goes, it ends in a terminal state that says why: its own clean-up failing,
the store refusing records, the disk under LAUNCH_HOME full, the job cancelled before it launched; the terminal
of `launch submit` closed never ends it. A scripted in-memory backend (tests/unit/fakes.py)."""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.run import supervisor as supervisor_module
from launcher.run.orchestrate import stored_spec
from launcher.run.supervisor import Supervisor
from launcher.spec import JobSpec
from launcher.store.db import Store, StoreError
from launcher.store.states import JobState
from tests.unit.fakes import FakeBackend, NodeScript, output, record, sample

CLUSTER = cluster_spec(
    name="two", backend="ssh", python="/usr/bin/python3", workdir="/work",
    nodes=[{"host": f"h{i}", "address": f"10.0.0.{i}", "gpus": 0, "slots": 2} for i in (1, 2)],
)


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor_module, "SETTLE_S", 0.2)
    monkeypatch.setattr(supervisor_module, "REPORT_WAIT_S", 0.5)
    monkeypatch.setattr(supervisor_module, "POLL_S", 0.01)


@pytest.fixture(autouse=True)
def detached(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The jobs whose supervisor left its terminal; the test process's own descriptors are left alone (the real
    redirection is tested on a pseudo-terminal: tests/integration/test_attach.py)."""
    calls: list[str] = []
    monkeypatch.setattr(supervisor_module.hangup, "detach_from_terminal",
                        lambda job_id, run_dir, fds=(): calls.append(job_id))
    return calls


def _supervisor(tmp_path: Path, backend: FakeBackend) -> tuple[Supervisor, Store]:
    spec = JobSpec(name="unit", entrypoint=["python", "t.py"], resources={"nodes": 2, "nproc_per_node": 2}, max_steps=4)
    plan = plan_job(spec, CLUSTER, "unit-00000001", rdzv_port=29500)
    store = Store(tmp_path / "home")
    store.create_job(plan, stored_spec(spec, CLUSTER, run_check=True))
    return Supervisor(store, plan, backend, grace=0.1), store


class BrokenCleanup(FakeBackend):
    """A backend whose sweep and close raise (a node unreachable, a connection already broken)."""

    def sweep(self, plan, grace, end=True, generation=None):
        raise ConnectionError("sweep: connection reset")

    def close(self) -> None:
        self.closed = True
        raise ConnectionError("close: connection reset")


def test_a_sweep_and_a_close_that_raise_in_the_error_path_still_end_the_job_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug in launch")

    monkeypatch.setattr(Supervisor, "_first_failure", broken)
    backend = BrokenCleanup(CLUSTER, [[NodeScript(code=3), NodeScript(code=None)]])
    sup, store = _supervisor(tmp_path, backend)
    assert sup.run() == JobState.FAILED
    row = store.job("unit-00000001")
    assert row.state == "FAILED" and row.reason.startswith("launch internal error: ZeroDivisionError")
    assert backend.closed
    notes = (Path(row.run_dir) / "supervisor-errors.log").read_text()
    assert "sweep: connection reset" in notes and "close: connection reset" in notes
    kinds = [e["kind"] for e in store.events(row.id)]
    assert kinds.count("internal_error") == 2 and kinds[-2:] == ["failed", "internal_error"]  # the close's, after the end


def test_a_sweep_that_raises_after_a_clean_run_ends_the_job_failed_not_running(tmp_path: Path) -> None:
    backend = BrokenCleanup(CLUSTER, [[NodeScript(), NodeScript()]])
    sup, store = _supervisor(tmp_path, backend)
    assert sup.run() == JobState.FAILED
    row = store.job("unit-00000001")
    assert row.state == "FAILED" and "sweep: connection reset" in row.reason


def test_metric_records_the_store_refused_are_said_in_the_reason_and_an_event(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = FakeBackend(CLUSTER, [[NodeScript([record(0, 1), record(0, 2)]), NodeScript([record(2, 1)])]])
    sup, store = _supervisor(tmp_path, backend)

    def refuse(*args, **kwargs):
        raise StoreError("the store could not be written: database or disk is full")

    backend.capabilities = replace(backend.capabilities, fences=True)
    monkeypatch.setattr(store, "add_batch", refuse)  # the one write of records (and samples, marks) a round
    assert sup.run() == JobState.SUCCEEDED
    row = store.job("unit-00000001")
    assert row.reason == ("succeeded, but its record is incomplete: 3 metric record(s) could not be stored "
                             "(StoreError: the store could not be written: database or disk is full)")
    [lost] = [e for e in store.events(row.id) if e["kind"] == "records_lost"]
    assert lost["data"]["records"] == 3 and lost["data"]["attempt"] == 0
    assert backend.collected == [], "what the store did not take stays in the nodes' journals"


def test_a_job_filed_whole_has_its_hosts_asked_to_remove_its_run_directories_once_each(tmp_path: Path) -> None:
    """Issue 39, item 10: once the end is filed (its state written, nothing lost), each host is asked once, for
    this store (``filed_by``: its id); a host that keeps it says why in one event."""
    from launcher.run import identity

    backend = FakeBackend(CLUSTER, [[NodeScript([record(0, 1)]), NodeScript([record(2, 1)])]])
    backend.capabilities = replace(backend.capabilities, fences=True)  # as local and SSH clusters
    sup, store = _supervisor(tmp_path, backend)
    assert sup.run() == JobState.SUCCEEDED
    assert [(index, request.job_id, request.filed_by) for index, request in backend.collected] == [
        (0, "unit-00000001", identity.store_id(store.home)), (1, "unit-00000001", identity.store_id(store.home))]
    assert "run_dirs_kept" not in [e["kind"] for e in store.events("unit-00000001")]


def test_a_full_disk_under_launch_home_does_not_hang_the_job_and_its_reason_says_what_was_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [output(f"epoch {i}") for i in range(50)]
    samples = [sample(1.0, {"rank": 2, "pid": 42, "pids": [42], "cpu_s": 1.0, "rss_bytes": 1, "rss_peak_bytes": 1})]
    backend = FakeBackend(CLUSTER, [[NodeScript(lines), NodeScript(samples + lines)]])
    sup, store = _supervisor(tmp_path, backend)
    run_dir = store.run_dir("unit-00000001")
    for name in ("attempt0-node0.log", "attempt0-node1.log", "supervisor-errors.log"):
        (run_dir / name).symlink_to("/dev/full")  # every write: ENOSPC, as on a full disk

    def full(*args, **kwargs):
        raise StoreError("the store could not be written: database or disk is full")

    monkeypatch.setattr(store, "add_batch", full)  # the one write of records, samples and marks a round
    assert sup.run() == JobState.SUCCEEDED
    row = store.job("unit-00000001")
    assert row.state == "SUCCEEDED"
    assert row.reason.startswith("succeeded, but its record is incomplete: 1 sample(s), 100 log line(s) could not be stored")
    assert all(node.poll() == 0 for node in backend.started[0]), "every node's output was read to its end"


class HangUp(FakeBackend):
    """The terminal of `launch submit` closes once the nodes run."""

    def start(self, plan, context):
        started = super().start(plan, context)
        signal.raise_signal(signal.SIGHUP)
        return started


@pytest.fixture
def _signals():
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)}

    def unhandled(signum, frame):
        raise AssertionError("SIGHUP reached the supervisor unhandled: its default ends the process, orphaning the nodes")

    signal.signal(signal.SIGHUP, unhandled)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.usefixtures("_signals")
def test_a_closed_terminal_never_ends_a_foreground_job(tmp_path: Path, detached: list[str]) -> None:
    backend = HangUp(CLUSTER, [[NodeScript([output("epoch 1")]), NodeScript([output("epoch 1")])]])
    sup, store = _supervisor(tmp_path, backend)
    sup.install_signal_handlers(terminal=True)
    assert sup.run() == JobState.SUCCEEDED
    assert detached == ["unit-00000001"]
    [closed] = [e for e in store.events("unit-00000001") if e["kind"] == "terminal_closed"]
    assert "`launch attach unit-00000001` follows the job" in closed["message"]
    assert not any(node.terminated for node in backend.started[0])


@pytest.mark.usefixtures("_signals")
def test_ctrl_c_on_a_terminal_asks_and_a_no_goes_on(tmp_path: Path) -> None:
    asked = []

    class CtrlC(FakeBackend):
        def start(self, plan, context):
            started = super().start(plan, context)
            signal.raise_signal(signal.SIGINT)
            return started

    backend = CtrlC(CLUSTER, [[NodeScript([output("epoch 1")]), NodeScript([output("epoch 1")])]])
    sup, store = _supervisor(tmp_path, backend)
    sup.install_signal_handlers(terminal=True, ask=lambda: asked.append(1) or False)
    assert sup.run() == JobState.SUCCEEDED and asked == [1]


def test_a_job_cancelled_before_it_launched_still_has_its_backend_closed(tmp_path: Path) -> None:
    backend = FakeBackend(CLUSTER, [[NodeScript(), NodeScript()]])
    sup, store = _supervisor(tmp_path, backend)
    store.transition("unit-00000001", JobState.CANCELLED, reason="cancelled by user")
    assert sup.run() == JobState.CANCELLED
    assert backend.closed and backend.started == []


def test_a_console_that_went_away_loses_nothing(tmp_path: Path) -> None:
    backend = FakeBackend(CLUSTER, [[NodeScript([output("epoch 1")]), NodeScript([output("epoch 1")])]])
    sup, store = _supervisor(tmp_path, backend)

    def closed_terminal(line: str) -> None:
        raise OSError(5, "Input/output error")

    sup.echo = closed_terminal
    assert sup.run() == JobState.SUCCEEDED
    row = store.job("unit-00000001")
    assert row.reason is None and [e["kind"] for e in store.events(row.id)].count("terminal_closed") == 1
    assert (Path(row.run_dir) / "attempt0-node1.log").read_text().endswith("[1] epoch 1\n")


def test_only_the_loop_writes_the_store_and_it_files_many_lines_a_transaction(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The single writer: the watchers' threads only hand over; the loop files records, samples and marks in one
    transaction a round, so 400 records of two nodes take far fewer than 400 transactions."""
    import threading

    usage = sample(1.0, {"rank": 2, "pid": 42, "pids": [42], "cpu_s": 1.0, "rss_bytes": 1, "rss_peak_bytes": 1})
    node0 = [record(rank, step) for step in range(1, 101) for rank in (0, 1)]
    node1 = [usage] + [record(rank, step) for step in range(1, 101) for rank in (2, 3)]
    backend = FakeBackend(CLUSTER, [[NodeScript(node0), NodeScript(node1)]])
    sup, store = _supervisor(tmp_path, backend)
    writers: set[str] = set()
    batches = []

    def spied(name: str):
        real = getattr(store, name)

        def spy(*args, **kwargs):
            writers.add(threading.current_thread().name)
            if name == "add_batch":
                batches.append(args[2])
            return real(*args, **kwargs)
        return spy

    for name in ("add_batch", "set_node", "add_event", "update_job"):
        monkeypatch.setattr(store, name, spied(name))
    assert sup.run() == JobState.SUCCEEDED
    assert writers == {threading.current_thread().name}, "no watcher thread wrote the store"
    assert len(store.metrics("unit-00000001")) == 400
    assert sum(len(batch.records) for batch in batches) == 400 and len(batches) < 100
    assert [row.seen for row in store.nodes("unit-00000001", 0)] == [len(node0) + 1, len(node1) + 1], "and @exit"


@pytest.mark.usefixtures("_signals")
def test_a_second_ctrl_c_while_the_question_waits_cancels(tmp_path: Path) -> None:
    import threading

    answered = threading.Event()

    class CtrlCTwice(FakeBackend):
        def start(self, plan, context):
            started = super().start(plan, context)
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
            return started

    backend = CtrlCTwice(CLUSTER, [[NodeScript(code=None), NodeScript(code=None)]])
    sup, store = _supervisor(tmp_path, backend)
    sup.install_signal_handlers(terminal=True, ask=lambda: answered.wait(30))
    try:
        assert sup.run() == JobState.CANCELLED
    finally:
        answered.set()
    assert store.job("unit-00000001").reason == "cancelled (Ctrl-C)"
    assert all(node.terminated for node in backend.started[0])


def test_a_hangup_moves_only_what_was_on_the_terminal(tmp_path: Path) -> None:
    """`nohup launch submit > run.log` keeps writing its file after SIGHUP; descriptors that failed are all moved."""
    import subprocess
    import sys

    program = ("import sys; from pathlib import Path; from launcher.run import hangup; "
               "hangup.detach_from_terminal('j-1', Path(sys.argv[1]), hangup.on_terminal()); print('after', flush=True)")
    with open(tmp_path / "run.log", "w") as out:
        subprocess.run([sys.executable, "-c", program, str(tmp_path)], stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                       check=True)
    kept = (tmp_path / "run.log").read_text()
    assert "`launch attach j-1` follows it" in kept and kept.endswith("after\n")
    assert not (tmp_path / "supervisor.log").exists()
