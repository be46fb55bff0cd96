"""The plan: a pure function from (job, cluster, job id) to a frozen value.

No sockets, clocks or environment reads happen here: what the plan needs
from the world (the rendezvous port, probed network facts, concrete nodes
from a Ray placement) is passed in. Backends execute a plan unchanged.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from launcher import commands
from launcher.batch import BatchPlan, resolve_batch
from launcher.errors import PlanError
from launcher.fit import memory_fit, misfit_problem
from launcher.netenv import AUTO, NodeNetwork, network_env
from launcher.spec.cluster import ClusterSpec, NodeSpec
from launcher.spec.job import JobSpec
from launcher.strategies import get_strategy

LOG_PREFIX_TEMPLATE = "[${rank}]:"


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class Rendezvous(Frozen):
    backend: str = "c10d"
    id: str
    host: str
    port: int

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


class NodePlan(Frozen):
    """One node of the run: where it is, what it runs, with which added environment."""

    index: int
    host: str
    address: str
    nproc: int
    gpus: int
    argv: tuple[str, ...]
    env: dict[str, str]
    env_sources: dict[str, str]
    cwd: str


class Plan(Frozen):
    """Everything a backend needs to start a job, and everything a user checks in a dry-run."""

    job_id: str
    job_name: str
    backend: str
    cluster_name: str
    launcher: str
    strategy: str | None
    precision: str
    dist_backend: str
    nnodes: int
    nproc_per_node: int
    world_size: int
    batch: BatchPlan
    max_steps: int
    rendezvous: Rendezvous
    nodes: tuple[NodePlan, ...]
    secrets: tuple[str, ...]
    ds_config: dict | None = None
    memory: dict | None = None

    def unresolved(self) -> list[str]:
        """Values still waiting for a probe (``auto``), as ``node N: NAME``."""
        return [f"node {n.index}: {k}" for n in self.nodes for k, v in n.env.items() if v == AUTO]


def make_plan(
    job: JobSpec,
    cluster: ClusterSpec,
    job_id: str,
    *,
    rdzv_port: int,
    nodes: list[NodeSpec] | None = None,
    probes: dict[int, NodeNetwork] | None = None,
    ds_config: dict | None = None,
    check_fit: bool = True,
) -> Plan:
    """Plan ``job`` on ``cluster``. Every job/cluster mismatch is reported at once.

    ``nodes`` overrides the cluster's node list (a Ray placement); ``probes``
    resolves auto network values per node index; ``ds_config`` is the
    DeepSpeed config for DeepSpeed strategies. With ``check_fit`` a recipe whose
    strategy does not fit the cluster's GPU memory is a planning problem.
    """
    chosen = _choose_nodes(job, cluster, nodes)
    world_size = job.resources.nodes * job.resources.nproc_per_node
    problems = _fit_problems(job, cluster, chosen, nodes is not None)
    try:
        batch = resolve_batch(job.batch, world_size)
    except PlanError as exc:
        problems.append(exc.message)
        batch = None
    memory = None
    if batch is not None and job.recipe is not None:
        gpu_gb = cluster.gpu.memory_gb if all(node.gpus for node in chosen) else None
        memory = memory_fit(job, batch.micro_batch, len(chosen), job.resources.nproc_per_node, gpu_gb)
        problem = misfit_problem(memory) if check_fit else None
        if problem:
            problems.append(problem)
    if problems:
        raise PlanError(f"job '{job.name}' does not fit cluster '{cluster.name}':\n" + "\n".join(f"  {p}" for p in problems))

    probes = probes or {}
    master = _address(chosen[0], probes.get(0))
    rendezvous = Rendezvous(id=job_id, host=master, port=rdzv_port)
    gpus = [node.gpus for node in chosen]
    program = commands.program_args(job, batch, ds_config)
    python = cluster.python or "python3"
    cwd = cluster.workdir or "."
    node_plans = []
    for index, node in enumerate(chosen):
        address = _address(node, probes.get(index))
        if job.launcher == "deepspeed":
            argv = commands.deepspeed_argv(
                python, [job.resources.nproc_per_node] * len(chosen), index, master, rdzv_port, program
            )
        else:
            argv = commands.torchrun_argv(
                python, len(chosen), job.resources.nproc_per_node, index, rendezvous.endpoint, job_id, address, program
            )
        env = _node_env(job, cluster, job_id, index, node, probes.get(index), master)
        node_plans.append(
            NodePlan(
                index=index,
                host=node.host,
                address=address,
                nproc=job.resources.nproc_per_node,
                gpus=node.gpus,
                argv=tuple(argv),
                env={k: v for k, (v, _) in env.items()},
                env_sources={k: s for k, (_, s) in env.items()},
                cwd=cwd,
            )
        )
    return Plan(
        job_id=job_id,
        job_name=job.name,
        backend=cluster.backend,
        cluster_name=cluster.name,
        launcher=job.launcher,
        strategy=job.strategy if job.recipe else None,
        precision=job.precision,
        dist_backend="nccl" if all(gpus) else "gloo",
        nnodes=len(chosen),
        nproc_per_node=job.resources.nproc_per_node,
        world_size=world_size,
        batch=batch,
        max_steps=job.max_steps,
        rendezvous=rendezvous,
        nodes=tuple(node_plans),
        secrets=tuple(job.secrets),
        ds_config=ds_config,
        memory=memory,
    )


def _choose_nodes(job: JobSpec, cluster: ClusterSpec, nodes: list[NodeSpec] | None) -> list[NodeSpec]:
    if nodes is not None:
        return list(nodes)[: job.resources.nodes]
    if cluster.backend == "local":
        local = NodeSpec(host="localhost", address="127.0.0.1", gpus=cluster.local.gpus, slots=cluster.local.slots)
        return [local] * job.resources.nodes
    if cluster.backend == "ray":
        return [NodeSpec(host=f"ray-node-{i}", address=AUTO) for i in range(job.resources.nodes)]
    return cluster.nodes[: job.resources.nodes]


def _fit_problems(job: JobSpec, cluster: ClusterSpec, chosen: list[NodeSpec], placed: bool) -> list[str]:
    problems = []
    wanted = job.resources.nodes
    if cluster.backend == "ssh" and not placed and wanted > len(cluster.nodes):
        problems.append(
            f"resources.nodes: the job asks for {wanted} nodes; cluster '{cluster.name}' lists {len(cluster.nodes)}"
        )
    if job.leave_out_failed_nodes:
        if cluster.backend != "ssh":
            problems.append(
                f"leave_out_failed_nodes: needs an ssh cluster (a left-out node is a host of its node list); "
                f"cluster '{cluster.name}' is {cluster.backend}"
            )
        elif len(cluster.nodes) <= wanted:
            problems.append(
                f"leave_out_failed_nodes: cluster '{cluster.name}' lists {len(cluster.nodes)} nodes and the job uses "
                f"{wanted}: no spare node to restart on; list more nodes or drop the option"
            )
    nproc = job.resources.nproc_per_node
    if job.recipe is not None:
        problems += get_strategy(job.strategy).resource_problems(wanted, nproc)
    if cluster.backend == "ray" and not placed:
        return problems
    for index, node in enumerate(chosen):
        if nproc > node.capacity:
            what = f"{node.gpus} GPUs" if node.gpus else f"{node.capacity} CPU slots"
            problems.append(
                f"resources.nproc_per_node: {nproc} processes on node {index} ({node.host}), which has {what}"
            )
    return problems


def _address(node: NodeSpec, probe: NodeNetwork | None) -> str:
    if node.address and node.address != AUTO:
        return node.address
    if probe is not None:
        return probe.address
    return node.address or node.host


def _node_env(
    job: JobSpec, cluster: ClusterSpec, job_id: str, index: int, node: NodeSpec, probe: NodeNetwork | None, master: str
) -> dict[str, tuple[str, str]]:
    env: dict[str, tuple[str, str]] = {
        "LAUNCH_JOB_ID": (job_id, "launch: tags every process of the job"),
        "LAUNCH_NODE": (str(index), "launch: node index"),
        "PYTHONUNBUFFERED": ("1", "launch: logs stream as they are written"),
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": (LOG_PREFIX_TEMPLATE, "launch: rank prefix on every line"),
    }
    if node.gpus == 0:
        env["OMP_NUM_THREADS"] = ("1", "launch: one thread per CPU rank (torchrun's default, made explicit)")
    if job.uses_deepspeed and node.gpus == 0:
        env["DS_ACCELERATOR"] = ("cpu", "launch: DeepSpeed on CPU ranks (gloo)")
    env.update(network_env(cluster, probe, master))
    for key, value in job.env.items():
        env[key] = (value, "job env")
    return env
