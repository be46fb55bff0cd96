"""The Slurm backend's capabilities and planning: Slurm allocates alike nodes when the job leaves its queue."""

from __future__ import annotations

import sys
from typing import ClassVar

from launcher.backends.planning import Capabilities, Planning
from launcher.backends.slurm import commands as cli
from launcher.backends.slurm.spec import SlurmCluster
from launcher.errors import LaunchError
from launcher.plan.netenv import AUTO
from launcher.spec.cluster import NodeSpec
from launcher.spec.job import JobSpec

CHECK_NODES = 16  # `launch check` probes at most this many of the partition's nodes


def required(value: str | None, key: str) -> str:
    """A cluster key backend 'slurm' requires (the cluster spec checks it when loaded)."""
    if value is None:
        raise LaunchError(f"cluster spec: backend 'slurm' needs '{key}'")
    return value


class SlurmPlanning(Planning[SlurmCluster]):
    #: a node whose slurmd died: Slurm ends the other nodes' steps (their exits come at once), while the lost
    #: node's own verdict waits for squeue to say NODE_FAIL and sinfo to say which node is down (verdict_delay_s)
    capabilities: ClassVar[Capabilities] = Capabilities(places_nodes=True, places_at_start=True, follows=True,
                                                        verdict_delay_s=4.0)

    def plan_nodes(self, count: int) -> list[NodeSpec]:
        gpus = self.cluster.slurm.gpus_per_node
        return [NodeSpec(host=f"slurm-node-{i}", address=AUTO, gpus=gpus) for i in range(count)]

    def resource_problems(self, job: JobSpec) -> list[str]:
        gpus, nproc = self.cluster.slurm.gpus_per_node, job.resources.nproc_per_node
        if nproc == "auto":
            return ["resources.nproc_per_node: 'auto' needs nodes whose GPUs or slots the cluster spec lists (ssh, "
                    "local); Slurm allocates alike nodes: give a number (slurm.gpus_per_node on GPU nodes)"]
        if gpus and nproc > gpus:
            return [f"resources.nproc_per_node: {nproc} processes per node, but the job asks Slurm for {gpus} GPUs "
                    "per node (slurm.gpus_per_node)"]
        return []

    def check_hosts(self) -> list[str]:
        """`launch check` probes the partition's nodes in service (CHECK_NODES at most), each through its own
        ``srun``, which may wait in the queue."""
        partition = required(self.cluster.slurm.partition, "slurm.partition")
        names = cli.nodes_in_service(partition)[:CHECK_NODES]
        if not names:
            raise LaunchError(f"partition '{partition}' has no node in service (idle, mixed or "
                              f"allocated): `sinfo -p {partition}` says why")
        sys.stderr.write(f"launch check: each node is probed by `srun --partition={partition} "
                         f"--nodelist=NODE` (it may wait in Slurm's queue); nodes: {', '.join(names)}\n")
        return names

    def bandwidth_nodes(self) -> int:
        return len(cli.nodes_in_service(required(self.cluster.slurm.partition, "slurm.partition"))[:CHECK_NODES])
