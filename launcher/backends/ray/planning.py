"""The Ray backend's capabilities and planning: Ray places alike bundles, one a node, at preflight."""

from __future__ import annotations

from typing import ClassVar

from launcher.backends.planning import Capabilities, Planning
from launcher.backends.ray.spec import RayCluster
from launcher.errors import LaunchError
from launcher.plan.netenv import AUTO
from launcher.spec.cluster import NodeSpec
from launcher.spec.job import JobSpec


class RayPlanning(Planning[RayCluster]):
    capabilities: ClassVar[Capabilities] = Capabilities(places_nodes=True)

    def plan_nodes(self, count: int) -> list[NodeSpec]:
        return [NodeSpec(host=f"ray-node-{i}", address=AUTO) for i in range(count)]

    def default_python(self) -> str:
        return self.cluster.python or "(the Python of the Ray workers)"

    def resource_problems(self, job: JobSpec) -> list[str]:
        problems = []
        if job.resources.nproc_per_node == "auto":
            problems.append("resources.nproc_per_node: 'auto' needs nodes whose GPUs or slots the cluster spec lists "
                            "(ssh, local); Ray places alike bundles: give a number")
        if job.elastic is None:
            return problems
        return [*problems, "elastic: not on Ray: the Ray backend places a job's nodes once (a STRICT_SPREAD placement group "
                "of resources.nodes bundles, held for the job's life), so a restart cannot go on with fewer nodes; "
                "drop elastic, or run on ssh, slurm or local"]

    def check_hosts(self) -> list[str]:
        raise LaunchError("`launch check` needs fixed nodes (local or ssh); on Ray, submit a job and read `launch status`")
