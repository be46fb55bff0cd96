"""A backend is three parts: its capabilities (a frozen value), its planning (pure: the plan's policy) and its
runtime, which needs only preflight, start, run_on_node and close."""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal

import pytest

from launcher.backends import (
    BACKENDS,
    Registered,
    backend_class,
    cluster_models,
    cluster_spec,
    get_backend,
    load_cluster,
    plan_job,
    planning,
)
from launcher.backends.base import Backend, CommandResult, Preflight
from launcher.backends.planning import Capabilities, Planning
from launcher.cli.main import main
from launcher.errors import LaunchError, SpecError
from launcher.spec.base import Strict
from launcher.spec.cluster import ClusterSpec, NodeSpec
from launcher.spec.job import JobSpec

# What each backend could do before the split (its class flags then): the move kept every one.
CAPABILITIES = {
    "local": Capabilities(checks_capacity=False, leases=True, follows=True, fences=True),
    "ssh": Capabilities(leases=True, follows=True, fences=True),
    "ray": Capabilities(places_nodes=True),
    "slurm": Capabilities(places_nodes=True, places_at_start=True, follows=True, verdict_delay_s=4.0),
}
CLUSTERS = {
    "local": {"name": "l", "local": {"slots": 4}},
    "ssh": {"name": "s", "backend": "ssh", "nodes": [{"host": "a", "gpus": 2}, {"host": "b", "gpus": 2}]},
    "ray": {"name": "r", "backend": "ray"},
    "slurm": {"name": "q", "backend": "slurm", "workdir": "/shared", "slurm": {"partition": "p", "gpus_per_node": 2}},
}
JOB = JobSpec(name="j", entrypoint=["python", "t.py"], resources={"nodes": 2, "nproc_per_node": 2})


@pytest.mark.parametrize("name", list(BACKENDS))
def test_each_backends_capabilities_are_those_it_had(name: str) -> None:
    runtime = backend_class(name)
    assert runtime.planning_class.__module__ == f"launcher.backends.{name}.planning"
    assert runtime.capabilities == runtime.planning_class.capabilities == CAPABILITIES[name]
    with pytest.raises(dataclasses.FrozenInstanceError):
        runtime.capabilities.follows = True  # type: ignore[misc]


@pytest.mark.parametrize("name", list(BACKENDS))
def test_the_plan_policy_carries_the_capabilities_the_planner_reads(name: str) -> None:
    cluster = cluster_spec(CLUSTERS[name])
    policy = planning(cluster).plan_policy(JOB)
    can = CAPABILITIES[name]
    assert (policy.places_nodes, policy.checks_capacity, policy.leases) == (can.places_nodes, can.checks_capacity, can.leases)
    assert len(policy.nodes) == 2 and policy.resource_problems == ()


class Minimal(Backend):
    """A backend with only the required methods."""

    name = "minimal"

    def preflight(self, plan):
        return Preflight()

    def start(self, plan, context):
        return plan, []

    def run_on_node(self, plan, index, argv, timeout):
        return CommandResult(0, '{"answer": 1}\n', "")

    def close(self) -> None:
        pass


def test_a_backend_needs_only_preflight_start_run_on_node_and_close() -> None:
    cluster = cluster_spec(CLUSTERS["ssh"])
    backend = Minimal(cluster)
    assert backend.capabilities == Capabilities() and isinstance(backend.planning, Planning)
    assert backend.node_command(None, 0, "facts", {}) == ({"answer": 1}, None)
    assert backend.lease_devices(None, 0) is None and backend.host(None, 1) == "b"
    with pytest.raises(LaunchError, match="cannot follow"):
        backend.follow(None, 0, 0)  # type: ignore[arg-type]

    class NoClose(Backend):
        name = "no-close"
        preflight, start, run_on_node = Minimal.preflight, Minimal.start, Minimal.run_on_node

    with pytest.raises(TypeError, match="close"):
        NoClose(cluster)  # type: ignore[abstract]


class KubeSection(Strict):
    namespace: str = "default"


class KubeCluster(ClusterSpec):
    backend: Literal["kube"]
    kube: KubeSection = KubeSection()


class KubePlanning(Planning[KubeCluster]):
    capabilities: ClassVar[Capabilities] = Capabilities(places_nodes=True)

    def plan_nodes(self, count: int) -> list[NodeSpec]:
        return [NodeSpec(host=f"pod-{i}", address="auto") for i in range(count)]


class KubeBackend(Minimal):
    name = "kube"
    planning_class = KubePlanning


@pytest.fixture
def kube(monkeypatch):
    """A backend registered from outside launcher/ (what docs/ARCHITECTURE.md counts for a new one): one entry."""
    here = __name__
    monkeypatch.setitem(BACKENDS, "kube", Registered(f"{here}:KubeCluster", f"{here}:KubeBackend"))
    cluster_models.cache_clear()
    yield
    cluster_models.cache_clear()


def test_a_new_backend_is_its_package_and_one_registry_line(kube, tmp_path, capsys) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("name: k\nbackend: kube\nkube: {namespace: train}\n")
    cluster = load_cluster(path)
    assert type(cluster) is KubeCluster and cluster.kube.namespace == "train"
    plan = plan_job(JOB, cluster, "k-00000001", rdzv_port=29500)
    assert [node.host for node in plan.nodes] == ["pod-0", "pod-1"]
    assert type(get_backend(cluster)) is KubeBackend
    path.write_text("name: k\nbackend: kube\nkube: {namespce: train}\n")
    with pytest.raises(SpecError, match=r"cluster.yaml:3: kube.namespce: unknown key; did you mean 'namespace'\?"):
        load_cluster(path)
    main(["schema", "cluster"])
    assert '"const": "kube"' in capsys.readouterr().out
