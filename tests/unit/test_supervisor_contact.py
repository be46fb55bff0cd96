"""Loss of contact is not loss of a node: the pure decisions (``run.contact``), and a watcher that follows its
node again from the lines it had (a fake follow; no sleeps beyond the first retry's half second)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.backends.base import NodeHandle
from launcher.backends.failures import LOST_NODE_EXIT
from launcher.backends.follow import Followed
from launcher.node.protocol import FrameKind, encode_frame, encode_output
from launcher.run import contact
from launcher.run import watcher as watcher_module
from launcher.run.contact import OutOfContact, Pulse, verdict
from launcher.run.filing import Filer
from launcher.run.liveness import Liveness
from launcher.run.orchestrate import stored_spec
from launcher.run.watcher import NodeWatcher, Relay, Resume
from launcher.spec import JobSpec
from launcher.store.db import Store
from launcher.store.records import Batch, Seen
from tests.unit.fakes import output, record, sample

CLUSTER = cluster_spec(name="two", backend="ssh", python="/usr/bin/python3", workdir="/work",
                      nodes=[{"host": f"h{i}", "address": f"10.0.0.{i}", "gpus": 0, "slots": 2} for i in (1, 2)])


# the decisions


def test_a_silent_channel_alone_never_loses_a_node():
    out = OutOfContact(1, "h2", since=100.0)  # the stream broke; no try has failed yet
    assert verdict(out, Pulse(last=None), now=200.0, unattended_s=None) is None
    assert verdict(out, Pulse(last=None, others_failed=True), now=200.0, unattended_s=None) is None


def test_unreachable_while_the_job_stops_progressing_is_lost_within_the_window():
    out = OutOfContact(1, "h2", since=100.0, tries=1, error="h2: cannot connect: timed out")
    stalled = Pulse(last=99.0, gap=1.0)  # steps every second until the drop, none since
    assert verdict(out, stalled, now=104.0, unattended_s=1800) is None
    why = verdict(out, stalled, now=105.0, unattended_s=1800)
    assert why is not None and "h2 unreachable (h2: cannot connect: timed out)" in why and "no progress" in why


def test_unreachable_while_the_others_progress_is_only_out_of_contact():
    out = OutOfContact(1, "h2", since=100.0, tries=5, error="no route to host")
    moving = Pulse(last=139.0, gap=1.0)
    assert verdict(out, moving, now=140.0, unattended_s=1800) is None
    assert verdict(out, moving, now=140.0, unattended_s=None) is None


def test_unreachable_while_another_node_failed_is_lost_at_once():
    out = OutOfContact(1, "h2", since=100.0, tries=1, error="refused")
    assert "while other nodes failed" in verdict(out, Pulse(last=100.5, others_failed=True), 101.0, 1800)


def test_a_try_that_hangs_counts_as_evidence_after_a_while():
    out = OutOfContact(1, "h2", since=100.0, trying_since=101.0)
    hung = 101.0 + contact.PENDING_EVIDENCE_S
    assert not out.unreachable(hung - 0.1) and out.unreachable(hung)
    assert verdict(out, Pulse(last=None), 106.0, 1800) is not None


def test_past_the_unattended_clock_the_agents_have_ended_the_job_themselves():
    out = OutOfContact(1, "h2", since=0.0)
    why = verdict(out, Pulse(last=1900.0), now=60.0 + contact.UNATTENDED_MARGIN_S + 1, unattended_s=60)
    assert why is not None and "watch.unattended_timeout" in why


def test_the_stall_window_follows_the_jobs_pace_within_bounds():
    assert contact.stall_window(0.0) == contact.MIN_STALL_S
    assert contact.stall_window(3.0) == 9.0
    assert contact.stall_window(60.0) == contact.MAX_STALL_S


def test_the_pulse_is_the_other_nodes_steps_or_activity():
    live = Liveness(started=0.0)
    live.progress(0, 0, 5, 10.0)
    live.progress(1, 2, 5, 11.0)
    assert contact.pulse(live, node=1, others_failed=False).last == 10.0  # node 1's own steps do not count
    quiet = Liveness(started=0.0)
    quiet.sample(0, 0, 1.0, None, 5.0)
    quiet.sample(0, 0, 3.0, None, 7.0)  # busy
    assert contact.pulse(quiet, node=1, others_failed=False).last == 7.0


def test_retries_back_off_then_keep_a_steady_pace():
    assert [contact.retry_delay(n) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_a_journal_reader_learns_the_exit_or_the_loss_from_the_lines():
    followed = Followed("h2")
    lines = [encode_output("a").decode(), encode_frame(FrameKind.EXIT, {"code": 3}).decode()]
    assert list(followed.through(iter(lines))) == lines
    assert followed.code() == 3
    lost = Followed("h2")
    list(lost.through(iter([encode_frame(FrameKind.LOST, {"reason": "the agent (pid 7) is gone"}).decode()])))
    assert lost.code() == LOST_NODE_EXIT and "the agent (pid 7) is gone" in lost.lost


# a watcher that follows again


class Journal:
    """A node's journal and handles on it: ``cut`` lines in, the first handle's stream breaks."""

    def __init__(self, lines: list[str], cut: int | None = None, fail: int = 0) -> None:
        self.lines, self.cut, self.fail, self.asked = lines, cut, fail, []

    def handle(self, after: int, upto: int | None = None):
        journal = self

        class Handle(NodeHandle):
            index, pid = 1, 4242

            def __init__(self) -> None:
                self.followed = Followed("h2")

            def lines(self):
                yield from self.followed.through(iter(journal.lines[after:upto]))
                if upto is not None:
                    self.error = "connection to h2 lost: EOF"

            def poll(self):
                return self.lost_reason and LOST_NODE_EXIT or self.followed.code()

            def terminate(self, grace):
                pass

        return Handle()

    def follow(self, index: int, after: int, agent):
        self.asked.append((index, after, agent))
        if self.fail:
            self.fail -= 1
            raise OSError("h2: cannot connect: connection refused")
        return self.handle(after)


@pytest.fixture
def relay(tmp_path: Path):
    spec = JobSpec(name="unit", entrypoint=["python", "t.py"], resources={"nodes": 2, "nproc_per_node": 2})
    plan = plan_job(spec, CLUSTER, "unit-00000002", rdzv_port=29500)
    store = Store(tmp_path / "home")
    store.create_job(plan, stored_spec(spec, CLUSTER, run_check=True))
    store.set_node(plan.job_id, 0, 1, host="h2", state="RUNNING")
    echoed: list[str] = []
    relay = Relay(world_size=4, secrets={}, echo=echoed.append, note=lambda text: None,
                  sequence=iter(range(10**6)).__next__)
    return relay, Filer(store, plan.job_id, 0, relay.losses, lambda node, rejected: None, lambda text: None), echoed


def filed(relay: Relay, filer: Filer) -> Store:
    """What the supervisor's loop does with what the watchers handed over: files it; the store."""
    filer.take(relay.handed, Liveness(0.0))
    return filer.store


