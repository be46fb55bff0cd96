"""Hang and stall verdicts from what launch observes, with the clock passed in."""

from __future__ import annotations

from launcher.backends.failures import FailureKind
from launcher.run.liveness import HangDetector, Liveness

TIMEOUT = 300.0


def test_a_program_without_reports_is_alive_while_it_prints_or_computes() -> None:
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=100)
    for t in range(0, 1000, 5):
        live.output(float(t))
        assert detector.check(live, t + 1.0) is None, "printing every 5 s is alive"
    quiet = Liveness(started=0.0)
    for t in range(0, 1000, 2):
        quiet.sample(0, 0, cpu_s=t * 0.5, gpu_util=None, t=float(t))
        assert detector.check(quiet, t + 1.0) is None, "gaining CPU time is alive"


def test_silent_and_idle_for_the_stall_timeout_is_hung_before_the_first_step() -> None:
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=100)
    for t in range(0, 400, 2):
        live.sample(0, 0, cpu_s=10.0, gpu_util=0.0, t=float(t))
    assert detector.check(live, 299.0) is None
    verdict = detector.check(live, 301.0)
    assert verdict.kind == FailureKind.HANG and not verdict.transient and "before the first step" in verdict.reason


def test_a_busy_gpu_is_alive() -> None:
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=100)
    for t in range(0, 1000, 2):
        live.sample(0, 0, cpu_s=1.0, gpu_util=0.9, t=float(t))
    assert detector.check(live, 999.0) is None


def test_reporting_ranks_that_go_idle_are_hung_at_the_adaptive_limit() -> None:
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=1000)
    for step in range(1, 11):
        live.progress(0, 0, step, t=float(step))
        live.progress(1, 1, step, t=float(step) + 0.5)
    assert detector.limit(live) == HangDetector.FLOOR_S
    assert detector.check(live, 10.5 + 29.0) is None
    verdict = detector.check(live, 10.5 + 31.0)
    assert verdict.kind == FailureKind.HANG and verdict.transient and verdict.rank == 0 and verdict.step == 10


def test_reporting_ranks_that_stay_busy_without_progress_are_stalled_at_the_stall_timeout() -> None:
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=1000)
    for step in range(1, 6):
        live.progress(0, 0, step, t=float(step))
    for t in range(6, 400, 2):
        live.output(float(t))  # an evaluation loop that prints but reports no steps
    assert detector.check(live, 5.0 + 299.0) is None
    verdict = detector.check(live, 5.0 + 301.0)
    assert verdict.kind == FailureKind.STALL and verdict.transient and "alive" in verdict.reason


def test_ranks_that_finished_their_steps_get_the_whole_timeout_to_exit() -> None:
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=10)
    for step in range(1, 11):
        live.progress(0, 0, step, t=float(step))
    assert detector.limit(live) == TIMEOUT
    assert detector.check(live, 10.0 + 200.0) is None


def test_ranks_stuck_in_exit_after_training_are_named_with_the_step_and_the_ranks_gone() -> None:
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=None, hosts=("h1",))
    for step in range(1, 13):
        for rank in (0, 1):
            live.progress(0, rank, step, t=float(step))
    live.sample(0, 0, cpu_s=5.0, gpu_util=None, t=12.0)
    live.sample(0, 1, cpu_s=5.0, gpu_util=None, t=12.0)
    live.output(12.5)  # each record is a line of output too
    live.progress(0, 0, 12, t=12.5, ended=True)
    live.progress(0, 1, 12, t=12.5, ended=True)
    live.sampled(0, frozenset({1}))  # rank 0 has exited; rank 1 waits for a thread its program left running
    live.sample(0, 1, cpu_s=5.0, gpu_util=None, t=14.0)
    assert detector.check(live, 12.5 + TIMEOUT - 1) is None, "the whole stall_timeout, not the adaptive limit"
    verdict = detector.check(live, 12.5 + TIMEOUT + 1)
    assert verdict.kind == FailureKind.HANG and not verdict.transient and (verdict.rank, verdict.step) == (1, 12)
    assert verdict.reason.startswith("hung in exit: training ended at step 12; rank(s) 1 on node 0 stuck in exit for 301 s")
    assert verdict.reason.endswith("; rank(s) 0 exited")


def test_a_rank_still_training_while_another_has_returned_is_not_in_exit() -> None:
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=None)
    for step in range(1, 6):
        live.progress(0, 0, step, t=float(step))
        live.progress(0, 1, step, t=float(step))
    live.progress(0, 0, 5, t=5.5, ended=True)
    verdict = detector.check(live, 5.5 + HangDetector.FLOOR_S + 1)
    assert verdict.reason.startswith("hung at step 5 on node 0/rank 1"), "rank 1 has not returned: it is in training"
    assert "every rank alive" in verdict.reason
    live.sampled(0, frozenset({1}))
    verdict = detector.check(live, 5.5 + HangDetector.FLOOR_S + 1)
    assert "rank(s) 1 alive but silent and idle, rank(s) 0 exited" in verdict.reason and "every rank" not in verdict.reason


def test_a_stopped_node_agent_is_named_not_reported_as_idle_ranks() -> None:
    """Issue 39 (Low): a SIGSTOPped agent sends no sample; its ranks were called 'alive but silent and idle'."""
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=100)
    for t in range(0, 400, 2):
        live.sample(0, 0, cpu_s=10.0, gpu_util=0.0, t=float(t))  # node 0's agent samples its idle rank on
        if t <= 10:
            live.sample(1, 1, cpu_s=10.0, gpu_util=0.0, t=float(t))  # node 1's agent was stopped at t=10
    verdict = detector.check(live, 400.0)
    assert verdict is not None and verdict.kind == FailureKind.HANG
    assert "no sample from the agent of node(s) 1 for 390 s (stopped, e.g. by SIGSTOP" in verdict.reason
    assert "silent and idle" not in verdict.reason
    assert live.unsampled_nodes(400.0) == {1: 390.0}
