"""The Ray backend's protocol, against a fake ``ray`` module: no cluster, no I/O.

Constructing the backend connects to nothing; a node's exit is known whether or not its output was
read; a start that fails on one node (an actor that dies or does not answer) names that node and ends
the agents already asked to start.
"""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.backends.base import StartContext
from launcher.backends.failures import LOST_NODE_EXIT
from launcher.backends.ray.backend import RayBackend, actor_name
from launcher.backends.ray.handle import RayNode
from launcher.errors import NodeStartError, PreflightError
from launcher.spec.cluster import ClusterSpec
from launcher.spec.job import JobSpec


class RayError(Exception):
    pass


class GetTimeoutError(RayError, TimeoutError):
    pass


class Method:
    """An actor method: ``.remote(...)`` gives a reference that ``FakeRay.get`` resolves by calling it."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.calls: list[tuple] = []

    def remote(self, *args):
        self.calls.append(args)
        return lambda: self.answer(*args) if callable(self.answer) else self.answer


class FakeActor:
    def __init__(self, started=4321, code=None) -> None:
        self.start = Method(started)
        self.exit_code = Method(code)
        self.terminate = Method(None)
        self.pull = Method(([], None))


def raises(error: Exception):
    def answer(*args):
        raise error
    return answer


class FakeRay:
    exceptions = SimpleNamespace(RayError=RayError, GetTimeoutError=GetTimeoutError)

    def __init__(self, actors: dict[str, FakeActor] | None = None) -> None:
        self.actors = actors or {}
        self.timeouts: list[float | None] = []

    def get(self, ref, timeout=None):
        self.timeouts.append(timeout)
        return ref()

    def get_actor(self, name, namespace=None):
        if name not in self.actors:
            raise ValueError(name)
        return self.actors[name]


def ray_cluster(address: str = "127.0.0.1:6379") -> ClusterSpec:
    return cluster_spec(name="r", backend="ray", ray={"address": address}, python="python3")


def test_creating_the_backend_connects_to_nothing_the_first_use_does():
    with socket.socket() as closed:  # bound, never listening: a connection to it is refused
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
        backend = RayBackend(ray_cluster(address))  # used to connect here, and raise
        with pytest.raises(PreflightError, match=f"cannot reach the Ray cluster at '{address}'"):
            _ = backend.ray
    backend.close()  # never connected: nothing to release


def test_a_node_exit_is_known_without_its_output_being_read():
    ray = FakeRay()
    assert RayNode(0, FakeActor(code=None), 10, ray).poll() is None
    assert RayNode(0, FakeActor(code=0), 10, ray).poll() == 0
    assert RayNode(0, FakeActor(code=3), 10, ray).poll() == 3
    assert RayNode(0, FakeActor(code=128 + 9), 10, ray).poll() == -9  # the agent's command died of SIGKILL


def test_a_node_whose_actor_died_polls_as_lost_and_says_why():
    actor = FakeActor()
    actor.exit_code = Method(raises(RayError("The actor died unexpectedly\nmore")))
    node = RayNode(1, actor, 10, FakeRay())
    assert node.poll() == LOST_NODE_EXIT
    assert node.lost_reason == "node 1 lost: its Ray agent died: The actor died unexpectedly"


def test_a_slow_actor_is_not_taken_for_an_exit():
    actor = FakeActor()
    actor.exit_code = Method(raises(GetTimeoutError("slow")))
    node = RayNode(0, actor, 10, FakeRay())
    assert node.poll() is None and node.lost_reason is None


def two_node_plan(cluster: ClusterSpec):
    job = JobSpec(name="unit", entrypoint=["python", "t.py"], resources={"nodes": 2, "nproc_per_node": 1},
                  batch={"micro_batch": 1})
    return plan_job(job, cluster, "unit-00000001", rdzv_port=29500)


@pytest.mark.parametrize("failure, said", [
    (RayError("The actor died because its node died"), "node 1 (ray-node-1): its Ray actor failed: The actor died"),
    (GetTimeoutError("timed out"), "node 1 (ray-node-1): its Ray actor did not start the agent within 60 s"),
])
def test_a_start_that_fails_on_node_1_names_it_and_ends_node_0s_agent(monkeypatch, tmp_path, failure, said):
    cluster = ray_cluster()
    plan = two_node_plan(cluster)
    first, second = FakeActor(started=111), FakeActor()
    second.start = Method(raises(failure))
    ray = FakeRay({actor_name(plan.job_id, 0): first, actor_name(plan.job_id, 1): second})
    monkeypatch.setattr(RayBackend, "_connect", lambda self: ray)
    backend = RayBackend(cluster)

    with pytest.raises(NodeStartError) as caught:
        backend.start(plan, StartContext(run_dir=tmp_path, secrets={"TOKEN": "s"}, grace=2.0))

    assert said in str(caught.value) and caught.value.node == 1
    assert first.terminate.calls == [(2.0,)] and second.terminate.calls == [(2.0,)]
    assert None not in ray.timeouts  # every wait on the cluster is bounded


def test_the_agent_request_and_secrets_go_to_the_actor_as_stdin_not_argv(monkeypatch, tmp_path):
    cluster = ray_cluster()
    plan = two_node_plan(cluster)
    actors = {actor_name(plan.job_id, i): FakeActor(started=100 + i) for i in range(2)}
    monkeypatch.setattr(RayBackend, "_connect", lambda self: FakeRay(actors))
    _, handles = RayBackend(cluster).start(plan, StartContext(run_dir=tmp_path, secrets={"TOKEN": "s3cret"}, grace=2.0))

    assert [h.pid for h in handles] == [100, 101]
    argv, tag, stdin, cwd, unattended_s, grace = actors[actor_name(plan.job_id, 1)].start.calls[0]
    assert (unattended_s, grace) == (plan.unattended_s, 2.0)  # the actor ends the job once nobody pulls that long
    assert argv[-2:] == ["agent", "-"] and not any("s3cret" in arg or plan.job_id in arg for arg in argv)
    request, secrets = stdin.decode().splitlines()
    assert '"node":1' in request and secrets == '{"TOKEN": "s3cret"}'
    assert tag == {"LAUNCH_JOB_ID": plan.job_id, "LAUNCH_NODE": "1"}
