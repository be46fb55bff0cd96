"""The SSH backend's capabilities and planning: the cluster's listed nodes, the first ones a job asks for."""

from __future__ import annotations

from typing import ClassVar

from launcher.backends.planning import Capabilities, Planning
from launcher.backends.ssh.spec import SSHCluster


class SSHPlanning(Planning[SSHCluster]):
    capabilities: ClassVar[Capabilities] = Capabilities(leases=True, follows=True, fences=True)

    def spare_nodes(self, wanted: int) -> int:
        return len(self.cluster.nodes) - wanted
