"""Supervisor generations and a job read back from its nodes (`launch attach --takeover`, `--cluster`): the node
side's ``fence``, ``record`` and fenced ``follow`` on a real run directory, and the pure parts of the takeover."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.backends.base import NodeHandle
from launcher.backends.follow import Followed
from launcher.errors import FENCED_EXIT, LaunchError, SupervisorFenced
from launcher.node import follow, journal, rundir
from launcher.node.protocol import CleanRequest, FenceRequest, FollowRequest, FrameKind, RecordRequest, encode_frame, encode_output
from launcher.run import takeover
from launcher.run.recorded import stored_spec
from launcher.spec import JobSpec
from launcher.store.db import Store
from launcher.store.rows import JobRow
from launcher.store.states import JobState
from tests.helpers import frames, kind_of_line

JOB = JobSpec(name="taken", entrypoint=["python", "t.py"], resources={"nodes": 2, "nproc_per_node": 1},
              secrets=["HF_TOKEN"])
SSH = cluster_spec({"name": "lab", "backend": "ssh", "python": sys.executable,
                                  "nodes": [{"host": "gpu1"}, {"host": "gpu2"}, {"host": "gpu3"}]})
JOB_ID = "taken-0000cccc"


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private run root (``$XDG_RUNTIME_DIR/launch``, as on a node) holding the job's run directory with node 0's
    journal."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    root = runtime / "launch"
    root.mkdir(mode=0o700)
    assert rundir.run_root() == str(root)
    (root / JOB_ID).mkdir(mode=0o700)
    (root / JOB_ID / "node0.journal").write_bytes(encode_output("hello") + b"\n")
    return root


def _command(command, req) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert command(req) == 0
    return json.loads(out.getvalue())


def test_a_generation_fences_only_the_older_ones(tmp_path: Path) -> None:
    assert journal.read_generation(str(tmp_path), 0) == {"generation": 0}  # none written: the submitting supervisor's
    assert not journal.is_fenced(0, 0) and journal.is_fenced(1, 0) and not journal.is_fenced(1, 2)
    # issue 39, item 8: what a rank might write there is not a record fence wrote (no since, no pid and host)
    for junk in ("", "[1]", '{"generation": "2"}', '{"generation": true}', "not json", '{"generation": 9}',
                 '{"generation": 9, "pid": "x", "host": "h", "since": 1}'):
        Path(journal.generation_path(str(tmp_path), 0)).write_text(junk)
        assert journal.fenced_by(str(tmp_path), 0, 0) is None, junk
    record = {"generation": 2, "pid": 7, "host": "laptop", "since": 1.5}
    (tmp_path / "elsewhere").write_text(json.dumps(record))
    Path(journal.generation_path(str(tmp_path), 0)).unlink()
    Path(journal.generation_path(str(tmp_path), 0)).symlink_to(tmp_path / "elsewhere")
    assert journal.fenced_by(str(tmp_path), 0, 0) is None, "a symlink is not a record"
    Path(journal.generation_path(str(tmp_path), 0)).unlink()
    Path(journal.generation_path(str(tmp_path), 0)).write_text(json.dumps(record))
    assert journal.fenced_by(str(tmp_path), 0, 1) == record
    assert journal.fenced_by(str(tmp_path), 0, 2) is None


def test_fence_records_only_a_newer_generation_and_says_who_holds_it(root: Path) -> None:
    req = FenceRequest(JOB_ID, 0)
    assert _command(follow.fence, req) | {"contact_s": None} == {
        "generation": 0, "taken": False, "contact_s": None, "agent_gone": "its pid file is unreadable "
        f"([Errno 2] No such file or directory: '{root / JOB_ID / 'node0.pid'}')"}
    took = _command(follow.fence, FenceRequest(JOB_ID, 0, 1, 42, "login-2"))
    assert took["taken"] and (took["generation"], took["pid"], took["host"]) == (1, 42, "login-2")
    again = _command(follow.fence, FenceRequest(JOB_ID, 0, 1, 43, "login-3"))
    assert not again["taken"] and (again["generation"], again["pid"]) == (1, 42)  # a racing taker loses
    assert _command(follow.fence, FenceRequest(JOB_ID, 1))["error"].startswith(f"no journal of node 1 of job {JOB_ID}")
    assert "no journal" in _command(follow.fence, FenceRequest("other-00000000", 0))["error"]
    assert not (root / "other-00000000").exists()  # asking never makes a run directory


def test_a_follow_of_an_older_generation_gets_fenced_and_no_line(root: Path) -> None:
    journal.write_atomically(journal.generation_path(str(root / JOB_ID), 0),
                             json.dumps({"generation": 1, "pid": 42, "host": "login-2", "since": 1.0}))
    read, write = os.pipe()
    try:
        assert follow.follow(FollowRequest(JOB_ID, 0, 0), out=write) == 0
        os.close(write)
        said = os.read(read, 65536).decode()
    finally:
        os.close(read)
    assert kind_of_line(said.strip()) == "fenced" and "hello" not in said
    assert not (root / JOB_ID / "node0.contact").exists()  # a fenced reader is no contact
    seen = Followed("gpu1")
    assert list(seen.through(iter([said.strip(), encode_output("never passed on").decode()]))) == []
    assert seen.fenced == {"generation": 1, "pid": 42, "host": "login-2"} and seen.code() is None


def test_an_agent_fenced_tells_its_old_reader_once_and_journals_on(tmp_path: Path) -> None:
    read, write = os.pipe()
    out = journal.Output(write)
    out.attach(journal.Journal(str(tmp_path), 0))
    before, after = encode_output("before"), encode_output("after")
    out.write_lines([before])
    out.farewell(FrameKind.FENCED, {"generation": 1}, "a newer supervisor took the job")
    out.write_lines([after])
    out.close()
    os.close(write)
    with os.fdopen(read, "rb") as stream:
        sent = stream.read().split(b"\n")
    assert sent[0] == before and frames(sent[1:2], "fenced") == [{"generation": 1}] and sent[2:] == [b""]
    assert Path(journal.journal_path(str(tmp_path), 0)).read_bytes() == before + b"\n" + after + b"\n"
    assert out.broken.is_set() and out.why_broken == "a newer supervisor took the job"
    assert out.contact_age() == float("inf")  # stdout no longer counts as contact: the new reader's follow does


def test_the_job_record_round_trips_through_a_node_and_keeps_no_secret_value(root: Path, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf-very-secret-value")
    plan = plan_job(JOB, SSH, JOB_ID, rdzv_port=29533)
    row = JobRow(JOB_ID, "j", JobState.RUNNING, created_at=1700000000.0, spec=stored_spec(JOB, SSH, run_check=True))
    journal.write_atomically(str(root / JOB_ID / journal.RECORD_FILE), json.dumps(takeover.node_record(row, plan, 2)))
    answer = _command(follow.record, RecordRequest(JOB_ID))
    assert "hf-very-secret-value" not in json.dumps(answer)
    found = takeover.parse_record(answer["record"], JOB_ID, SSH)
    assert found.attempt == 2 and found.created_at == 1700000000.0
    assert found.job.plan == plan and found.job.job == JOB and found.job.state == JobState.RUNNING
    assert [n.host for n in found.job.cluster.nodes] == ["gpu1", "gpu2", "gpu3"]

    store = Store(tmp_path / "home")
    takeover.import_job(store, found, "gpu1")
    job = store.job(JOB_ID)
    assert (job.state, job.attempt, job.created_at) == ("RUNNING", 2, 1700000000.0)
    assert [(n.attempt, n.node, n.seen, n.host) for n in store.nodes(JOB_ID)] == [
        (2, 0, 0, "gpu1"), (2, 1, 0, "gpu2")]
    assert [e["kind"] for e in store.events(JOB_ID)] == ["imported"]

    assert _command(follow.record, RecordRequest("gone-00000000"))["error"] == \
        "no run directory of job gone-00000000 on this node"


def test_a_record_read_back_must_be_this_jobs_on_this_cluster() -> None:
    plan = plan_job(JOB, SSH, JOB_ID, rdzv_port=29533)
    record = takeover.node_record(JobRow(id=plan.job_id, name=None, state=JobState.RUNNING, spec=stored_spec(JOB, SSH, run_check=False)), plan, 0)
    with pytest.raises(LaunchError, match="hold a record of job 'taken-0000cccc', not taken-0000dddd"):
        takeover.parse_record(record, "taken-0000dddd", SSH)
    other = SSH.model_copy(update={"nodes": SSH.nodes[1:]})
    with pytest.raises(LaunchError, match="ran on cluster 'lab', which is not the cluster of this file: its hosts gpu1"):
        takeover.parse_record(record, JOB_ID, other)
    with pytest.raises(LaunchError, match="it is named 'lab', this file 'lab2'"):
        takeover.parse_record(record, JOB_ID, SSH.model_copy(update={"name": "lab2"}))
    local = cluster_spec(name="lab", backend="local")
    with pytest.raises(LaunchError, match="ran on a ssh cluster \\(lab\\), not on the local cluster"):
        takeover.parse_record(record, JOB_ID, local)
    with pytest.raises(LaunchError, match="cannot be read back"):
        takeover.parse_record({**record, "plan": {"job_id": JOB_ID}}, JOB_ID, SSH)
    smaller = SSH.model_copy(update={"nodes": SSH.nodes[1:]})  # left out a node: a subset of the file's hosts
    shrunk = takeover.node_record(JobRow(id=plan.job_id, name=None, state=JobState.RUNNING, spec=stored_spec(JOB, smaller, run_check=False)), plan, 3)
    assert [n.host for n in takeover.parse_record(shrunk, JOB_ID, SSH).job.cluster.nodes] == ["gpu2", "gpu3"]


class _Nodes:
    """A backend whose nodes answer ``record`` as given (a record, or an error text)."""

    def __init__(self, *answers: dict | str) -> None:
        self.answers = answers

    def job_record(self, index: int, job_id: str):
        answer = self.answers[index]
        return (answer, None) if isinstance(answer, dict) else (None, answer)

    def host(self, plan, index: int) -> str:
        return f"gpu{index + 1}"


def test_reading_a_job_back_names_what_each_node_said() -> None:
    cluster = SSH.model_copy(update={"nodes": SSH.nodes[:2]})
    unknown = _Nodes(f"no run directory of job {JOB_ID} on this node", f"no run directory of job {JOB_ID} on this node")
    with pytest.raises(LaunchError, match=f"job {JOB_ID} is not known to this store, and its nodes do not know it"):
        takeover.read_record(unknown, cluster, JOB_ID)  # type: ignore[arg-type]
    with pytest.raises(LaunchError, match="cannot be read back from its nodes: gpu1: gpu1: cannot connect"):
        takeover.read_record(_Nodes("gpu1: cannot connect", "no run directory"), cluster, JOB_ID)  # type: ignore[arg-type]
    assert takeover.read_record(_Nodes("gpu1: cannot connect", {"job_id": JOB_ID}), cluster, JOB_ID) == {"job_id": JOB_ID}  # type: ignore[arg-type]


def test_the_next_generation_and_a_reader_in_contact() -> None:
    def node(index: int, answer: dict | None) -> takeover.NodeGeneration:
        return takeover.NodeGeneration(index, f"gpu{index + 1}", answer, None if answer else "unreachable")

    nodes = [node(0, {"generation": 2, "contact_s": 40.0, "agent_gone": None}), node(1, None),
             node(2, {"generation": 3, "contact_s": 0.4, "agent_gone": "the agent (pid 9) has exited"})]
    assert takeover.next_generation(nodes) == 4 and takeover.next_generation([]) == 1
    assert takeover.in_contact(nodes) is None  # fresh contact, but with its agent gone: the job ended there
    fresh = node(3, {"generation": 3, "contact_s": 0.5, "agent_gone": None, "pid": 7, "host": "login-2"})
    assert takeover.in_contact([*nodes, fresh]) is fresh
    assert takeover.who(fresh) == "generation 3, process 7 on login-2"


def test_of_two_attaches_at_once_the_one_whose_generation_the_nodes_did_not_record_does_not_decide() -> None:
    """Issue 39, item 7: two `launch attach --cluster` from two stores both read generation 0, both asked for 1;
    the second was only warned and supervised too (a restart then lost)."""
    from types import SimpleNamespace

    class Nodes:
        """Two nodes' generation records, answering ``fence`` as the node command does."""

        def __init__(self) -> None:
            self.records = [{"generation": 0}, {"generation": 0}]

        def fence(self, plan, index, job_id, generation=None, who=None):
            record = self.records[index]
            taken = generation is not None and generation > record["generation"]
            if taken:
                record = self.records[index] = {"generation": generation, **(who or {}), "since": 1.0}
            return {**record, "taken": taken, "contact_s": None, "agent_gone": None}, None

    backend = Nodes()
    plan = SimpleNamespace(job_id="two-00000000", nodes=[SimpleNamespace(host="h1"), SimpleNamespace(host="h2")])
    read = [takeover.NodeGeneration(i, f"h{i + 1}", backend.fence(plan, i, plan.job_id)[0], None) for i in (0, 1)]
    warned: list[str] = []
    assert takeover.take(backend, plan, read, every_node=False, warn=warned.append) == 1  # the first attach
    with pytest.raises(LaunchError, match="not attached: node 0 \\(h1\\) was taken by another supervisor meanwhile"):
        takeover.take(backend, plan, read, every_node=False, warn=warned.append)  # the second, read before
    assert warned == []


