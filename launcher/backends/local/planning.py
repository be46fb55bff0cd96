"""The local backend's capabilities and planning: every node is this machine, sized to its CPUs, GPUs and memory."""

from __future__ import annotations

import os
import sys
from typing import ClassVar

from launcher.backends.local.spec import LocalCluster
from launcher.backends.planning import Capabilities, Planning
from launcher.plan.planner import Plan
from launcher.spec.cluster import NodeSpec
from launcher.spec.job import JobSpec


class LocalPlanning(Planning[LocalCluster]):
    #: every local node is this machine: check_host_memory counts all their processes together
    capabilities: ClassVar[Capabilities] = Capabilities(checks_capacity=False, leases=True, follows=True, fences=True)

    def resolve_defaults(self) -> LocalCluster:
        """This machine as it is: its usable CPUs as slots, its GPUs, the current directory, this Python."""
        from launcher.backends.local import host as localhost

        cluster = self.cluster
        local = cluster.local.model_copy(update={
            "slots": cluster.local.slots or localhost.cpu_slots(),
            "gpus": localhost.gpu_count() if cluster.local.gpus is None else cluster.local.gpus,
        })
        return cluster.model_copy(update={"local": local, "workdir": cluster.workdir or os.getcwd(),
                                          "python": cluster.python or sys.executable})

    def check_host_memory(self, job: JobSpec, plan: Plan) -> None:
        from launcher.backends.local import host as localhost

        localhost.check_fits(job, self.cluster, plan)

    def plan_nodes(self, count: int) -> list[NodeSpec]:
        local = NodeSpec(host="localhost", address="127.0.0.1", gpus=self.cluster.local.gpus or 0,
                         slots=self.cluster.local.slots)
        return [local] * count

    def default_python(self) -> str:
        return self.cluster.python or sys.executable

    def pinned_interface(self) -> tuple[str, str]:
        return "lo", "local backend: every rank on this machine"

    def uses_hcas(self) -> bool:
        return False

    def resource_problems(self, job: JobSpec) -> list[str]:
        return []

    def check_hosts(self) -> list[str]:
        return ["localhost"]

    def bandwidth_nodes(self) -> int:
        return 2  # two local nodes: the all-reduce crosses a process boundary, as between hosts
