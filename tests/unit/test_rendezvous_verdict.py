"""A job stuck before its ranks exist is reported as stuck in rendezvous, naming the nodes without ranks;
never as ranks that hang (issue 23). Fake per-node samples, the clock passed in."""

from __future__ import annotations

from launcher.backends.failures import FailureKind
from launcher.run.liveness import HangDetector, Joined, Liveness, Output, Sample
from launcher.views.stackclasses import ranges

TIMEOUT = 120.0
HOSTS = [f"lt-h{i}" for i in range(1, 33)]


def test_no_rank_on_any_node_is_stuck_in_rendezvous_not_hung_ranks() -> None:
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=5, hosts=HOSTS)
    live.apply(Output(t=3.0))  # torchrun's own start-up lines: no rank yet
    assert detector.check(live, 100.0) is None
    verdict = detector.check(live, 130.0)
    assert verdict is not None and verdict.kind == FailureKind.HANG and not verdict.transient
    assert verdict.reason.startswith("stuck in rendezvous for 127 s")
    assert "no rank process on any of the 32 nodes" in verdict.reason
    assert "how many agents joined is unknown" in verdict.reason
    assert "hung" not in verdict.reason and "every rank alive" not in verdict.reason
    assert (verdict.node, verdict.host, verdict.rank) == (0, "lt-h1", None)


def test_the_nodes_without_ranks_are_named_with_how_many_agents_joined() -> None:
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=5, hosts=HOSTS)
    for t in range(0, 200, 5):  # nodes 0-27 have their rank, idle in a collective that waits for the rest
        for node in range(28):
            live.apply(Sample(node=node, rank=node, cpu_s=1.0, gpu_util=None, t=float(t)))
    live.apply(Joined(agents=28, t=10.0))
    verdict = detector.check(live, 200.0)
    assert verdict is not None and verdict.reason.startswith("stuck in rendezvous")
    assert "no rank process on 4 of 32 nodes: nodes 28-31 (lt-h29, lt-h30, lt-h31, lt-h32)" in verdict.reason
    assert "28 of 32 nodes' agents joined the rendezvous store on node 0" in verdict.reason
    assert (verdict.node, verdict.host) == (28, "lt-h29")


def test_many_missing_nodes_stay_on_one_line() -> None:
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=5, hosts=HOSTS)
    live.apply(Sample(node=5, rank=5, cpu_s=1.0, gpu_util=None, t=0.0))
    verdict = detector.check(live, 200.0)
    assert verdict is not None
    assert "31 of 32 nodes: nodes 0-4,6-31 (lt-h1, lt-h2, lt-h3, lt-h4, lt-h5, lt-h7, lt-h8, lt-h9, ... 23 more)" \
        in verdict.reason
    assert "\n" not in verdict.reason


def test_ranks_on_every_node_that_go_silent_are_still_hung_before_the_first_step() -> None:
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=5, hosts=HOSTS[:2])
    for t in range(0, 200, 2):
        live.apply(Sample(node=0, rank=0, cpu_s=1.0, gpu_util=None, t=float(t)))
        live.apply(Sample(node=1, rank=1, cpu_s=1.0, gpu_util=None, t=float(t)))
    verdict = detector.check(live, 200.0)
    assert verdict is not None and verdict.reason.startswith("hung before the first step")


def test_without_the_nodes_the_detector_makes_no_claim_about_where_the_job_is() -> None:
    live, detector = Liveness(started=0.0), HangDetector(TIMEOUT, max_steps=5)
    verdict = detector.check(live, 200.0)
    assert verdict is not None and verdict.reason.startswith("hung before the first step")


def test_ranges() -> None:
    assert ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert ranges([3]) == "3" and ranges([]) == ""