JOURNAL = ['@started {"pid":4242,"start_ticks":99}', output("[2]: hello"), record(2, 1), sample(1.0),
           output("[2]: between"), record(2, 2), output("[2]: bye"), '@exit {"code":0}']


def test_a_broken_stream_is_followed_again_from_the_lines_received(relay, tmp_path, monkeypatch):
    monkeypatch.setattr(watcher_module, "retry_delay", lambda tries: 0.0)
    relay, filer, echoed = relay
    journal = Journal(JOURNAL, fail=2)
    watcher = NodeWatcher(journal.handle(0, upto=5), "h2", tmp_path / "n1.log", relay, follow=journal.follow)
    watcher.join(10)
    assert watcher.done and watcher.handle.poll() == 0
    assert journal.asked == [(1, 5, (4242, 99))] * 3, "two refused tries, then the journal from line 6"
    assert echoed == ["[1/2] hello", "[1/2] between", "[1/2] bye"]
    store = filed(relay, filer)
    assert [r.step for r in store.metrics(filer.job_id)] == [1, 2]
    row = store.nodes(filer.job_id, 0)[0]
    assert row.seen == len(JOURNAL) and row.start_ticks == 99


def test_a_resumed_watcher_writes_no_line_twice_and_loses_none(relay, tmp_path):
    relay, filer, echoed = relay
    log = tmp_path / "n1.log"
    first = NodeWatcher(Journal(JOURNAL).handle(0, upto=5), "h2", log, relay)
    first.join(10)
    store, job_id = filed(relay, filer), filer.job_id
    assert store.nodes(job_id, 0)[0].seen == 5
    # killed after the output line 5 was logged, before it was marked: the store's last mark is the sample's (line 4)
    before = len(log.read_text().splitlines()[0]) + 1
    store.add_batch(job_id, 0, Batch(seen={1: Seen(1, 4, before)}))
    row = store.nodes(job_id, 0)[0]
    resume = Resume(row.seen, row.log_bytes, (4242, 99))
    second = NodeWatcher(Journal(JOURNAL).handle(row.seen), "h2", log, relay, resume=resume)
    second.join(10)
    shown = [line.partition(" ")[2] for line in log.read_text().splitlines()]
    assert shown == ["[1/2] hello", "[1/2] between", "[1/2] bye"]
    filed(relay, filer)
    assert [r.step for r in store.metrics(job_id)] == [1, 2]
    assert store.nodes(job_id, 0)[0].seen == len(JOURNAL)


def test_an_out_of_contact_node_is_described_until_the_loop_gives_up(relay, tmp_path, monkeypatch):
    monkeypatch.setattr(watcher_module, "retry_delay", lambda tries: 0.01)
    relay, _, _ = relay
    journal = Journal(JOURNAL, fail=10**6)
    watcher = NodeWatcher(journal.handle(0, upto=2), "h2", tmp_path / "n1.log", relay, follow=journal.follow)
    for _ in range(500):
        seen = watcher.contact()
        if seen is not None and seen.tries >= 2:
            break
        watcher.join(0.01)
    assert seen is not None and seen.node == 1 and "connection refused" in (seen.error or "")
    watcher.give_up("h2 unreachable while the job made no progress")
    watcher.join(5)
    assert watcher.done and watcher.handle.poll() == LOST_NODE_EXIT
    assert json.dumps(watcher.handle.lost_reason)


