"""What a backend is (a frozen ``Capabilities`` value) and what it decides before anything runs (``Planning``).

``Planning`` is pure: no connection, no process; bound to one cluster. The planner reads only the
``PlanPolicy`` it makes; `launch check`, restarts and the defaults of a cluster read the rest. A
backend's runtime (``launcher.backends.base.Backend``) names its planning class and has its capabilities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Generic, TypeVar

from launcher.plan.planner import Plan
from launcher.plan.policy import PlanPolicy
from launcher.spec.cluster import ClusterSpec, NodeSpec
from launcher.spec.job import JobSpec

C = TypeVar("C", bound=ClusterSpec)


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, the same for every cluster of it."""

    #: nodes are placed by the backend at launch (Ray, Slurm): the plan holds placeholders until then
    places_nodes: bool = False
    #: the nodes are known only inside ``start`` (a scheduler's allocation): preflight at submit checks what the
    #: scheduler answers at once, the nodes' own checks run in ``start`` (re-planned through ``StartContext.place``)
    places_at_start: bool = False
    #: whether a node's GPUs or slots bound the processes per node (off where one machine hosts every node)
    checks_capacity: bool = True
    #: each node's agent leases the GPUs or slots it uses (``Backend.lease_devices``; docs/LEASES.md)
    leases: bool = False
    #: ``Backend.follow`` works: a node's journal can be followed again (after a broken stream, or by `launch attach`)
    follows: bool = False
    #: the nodes keep a supervisor generation (``Backend.fence``) that ``follow`` and the agents check, and the job's
    #: record (``Backend.job_record``): `launch attach --takeover` and `--cluster` work
    fences: bool = False
    #: seconds more than the supervisor's own settle time (``SETTLE_S``) that the other nodes' verdicts may take to
    #: arrive after a node's failure, before the first failure is chosen: an engine that learns of a lost node
    #: by polling (Slurm: squeue and sinfo, at most once a second) takes longer than a node agent's exit
    verdict_delay_s: float = 0.0


class Planning(Generic[C]):
    """A backend's choices for one cluster, before anything runs. The defaults suit listed nodes (ssh)."""

    capabilities: ClassVar[Capabilities] = Capabilities()

    def __init__(self, cluster: C) -> None:
        self.cluster = cluster

    def plan_policy(self, job: JobSpec) -> PlanPolicy:
        """This backend's choices for planning ``job`` on the cluster, as the value the planner reads."""
        can = self.capabilities
        return PlanPolicy(
            nodes=tuple(self.plan_nodes(job.resources.nodes)),
            python=self.default_python(),
            resource_problems=tuple(self.resource_problems(job)),
            spare_nodes=self.spare_nodes(job.resources.nodes),
            places_nodes=can.places_nodes,
            checks_capacity=can.checks_capacity,
            pinned_interface=self.pinned_interface(),
            uses_hcas=self.uses_hcas(),
            leases=can.leases,
        )

    def plan_nodes(self, count: int) -> list[NodeSpec]:
        """The nodes a job of ``count`` nodes is planned on (placeholders where placed later)."""
        return list(self.cluster.nodes[:count])

    def default_python(self) -> str:
        """The interpreter the nodes run when the cluster spec names none."""
        return self.cluster.python or "python3"

    def pinned_interface(self) -> tuple[str, str] | None:
        """(interface, where it comes from) when the backend fixes it, else None (pinned in the spec, or probed)."""
        return None

    def uses_hcas(self) -> bool:
        """Whether InfiniBand HCAs are probed and set on this backend's nodes."""
        return True

    def resource_problems(self, job: JobSpec) -> list[str]:
        """What the cluster can never give this job (checked at plan time)."""
        if self.capabilities.places_nodes:
            return []
        wanted, cluster = job.resources.nodes, self.cluster
        if wanted > len(cluster.nodes):
            return [f"resources.nodes: the job asks for {wanted} nodes; cluster '{cluster.name}' lists {len(cluster.nodes)}"]
        return []

    def spare_nodes(self, wanted: int) -> int | None:
        """How many nodes beyond ``wanted`` a restart could move to (None: this backend cannot leave nodes out)."""
        return None

    def resolve_defaults(self) -> C:
        """The cluster spec with what this backend fills in when the spec leaves it out."""
        return self.cluster

    def check_host_memory(self, job: JobSpec, plan: Plan) -> None:
        """Refuse (PlanError) a job whose processes cannot fit the nodes' host memory, when the backend knows it
        before launch (most cannot: nothing to do)."""

    def check_hosts(self) -> list[str]:
        """The nodes `launch check` covers, by host name (node ``index`` of ``run_on_node(None, index, ...)``)."""
        return [node.host for node in self.cluster.nodes]

    def bandwidth_nodes(self) -> int:
        """How many nodes `launch check`'s all-reduce job runs on."""
        return len(self.check_hosts())
