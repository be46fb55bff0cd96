"""Per-node network environment for NCCL and gloo, and where each value came from.

A value pinned in ``cluster.yaml`` wins. Otherwise the value is probed on each
node at launch (the interface that routes to node 0, the InfiniBand HCAs
present), so rank 0's choice is never forced on nodes that differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from launcher.plan.policy import PlanPolicy
from launcher.spec.cluster import ClusterSpec

AUTO = "auto"  # cluster.yaml's word for "probe it" (network.interface, network.ib_hca, a node's address)


class Unprobed(Enum):
    """A value of the plan that a probe on the node gives at launch: never a string, so that no value of the
    user's (``env: {MODE: auto}``) reads as one. The dry run shows it as ``auto``."""

    VALUE = AUTO


UNPROBED = Unprobed.VALUE


@dataclass(frozen=True)
class NodeNetwork:
    """What a node's probe found: its interface and address towards node 0, its HCAs, and the largest memlock
    limit a process there may set (-1: unlimited; bytes: the hard limit where it cannot be raised)."""

    interface: str
    address: str
    ib_hcas: tuple[str, ...] = ()
    memlock_max: int = -1


def network_env(
    cluster: ClusterSpec, policy: PlanPolicy, probe: NodeNetwork | None, master_addr: str
) -> dict[str, tuple[str | Unprobed, str]]:
    """Socket and HCA variables for one node: name -> (value, source).

    Without a probe, auto values are ``UNPROBED`` with the source "probed at
    launch"; a plan holding such a value cannot be launched until resolved.
    """
    env: dict[str, tuple[str | Unprobed, str]] = {}
    interface: tuple[str | Unprobed, str]
    pinned = cluster.network.interface
    if pinned != AUTO:
        interface = (pinned, "cluster.yaml network.interface")
    elif (fixed := policy.pinned_interface) is not None:
        interface = fixed
    elif probe is not None:
        interface = (probe.interface, f"probed: the interface routing to node 0 ({master_addr})")
    else:
        interface = (UNPROBED, "probed at launch: the interface routing to node 0")
    env["NCCL_SOCKET_IFNAME"] = interface
    env["GLOO_SOCKET_IFNAME"] = interface

    hca = cluster.network.ib_hca
    if hca is None or not policy.uses_hcas:
        return env
    if hca != AUTO:
        env["NCCL_IB_HCA"] = (hca, "cluster.yaml network.ib_hca")
    elif probe is None:
        env["NCCL_IB_HCA"] = (UNPROBED, "probed at launch: InfiniBand HCAs on the node")
    elif probe.ib_hcas:
        env["NCCL_IB_HCA"] = (",".join(probe.ib_hcas), "probed: /sys/class/infiniband on the node")
    return env
