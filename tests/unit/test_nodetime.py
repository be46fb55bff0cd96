"""The node is the clock of record (issue 34): lines read late keep the time they were written, and a supervisor
that was away judges only once it has heard every node since it came back."""

from __future__ import annotations

from launcher.node.protocol import NodeTime
from launcher.run.liveness import HangDetector, Liveness, Progress
from launcher.run.nodetime import AWAY_S, Attention, NodeClock


def test_lines_read_after_a_pause_keep_the_time_they_were_written():
    clock = NodeClock()
    # the node's monotonic clock is 1000 s behind the supervisor's wall; lines take 5-50 ms to arrive
    assert clock.when(NodeTime(0.0, 0.0), 1000.05) == 1000.05
    assert abs(clock.when(NodeTime(1.0, 0.0), 1001.005) - 1001.005) < 1e-9  # a faster delivery: the offset shrinks
    # the supervisor was stopped for 60 s: the lines written meanwhile are all read at 1062.0
    read_late = [clock.when(NodeTime(1.0 + k, 0.0), 1062.0) for k in range(1, 61)]
    assert all(abs(t - (1001.005 + k)) < 0.01 for k, t in enumerate(read_late, 1))  # within the drift allowed
    assert clock.when(None, 1063.0) == 1063.0  # an unstamped line: the time it was read


def test_the_offset_follows_a_drifting_clock_and_a_new_boot():
    clock = NodeClock()
    clock.when(NodeTime(100.0, 0.0), 200.0)
    # 10 000 s later the node's clock runs 0.5 s slow, every line delivered in 10 ms: no line placed before it came
    later = clock.when(NodeTime(10_099.5, 0.0), 10_200.01)
    assert 10_200.0 < later <= 10_200.01
    assert clock.when(NodeTime(5.0, 0.0), 10_300.0) == 10_300.0  # rebooted: its clock went back, taken afresh


def _idle_job(started: float) -> tuple[HangDetector, Liveness]:
    live = Liveness(started)
    for k in range(30):
        live.apply(Progress(0, 0, k, started + 1 + k * 0.5))
    return HangDetector(stall_timeout=15, max_steps=None), live


def test_a_supervisor_back_from_60_s_away_waits_for_every_node_then_judges_on_what_they_did():
    attention = Attention(limit=15)
    attention.round(100.0, 10.0)
    attention.round(100.1, 10.1)
    assert not attention.waiting
    attention.round(160.1, 70.1)  # SIGSTOPped for 60 s
    assert attention.waiting
    assert attention.settle([158.0, 160.0], 160.2) is None  # node 0's backlog not read up to the return yet
    assert attention.settle([160.15, None], 160.3) is None  # node 1 not heard at all yet
    back = attention.settle([160.2, 160.25], 160.4)
    assert back is not None and back.caught_up and back.describe() == "supervisor was away 60 s; caught up"
    assert not attention.waiting and attention.settle([160.2, 160.25], 160.5) is None  # said once


def test_a_node_that_says_nothing_after_the_absence_holds_verdicts_for_the_limit_only():
    attention = Attention(limit=15)
    attention.round(0.0, 0.0)
    attention.round(AWAY_S + 1, AWAY_S + 1)
    assert attention.settle([1.0], AWAY_S + 10) is None
    back = attention.settle([1.0], AWAY_S + 1 + 15)
    assert back is not None and not back.caught_up and "not every node was heard from within 15 s" in back.describe()


def test_a_laptops_sleep_is_an_absence_though_its_monotonic_clock_stood_still():
    attention = Attention(limit=15)
    attention.round(1000.0, 50.0)
    attention.round(1600.0, 50.2)  # suspended for 10 minutes: the wall clock moved, the monotonic one did not
    assert attention.waiting


def test_a_late_round_alone_is_not_an_absence():
    attention = Attention(limit=15)
    for k in range(50):
        attention.round(k * (AWAY_S - 0.5), k * (AWAY_S - 0.5))
    assert not attention.waiting


def test_lines_placed_by_node_time_make_no_hang_of_a_pause_that_a_read_time_would():
    """What issue 34 saw: stamped with the time they were read, 60 s of steps arrive at once after a pause and
    the job looks idle for 60 s; placed by the node's clock, its last step was a moment ago."""
    hangs, live = _idle_job(0.0)
    assert hangs.check(live, 15.0) is None
    clock = NodeClock()
    clock.when(NodeTime(0.0, 0.0), 0.01)
    for k in range(120):  # written every 0.5 s during a 60 s pause, all read at 75.0
        live.apply(Progress(0, 0, 30 + k, clock.when(NodeTime(15.5 + k * 0.5, 0.0), 75.0)))
    assert hangs.check(live, 75.1) is None
    assert hangs.check(live, 75.0 + 16) is not None  # and a job that then stops is still called hung
