"""Which transport NCCL chose on each node of a job (its ``nccl`` events, filed from the node agents' ``@nccl``
frames), and the warning of a node planned for InfiniBand whose NCCL fell back to TCP sockets: the job runs,
several times slower, and nothing else says so. `launch status` and `launch check` show both.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from launcher.node.nccl import Transport

NCCL_EVENT = "nccl"


@dataclass(frozen=True)
class NodeTransport:
    """What NCCL chose on one node, and the HCAs the plan gave it (``NCCL_IB_HCA``; None: not planned for IB)."""

    node: int
    host: str
    transport: Transport
    planned_hcas: str | None

    @property
    def fell_back(self) -> bool:
        return self.planned_hcas is not None and self.transport.sockets

    def warning(self) -> str | None:
        if not self.fell_back:
            return None
        on = f" on {','.join(self.transport.devices)}" if self.transport.devices else ""
        return (f"node {self.node} ({self.host}) was planned for InfiniBand (NCCL_IB_HCA={self.planned_hcas}) but "
                f"NCCL chose TCP sockets{on}: several times slower. In a container: does it see /dev/infiniband "
                "(`launch submit --dry-run` shows what launch adds), with IPC_LOCK and memlock? Else see NCCL's "
                "INIT lines in the node's run directory (nccl.*.log)")

    def as_json(self) -> dict[str, Any]:
        return {"node": self.node, "host": self.host, **self.transport.as_json(), "planned_hcas": self.planned_hcas,
                "warning": self.warning()}


def planned_hcas(plan: Any) -> dict[int, str]:
    """Per node index of a stored plan (its JSON data): the NCCL_IB_HCA it was given, where it was given one."""
    nodes = plan.get("nodes") if isinstance(plan, dict) else None
    out = {}
    for n in nodes if isinstance(nodes, list) else []:
        env = n.get("env") if isinstance(n, dict) else None
        index, hcas = n.get("index") if isinstance(n, dict) else None, env.get("NCCL_IB_HCA") if isinstance(env, dict) else None
        if type(index) is int and isinstance(hcas, str) and hcas:
            out[index] = hcas
    return out


def node_transports(plan: Any, events: Iterable[dict[str, Any]]) -> list[NodeTransport]:
    """The last transport each node reported, in node order, with what its plan expected."""
    hcas = planned_hcas(plan)
    last: dict[int, NodeTransport] = {}
    for event in events:
        data = event.get("data")
        if event.get("kind") != NCCL_EVENT or not isinstance(data, dict):
            continue
        node, host, transport = data.get("node"), data.get("host"), Transport.from_json(data)
        if type(node) is int and isinstance(host, str) and transport is not None:
            last[node] = NodeTransport(node, host, transport, hcas.get(node))
    return [last[node] for node in sorted(last)]


def fallback_warnings(plan: Any, events: Iterable[dict[str, Any]]) -> list[str]:
    """A warning for each node planned for InfiniBand whose NCCL chose sockets."""
    return [text for t in node_transports(plan, events) if (text := t.warning())]