# the supervisor's loop


def test_the_supervisor_loses_an_unreachable_node_only_once_the_job_stops_progressing(tmp_path, monkeypatch):
    from launcher.run import supervisor as supervisor_module
    from launcher.run.supervisor import Supervisor
    from launcher.store.states import JobState
    from tests.unit.fakes import FakeBackend, NodeScript

    monkeypatch.setattr(watcher_module, "retry_delay", lambda tries: 0.01)
    monkeypatch.setattr(contact, "MIN_STALL_S", 0.3)
    monkeypatch.setattr(supervisor_module, "SETTLE_S", 0.1)
    monkeypatch.setattr(supervisor_module, "REPORT_WAIT_S", 0.2)
    monkeypatch.setattr(supervisor_module, "POLL_S", 0.01)
    spec = JobSpec(name="unit", entrypoint=["python", "t.py"], resources={"nodes": 2, "nproc_per_node": 2})
    plan = plan_job(spec, CLUSTER, "unit-00000003", rdzv_port=29500)
    store = Store(tmp_path / "home")
    store.create_job(plan, stored_spec(spec, CLUSTER, run_check=True))
    backend = FakeBackend(CLUSTER, [[NodeScript(lines=[record(0, 1)], code=None),
                                     NodeScript(lines=[record(2, 1)], broken=True)]])
    state = Supervisor(store, plan, backend, grace=0.1).run()
    row = store.job(plan.job_id)
    assert state == JobState.FAILED
    assert row.first_failure["kind"] == "lost" and row.first_failure["node"] == 1
    assert "h2 unreachable (h2: cannot connect: connection refused)" in row.reason, row.reason
    assert "no progress on the other nodes" in row.reason
    assert backend.followed and all(asked == (1, 1) for asked in backend.followed), "followed from the line it had"
    assert backend.unreachable == [1]
    kinds = [event["kind"] for event in store.events(plan.job_id)]
    assert "contact_lost" in kinds and kinds.index("contact_lost") < kinds.index("node_failed")


def test_a_watcher_whose_echo_blocks_is_stuck_and_the_loop_holds_its_verdicts(tmp_path):
    """Issue 39: a foreground output nobody reads blocks the echo; the supervisor cannot take in that node's lines,
    so it judges nothing until they come in again (``Attention.hold``), then says how long."""
    import threading
    import time

    from launcher.run.nodetime import Attention

    release = threading.Event()
    relay = Relay(world_size=4, secrets={}, echo=lambda line: release.wait(10), note=lambda text: None,
                  sequence=iter(range(10**6)).__next__)
    watcher = NodeWatcher(Journal(JOURNAL).handle(0), "h2", tmp_path / "n1.log", relay)
    began = time.time()
    stuck = None
    while stuck is None and time.time() - began < 10:
        stuck = watcher.stuck_since(time.time(), 0.2)
    assert stuck is not None and watcher.heard() is not None
    attention = Attention(limit=15)
    attention.round(began, 0.0)
    attention.hold(stuck, stuck + 30, "node 1's lines could not be taken in (the foreground output blocked) for")
    assert attention.waiting and attention.settle([watcher.heard()], stuck + 30.1) is None
    release.set()
    watcher.join(10)
    assert watcher.done and watcher.stuck_since(time.time(), 0.0) is None
    back = attention.settle([stuck + 30.2], stuck + 30.3)
    assert back is not None and back.describe() == \
        "node 1's lines could not be taken in (the foreground output blocked) for 30 s; caught up"


def test_a_lock_file_removed_under_a_nodes_lease_is_one_event_and_one_line(relay, tmp_path):
    """Issue 39, item 5: the agent's ``@lease`` frame (launcher.node.leases.Moved) reaches the job's history and log."""
    relay, filer, echoed = relay
    moved = {"kind": "gpu", "device": 3, "path": "/var/tmp/launch-leases/gpu-01.gpu3.lock", "what": "removed",
             "owners": ["bob"], "leased_again": True}
    lines = ['@started {"pid":4242,"start_ticks":99}', encode_frame(FrameKind.LEASE, moved).decode(), '@exit {"code":0}']
    watcher = NodeWatcher(Journal(lines).handle(0), "h2", tmp_path / "n1.log", relay)
    watcher.join(10)
    said = ("launch: node 1: the lock file of GPU 3 (/var/tmp/launch-leases/gpu-01.gpu3.lock) was removed while this "
            "job held it (only bob or root could): leased again, no other job can take GPU 3; `launch queue --set-up`, "
            "run once by root, makes lock files no user can remove (docs/LEASES.md)")
    assert echoed == [f"[1] {said}"]
    events = [e for e in filed(relay, filer).events(filer.job_id) if e["kind"] == "lock_file_removed"]
    assert [(e["message"], e["data"]) for e in events] == [(said, {"node": 1, "device": 3, "leased_again": True})]