# a supervisor taken over (fake backend: no process)

NEWER = {"generation": 1, "pid": 4242, "host": "login-2"}
TWO = cluster_spec(name="two", backend="ssh", python="/usr/bin/python3", workdir="/work",
                  nodes=[{"host": f"h{i}", "address": f"10.0.0.{i}", "gpus": 0, "slots": 1} for i in (1, 2)])


def _fenced_backend(scripts, answer_fence: bool):
    from launcher.backends.follow import Followed as Read
    from tests.unit.fakes import FakeBackend

    class Handle(NodeHandle):
        """A follow the node refused: no line, no exit, the newer generation's record."""

        def __init__(self, index: int) -> None:
            self.index = index
            self._read = Read(f"h{index + 1}")

        def lines(self):
            yield from self._read.through(iter([encode_frame(FrameKind.FENCED, NEWER).decode(),
                                                encode_output("not passed on").decode()]))

        @property
        def fenced(self):
            return self._read.fenced

        def poll(self):
            return None

        def terminate(self, grace: float) -> None:
            raise AssertionError("a fenced supervisor terminates nothing")

    class Fenced(FakeBackend):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.capabilities = dataclasses.replace(self.capabilities, fences=answer_fence)

        def follow(self, plan, index, after, agent=None, generation=0):
            assert generation == 0
            self.followed.append((index, after))
            return Handle(index)

        def fence(self, plan, index, job_id, generation=None, who=None):
            return dict(NEWER), None

    return Fenced(TWO, [scripts])


