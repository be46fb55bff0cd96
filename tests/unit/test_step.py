"""The supervisor's decisions in an attempt, event by event (``run/step.py``): no threads, no clock, no nodes."""

from __future__ import annotations

from launcher.backends.failures import LOST_NODE_EXIT, Failure, FailureKind
from launcher.run.step import Attempt, CancelAsked, Do, Exited, Fenced, Stalled, step

HUNG = Failure(kind=FailureKind.HANG, reason="hung")


def _run(nodes: int, *events) -> list[Do]:
    """What the loop is told after each event."""
    state, told = Attempt(nodes), []
    for event in events:
        state, do = step(state, event)
        told.append(do)
    return told


def test_the_attempt_succeeds_at_the_last_clean_exit_and_not_before() -> None:
    assert _run(3, Exited(2, 0), Exited(0, 0), Exited(1, 0)) == [Do.WATCH, Do.WATCH, Do.SUCCEED]


def test_one_failed_node_ends_the_attempt_at_once_a_lost_one_too() -> None:
    assert _run(4, Exited(1, 0), Exited(3, 1)) == [Do.WATCH, Do.FAIL]
    assert _run(2, Exited(0, LOST_NODE_EXIT)) == [Do.FAIL]


def test_a_failure_seen_in_the_round_of_a_cancel_is_the_news() -> None:
    assert _run(2, Exited(1, -9), CancelAsked("Ctrl-C")) == [Do.FAIL, Do.FAIL]
    assert _run(2, Exited(0, 0), Exited(1, 0), CancelAsked("Ctrl-C")) == [Do.WATCH, Do.SUCCEED, Do.SUCCEED]


def test_a_cancel_outranks_a_stall_and_a_stall_alone_is_a_hang() -> None:
    assert _run(2, CancelAsked("SIGTERM"), Stalled(HUNG)) == [Do.CANCEL, Do.CANCEL]
    assert _run(2, Exited(0, 0), Stalled(HUNG)) == [Do.WATCH, Do.HANG]


def test_a_newer_supervisor_stops_this_one_before_anything_else() -> None:
    fenced = Fenced({"generation": 1, "host": "laptop", "pid": 4242})
    assert _run(2, fenced, Exited(0, 1), CancelAsked("Ctrl-C"), Stalled(HUNG)) == [Do.STOP] * 4


def test_the_decision_keeps_the_exits_it_rests_on() -> None:
    state, _ = step(Attempt(3), Exited(2, 0))
    state, do = step(state, Exited(0, 7))
    assert (dict(state.exits), state.decided, do) == ({2: 0, 0: 7}, Do.FAIL, Do.FAIL)
