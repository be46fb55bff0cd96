"""Which failures count against a host for ``leave_out_failed_nodes``, and what a re-plan changes.

Pure supervisor logic: the re-planner and the backend are stand-ins here; the real thing
(a spare namespace host, real sshd, real torchrun) is in tests/integration/test_ssh_backend.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.backends.failures import Failure, FailureKind
from launcher.errors import PreflightError
from launcher.run.orchestrate import stored_spec
from launcher.run.supervisor import Supervisor
from launcher.spec import JobSpec
from launcher.store.db import Store

CLUSTER = cluster_spec(
    name="three", backend="ssh", python="/usr/bin/python3", workdir="/work",
    nodes=[{"host": f"h{i}", "address": f"10.0.0.{i}", "gpus": 0, "slots": 2} for i in (1, 2, 3)],
)
JOB = JobSpec(name="flaky", entrypoint=["python", "t.py"], batch={"micro_batch": 1},
              resources={"nodes": 2, "nproc_per_node": 1}, restarts=3, leave_out_failed_nodes=True)


class Backend:
    """Stands in for the SSH backend: only whether it was closed matters here."""

    closed = False

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def supervisor(tmp_path: Path) -> Supervisor:
    plan = plan_job(JOB, CLUSTER, "flaky-00000001", rdzv_port=29500)
    store = Store(tmp_path / "home")
    store.create_job(plan, stored_spec(JOB, CLUSTER, run_check=True))
    replans = []

    def replan(current, hosts):
        replans.append(hosts)
        smaller = CLUSTER.model_copy(update={"nodes": [n for n in CLUSTER.nodes if n.host not in hosts]})
        job = JOB.model_copy(update={"leave_out_failed_nodes": False})
        return plan_job(job, smaller, current.job_id, rdzv_port=29500), Backend()

    sup = Supervisor(store, plan, Backend(), restarts=3, replan=replan)
    sup.replans = replans
    return sup


def _exit_on(host_index: int) -> Failure:
    return Failure(node=host_index, host=f"h{host_index + 1}", rank=host_index, exit_code=1)


def test_the_second_failure_of_a_host_re_plans_without_it(supervisor: Supervisor) -> None:
    old_backend = supervisor.backend
    assert supervisor._leave_out_twice_failed(_exit_on(1)) is None and supervisor.replans == []
    assert supervisor._leave_out_twice_failed(_exit_on(1)) is None
    assert supervisor.replans == [frozenset({"h2"})]
    assert [n.host for n in supervisor.plan.nodes] == ["h1", "h3"] and old_backend.closed
    [event] = [e for e in supervisor.store.events(supervisor.plan.job_id) if e["kind"] == "node_left_out"]
    assert event["data"] == {"host": "h2", "nodes": ["h1", "h3"]}


def test_failures_of_different_hosts_do_not_add_up(supervisor: Supervisor) -> None:
    supervisor._leave_out_twice_failed(_exit_on(0))
    supervisor._leave_out_twice_failed(_exit_on(1))
    assert supervisor.replans == []


@pytest.mark.parametrize("failure", [
    Failure(kind=FailureKind.HANG, reason="hung before the first step", stalled_s=300.0),
    Failure(kind=FailureKind.STALL, node=1, rank=1, step=4, stalled_s=300.0, reason="stalled at step 4 on node 1/rank 1"),
    Failure(kind=FailureKind.START, node=0, host="h1", reason="could not start: preparing the nodes failed"),
], ids=["hang-before-first-step", "stall", "start-failure"])
def test_stalls_and_start_failures_do_not_count(supervisor: Supervisor, failure: Failure) -> None:
    for _ in range(3):
        assert supervisor._leave_out_twice_failed(failure) is None
    assert supervisor.replans == []


def test_a_re_plan_that_fails_is_the_reason_and_keeps_the_plan(supervisor: Supervisor) -> None:
    def refuse(current, hosts):
        raise PreflightError("preflight failed on 1 check(s); nothing was started:\n  h3: cannot connect")

    supervisor.replan = refuse
    plan = supervisor.plan
    supervisor._leave_out_twice_failed(_exit_on(1))
    problem = supervisor._leave_out_twice_failed(_exit_on(1))
    assert problem.startswith("h2 failed first in two attempts and was left out, but the job cannot restart")
    assert "h3: cannot connect" in problem and supervisor.plan is plan