def _recorded(tmp_path: Path, job_id: str):
    from launcher.run.orchestrate import stored_spec as spec_of

    spec = JobSpec(name="unit", entrypoint=["python", "t.py"], resources={"nodes": 2, "nproc_per_node": 1})
    plan = plan_job(spec, TWO, job_id, rdzv_port=29500)
    store = Store(tmp_path / "home")
    store.create_job(plan, spec_of(spec, TWO, run_check=True))
    return store, plan


def test_a_supervisor_whose_follow_is_fenced_stops_without_writing_an_end(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.run import watcher as watcher_module
    from launcher.run.supervisor import Supervisor
    from tests.unit.fakes import NodeScript, record

    monkeypatch.setattr(watcher_module, "retry_delay", lambda tries: 0.01)
    store, plan = _recorded(tmp_path, "unit-0000f0f0")
    backend = _fenced_backend([NodeScript(lines=[record(0, 1)], code=None), NodeScript(lines=[], broken=True)], False)
    with pytest.raises(SupervisorFenced) as raised:
        Supervisor(store, plan, backend, grace=0.1).run()
    assert str(raised.value).startswith("job unit-0000f0f0: taken over by a newer supervisor (generation 1, process 4242 "
                                        "on login-2); this one stops here")
    assert raised.value.exit_code == FENCED_EXIT
    row = store.job(plan.job_id)
    assert row.state == "RUNNING" and row.ended_at is None
    assert backend.swept_nodes == 0 and backend.closed and backend.followed == [(1, 0)]
    assert not any(node.terminated for node in backend.started[0])
    kinds = [event["kind"] for event in store.events(plan.job_id)]
    assert not {"succeeded", "failed", "cancelled", "sweep", "restarting"} & set(kinds), kinds
    backend.started[0][0].terminate(0.1)  # end the fake node's stream


def test_a_supervisor_whose_agents_stream_says_fenced_stops_at_that_line(tmp_path: Path) -> None:
    from launcher.run.supervisor import Supervisor
    from tests.unit.fakes import FakeBackend, NodeScript, record

    store, plan = _recorded(tmp_path, "unit-0000f2f2")
    backend = FakeBackend(TWO, [[NodeScript(code=None),
                                 NodeScript(lines=[record(1, 1), encode_frame(FrameKind.FENCED, NEWER).decode(), record(1, 2)], code=None)]])
    with pytest.raises(SupervisorFenced, match="generation 1, process 4242 on login-2"):
        Supervisor(store, plan, backend, grace=0.1).run()
    assert [r.step for r in store.metrics(plan.job_id)] == [1]  # nothing past the agent's word is taken
    assert store.nodes(plan.job_id)[1].seen == 1 and store.job(plan.job_id).state == "RUNNING"
    assert backend.swept_nodes == 0 and not any(node.terminated for node in backend.started[0])
    backend.started[0][0].terminate(0.1)  # end node 0's stream (node 1's reader stopped at the fence)


def test_ctrl_c_of_a_supervisor_just_taken_over_cancels_nothing(tmp_path: Path) -> None:
    from launcher.run.supervisor import Supervisor
    from tests.unit.fakes import NodeScript

    store, plan = _recorded(tmp_path, "unit-0000f1f1")
    backend = _fenced_backend([NodeScript(code=None), NodeScript(code=None)], True)
    supervisor = Supervisor(store, plan, backend, grace=0.1)
    supervisor.request_cancel("cancelled (Ctrl-C)")  # seen by the loop before any stream told it
    with pytest.raises(SupervisorFenced):
        supervisor.run()
    assert store.job(plan.job_id).state == "RUNNING" and backend.swept_nodes == 0
    assert not any(node.terminated for node in backend.started[0])
    for node in backend.started[0]:
        node.terminate(0.1)  # end the fake nodes' streams


def test_attach_names_missing_secrets_and_follows_without_restarting(monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.run.attach import _attach_secrets
    from launcher.run.recorded import RecordedJob

    plan = plan_job(JOB, SSH, JOB_ID, rdzv_port=29533)
    job = RecordedJob(id=JOB_ID, state=JobState.RUNNING, plan=plan, job=JOB, cluster=SSH, check=True, supervisor_pid=None)
    said: list[str] = []
    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert _attach_secrets(job, said.append) is None
    assert len(said) == 1 and "HF_TOKEN not set in your environment" in said[0] and "not restarted from here" in said[0]
    monkeypatch.setenv("HF_TOKEN", "hf-very-secret-value")
    assert _attach_secrets(job, said.append) == {"HF_TOKEN": "hf-very-secret-value"} and len(said) == 1


def test_a_node_refuses_the_signals_and_sweeps_of_an_older_generation(root: Path) -> None:
    """After a takeover the old supervisor's next contact is refused: its TERM to an agent and its sweep too, not
    only its follow. `launch cancel` of a job without a supervisor (no generation) is never refused."""
    import signal
    import subprocess

    from launcher.node import main as node_main
    from launcher.node.proctree import start_ticks

    journal.write_atomically(journal.generation_path(str(root / JOB_ID), 0),
                             json.dumps({"generation": 1, "pid": 42, "host": "login-2", "since": 1.0}))
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        term = {"job_id": JOB_ID, "node": 0, "pid": agent.pid,
                "start_ticks": start_ticks(agent.pid), "signal": int(signal.SIGTERM)}

        def said(command: str, req: dict) -> dict:
            out = io.StringIO()
            with redirect_stdout(out):
                assert node_main.main([command, json.dumps(req)]) == 0
            return json.loads(out.getvalue())

        assert said("signal", {**term, "generation": 0}) == {"fenced": {"generation": 1, "pid": 42, "host": "login-2", "since": 1.0}}
        assert said("end", {"job_id": JOB_ID, "node": 0, "grace": 0.1, "generation": 0}) == {
            "fenced": {"generation": 1, "pid": 42, "host": "login-2", "since": 1.0}}
        assert agent.poll() is None, "the old supervisor's TERM was not sent"
        assert said("signal", {**term, "generation": 1}) == {"sent": True}
        assert agent.wait(10) == -signal.SIGTERM
    finally:
        agent.kill()
        agent.wait()
    assert "fenced" not in said("end", {"job_id": JOB_ID, "grace": 0.1})  # launch cancel's


def test_a_supervisors_sweep_carries_its_generation_and_stops_it_when_refused() -> None:
    from launcher.backends import get_backend, plan_job

    backend = get_backend(SSH)
    plan = plan_job(JOB, SSH, JOB_ID, rdzv_port=29500)
    asked: list[dict] = []

    def node_command(plan, index, command, request, timeout=30.0):
        asked.append(request)
        return {"fenced": {"generation": 2, "pid": 7, "host": "login-3"}}, None

    backend.node_command = node_command  # type: ignore[method-assign]
    with pytest.raises(SupervisorFenced, match="generation 2, process 7 on login-3"):
        backend.sweep(plan, 0.1, generation=1)
    assert {(r.job_id, r.node, r.generation) for r in asked} <= {(JOB_ID, 0, 1), (JOB_ID, 1, 1)}
    backend.close()


def test_a_readers_contact_age_is_on_the_monotonic_clock_whatever_the_wall_clock_does(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: ``fence`` aged contact by the wall clock, so a step back made a reader gone for an hour look in
    contact (attach refused) and a step forward made a live one look gone (two supervisors)."""
    import time

    contact = journal.contact_path(str(root / JOB_ID), 0)
    now = {"mono": 1000.0, "wall": time.time()}
    monkeypatch.setattr(time, "monotonic", lambda: now["mono"])
    monkeypatch.setattr(time, "time", lambda: now["wall"])
    journal.touch(contact)
    now["mono"] += 0.5
    now["wall"] += 3600  # stepped forward an hour just after the reader's touch
    assert _command(follow.fence, FenceRequest(JOB_ID, 0))["contact_s"] == pytest.approx(0.5)
    now["mono"] += 40
    now["wall"] -= 7200  # back an hour before the touch: the reader has been gone 40 s all the same
    assert _command(follow.fence, FenceRequest(JOB_ID, 0))["contact_s"] == pytest.approx(40.5)
    Path(contact).write_text("0" * 36 + " 00000000000000000001.000\n")  # touched in another boot
    assert _command(follow.fence, FenceRequest(JOB_ID, 0))["contact_s"] is None


STORE_A, STORE_B = "a" * 32, "b" * 32


def test_a_run_directory_goes_once_every_store_that_followed_the_job_filed_it(root: Path) -> None:
    """Issue 39, item 10: run directories were never removed. The supervisor that files a job's end asks for it
    (``clean`` with ``filed_by``); another store that followed the job (an attach, a takeover) still reads it until
    it has filed the job too."""
    run_dir = root / JOB_ID
    (run_dir / journal.RECORD_FILE).write_text(json.dumps({"job_id": JOB_ID, "store": STORE_A}))
    rundir.mark_store(str(run_dir), STORE_A)  # as the agent does from its request's record
    assert _command(follow.fence, FenceRequest(JOB_ID, 0, 1, 42, "login-2", STORE_B))["taken"]
    assert rundir.stores(str(run_dir)) == {STORE_A, STORE_B}

    first = _command(follow.clean, CleanRequest(JOB_ID, filed_by=STORE_B))
    assert first == {"removed": [], "kept": {JOB_ID: "1 other job store(s) that followed the job have not filed it "
                                                     "yet (their `launch attach` reads it)"}}
    assert (run_dir / "node0.journal").exists()
    assert _command(follow.clean, CleanRequest(JOB_ID, filed_by=STORE_A)) == {"removed": [JOB_ID], "kept": {}}
    assert not run_dir.exists() and root.exists()
    assert _command(follow.clean, CleanRequest(JOB_ID, filed_by=STORE_A)) == {"removed": [], "kept": {}}


def test_a_run_directory_not_proven_this_jobs_or_still_in_use_is_never_collected(root: Path, tmp_path: Path) -> None:
    from launcher.node import proctree

    run_dir = root / JOB_ID
    said = follow.collect(JOB_ID, STORE_A)
    assert said == ([], {JOB_ID: "it holds no record of this job (job.json): not removed"}) and run_dir.exists()
    (run_dir / journal.RECORD_FILE).write_text(json.dumps({"job_id": "other-00000000"}))
    assert follow.collect(JOB_ID, STORE_A)[1][JOB_ID].startswith("it holds no record of this job")
    (run_dir / journal.RECORD_FILE).write_text(json.dumps({"job_id": JOB_ID}))
    assert follow.collect(JOB_ID, STORE_A) == ([], {JOB_ID: "this job store is not recorded as following the job "
                                                            "here (an older launch?)"})
    rundir.mark_store(str(run_dir), STORE_A)
    (run_dir / "node1.pid").write_text(f"{os.getpid()} {proctree.start_ticks(os.getpid())}\n")  # an agent runs
    assert follow.collect(JOB_ID, STORE_A, wait_s=0.2) == ([], {JOB_ID: "an agent of the job still runs (node1.pid)"})
    assert follow.collect(JOB_ID, "../" + STORE_A)[1][JOB_ID].startswith("bad job store id")
    (run_dir / "node1.pid").unlink()
    elsewhere = tmp_path / "elsewhere"  # the job's name in the run root a symlink to a directory of ours
    run_dir.rename(elsewhere)
    run_dir.symlink_to(elsewhere)
    assert "is a symlink (to " in follow.collect(JOB_ID, STORE_A)[1][JOB_ID]
    assert (elsewhere / "node0.journal").exists()


def test_the_retention_sweep_runs_at_most_once_an_hour_a_node_and_launch_clean_skips_its_mark(root: Path) -> None:
    """Every agent's start read every run directory of its user for the 7-day retention: 0.14 s of CPU a start at
    1,300 of them, at each host of each job. The first agent in an hour sweeps; the mark it leaves is no job's."""
    now = 1_000_000_000.0
    assert follow.sweep_due(now) and (root / follow.SWEPT_MARK).stat().st_mtime == now
    assert not follow.sweep_due(now + 10) and not follow.sweep_due(now + follow.SWEEP_EVERY_S - 1)
    assert follow.sweep_due(now + follow.SWEEP_EVERY_S) and not follow.sweep_due(now + follow.SWEEP_EVERY_S + 1)
    assert follow.clean_dirs(None, 0.0, dry_run=True) == ([JOB_ID], {})


def test_a_job_store_has_one_id_made_once(tmp_path: Path) -> None:
    from launcher.run import identity

    made = identity.store_id(tmp_path)
    assert rundir.STORE_ID.fullmatch(made) and identity.store_id(tmp_path) == made
    assert (tmp_path / identity.STORE_ID_FILE).stat().st_mode & 0o777 == 0o600
    (tmp_path / identity.STORE_ID_FILE).write_text("../../etc\n")  # not an id: replaced, never sent to a node
    again = identity.store_id(tmp_path)
    assert again != made and rundir.STORE_ID.fullmatch(again) and identity.store_id(tmp_path) == again
