"""The plan: a pure function from (job, cluster, job id) to a frozen value.

No sockets, clocks or environment reads happen here: what the plan needs
from the world (the rendezvous port, probed network facts, concrete nodes
from a Ray placement) is passed in. Backends execute a plan unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from launcher.catalog.strategies import get_strategy
from launcher.errors import PlanError
from launcher.node import rankrelay, torchelastic
from launcher.plan import commands, containers
from launcher.plan.batch import BatchPlan, resolve_batch
from launcher.plan.elastic import Elastic, elastic_env, elastic_plan
from launcher.plan.fit import MemoryFit, memory_fit, misfit_problem
from launcher.plan.netenv import AUTO, NodeNetwork, Unprobed, network_env
from launcher.plan.policy import PlanPolicy, capacity_problems, node_procs
from launcher.plan.uneven import uneven_warnings
from launcher.spec.cluster import ClusterSpec, NodeSpec
from launcher.spec.container import ContainerSpec, Runtime, effective_container
from launcher.spec.job import JobSpec

LOG_PREFIX_TEMPLATE = rankrelay.PREFIX.format(rank="${rank}")  # torchrun's tee puts it before each rank's line
RUN_DIR_TOKEN = "${LAUNCH_RUN_DIR}"  # the node agent puts the ranks' directory (in the node's run directory) in its place
DS_CONFIG_FILE = "ds_config.json"
LEASED_GPU_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")  # the node agent's, for the GPUs it leased
FLIGHT_RECORDER_EVENTS = "2000"
STEP_HOOKS = "LAUNCH_AUTO_METRICS"  # the ranks' step hooks report every N steps (docs: README, metrics.auto)
NCCL_DEBUG_ENV = frozenset({"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"})
NCCL_DEBUG_FILE = "nccl.%h.%p.log"  # NCCL's own placeholders: host, pid (launcher.node.nccl reads them)


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class Rendezvous(Frozen):
    """How the nodes' launchers find each other: ``static`` (each node told its rank; node 0 hosts the
    store) or ``c10d`` (rendezvous rounds, for elastic jobs); see ``rendezvous_backend``."""

    backend: str = commands.C10D
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
    #: the global rank of the node's first process (the processes of the nodes before it)
    first_rank: int = 0
    gpus: int
    argv: tuple[str, ...]
    env: dict[str, str]
    #: the environment's names whose values a probe on the node gives at launch (not in ``env`` until then)
    unprobed: tuple[str, ...] = ()
    env_sources: dict[str, str]
    cwd: str
    files: dict[str, tuple[str, str]] = {}
    cleanup: tuple[tuple[str, ...], ...] = ()
    env_prefix: str = ""
    #: the node agent writes launch's step hooks for the ranks (``metrics.auto``; ``launcher.node.stephooks``)
    step_hooks: bool = False
    #: what the node's container gets for what the node has (network, IPC, GPUs, InfiniBand), with the reasons
    run_options: tuple[containers.RunOption, ...] = ()


class Plan(Frozen):
    """Everything a backend needs to start a job, and everything a user checks in a dry-run."""

    job_id: str
    job_name: str
    backend: str
    cluster_name: str
    launcher: str
    strategy: str | None
    precision: str | None  # None: an entrypoint's own (the spec said none; its DeepSpeed config may say bf16)
    dist_backend: str
    nnodes: int
    nproc_per_node: int
    world_size: int
    batch: BatchPlan | None
    #: the steps the job is expected to take (None: an entrypoint that did not say)
    max_steps: int | None
    rendezvous: Rendezvous
    nodes: tuple[NodePlan, ...]
    secrets: tuple[str, ...]
    python: str
    container: ContainerSpec | None = None
    ds_config: dict | None = None
    memory: MemoryFit | None = None
    elastic: Elastic | None = None
    #: what may break on this job's nodes (different process counts), shown with the plan
    warnings: tuple[str, ...] = ()
    #: seconds the node agents run on with no supervisor in contact (None: to the end); docs/JOURNALS.md
    unattended_s: float | None = 1800.0
    #: when another job holds the devices (local, ssh: docs/LEASES.md): 'fail' (exit 3) or 'wait' (QUEUED)
    queue: str = "fail"
    #: GPUs used by processes launch did not start may be leased
    allow_shared_gpus: bool = False
    #: each node's agent leases the GPUs (or slots) its ranks use, the lowest free when it starts (docs/LEASES.md)
    leases: bool = False

    def unresolved(self) -> list[str]:
        """Values still waiting for a probe, as ``node N: NAME``."""
        return [f"node {n.index}: {k}" for n in self.nodes for k in n.unprobed]


def make_plan(
    job: JobSpec,
    cluster: ClusterSpec,
    job_id: str,
    *,
    policy: PlanPolicy,
    rdzv_port: int,
    nodes: list[NodeSpec] | None = None,
    probes: dict[int, NodeNetwork] | None = None,
    python: str | None = None,
    ds_config: dict | None = None,
    check_fit: bool = True,
    resumed: tuple[int, int] | None = None,
) -> Plan:
    """Plan ``job`` on ``cluster`` under a backend's ``policy``. Every job/cluster mismatch is reported at once.

    ``nodes`` overrides the backend's choice of nodes (a placement), ``probes`` resolves auto
    network values per node index, ``python`` is the interpreter the nodes run (found by
    preflight), ``ds_config`` the DeepSpeed config. With ``check_fit`` a recipe whose strategy
    does not fit the cluster's GPU memory is a planning problem. ``resumed``: (attempt, previous world
    size) of an elastic job's re-plan for a restart (told to the ranks).

    The steps: choose the nodes, check that the job fits them (batch and memory included),
    settle what every node shares (rendezvous, program, container, files), then plan each node.
    """
    chosen = _choose_nodes(job, policy, nodes)
    procs = node_procs(job.resources.nproc_per_node, chosen)
    batch, memory = _check_fit(job, cluster, policy, chosen, procs, placed=nodes is not None, check_fit=check_fit)
    elastic = elastic_plan(job, procs, batch, resumed)
    shared = _shared(job, cluster, policy, job_id, chosen, probes or {}, rdzv_port, python, ds_config, batch, elastic,
                     procs)
    return Plan(
        job_id=job_id,
        job_name=job.name,
        backend=cluster.backend,
        cluster_name=cluster.name,
        launcher=job.launcher,
        strategy=job.strategy if job.recipe else None,
        precision=job.precision if job.recipe or "precision" in job.model_fields_set else None,  # else the program's
        dist_backend="nccl" if all(node.gpus for node in chosen) else "gloo",
        nnodes=len(chosen),
        nproc_per_node=min(procs),
        world_size=sum(procs),
        batch=batch,
        max_steps=job.total_steps,
        rendezvous=shared.rendezvous,
        nodes=tuple(_node_plan(shared, index, node) for index, node in enumerate(chosen)),
        secrets=tuple(job.secrets),
        python=shared.python,
        container=shared.container,
        ds_config=ds_config,
        memory=memory,
        elastic=elastic,
        warnings=(*restart_warnings(job), *uneven_warnings(job, procs, ds_config)),
        unattended_s=job.watch.unattended_timeout,
        queue=job.queue,
        allow_shared_gpus=job.resources.allow_shared_gpus,
        leases=policy.leases,
    )


def restart_warnings(job: JobSpec) -> list[str]:
    """What a restart of a recipe job redoes when it has no checkpoint to resume from (an entrypoint keeps its own)."""
    if not job.restarts or job.recipe is None or job.checkpoint.every_steps:
        return []
    where = ("checkpoint.dir is not set" if job.checkpoint.dir is None
             else "checkpoint.every_steps is 0 (one checkpoint, at the end)")
    return [f"restarts: {job.restarts}, but {where}: a restart begins again at step 0 and redoes every step done "
            "before the failure; checkpoint: {dir: DIR, every_steps: N} makes it redo at most N steps"]


def _choose_nodes(job: JobSpec, policy: PlanPolicy, placed: list[NodeSpec] | None) -> list[NodeSpec]:
    """The job's nodes: the placement's first ``resources.nodes`` when given, else the backend's choice."""
    return list(placed)[: job.resources.nodes] if placed is not None else list(policy.nodes)


def _check_fit(
    job: JobSpec, cluster: ClusterSpec, policy: PlanPolicy, chosen: list[NodeSpec], procs: list[int], *, placed: bool,
    check_fit: bool,
) -> tuple[BatchPlan | None, MemoryFit | None]:
    """The batch arithmetic and the memory estimate; PlanError listing every problem found on the way."""
    world_size = sum(procs)
    problems = _fit_problems(job, cluster, policy, chosen, procs, placed)
    batch = None
    if job.batch is not None:
        try:
            batch = resolve_batch(job.batch, world_size)
        except PlanError as exc:
            problems.append(exc.message)
    memory = None
    if batch is not None and job.recipe is not None:
        gpu_gb = cluster.gpu.memory_gb if all(node.gpus for node in chosen) else None
        memory = memory_fit(job, batch.micro_batch, len(chosen), max(procs), gpu_gb)
        problem = misfit_problem(memory) if check_fit else None
        if problem:
            problems.append(problem)
    if problems:
        raise PlanError(f"job '{job.name}' does not fit cluster '{cluster.name}':\n" + "\n".join(f"  {p}" for p in problems))
    return batch, memory


@dataclass(frozen=True)
class _Shared:
    """What every node of the job has in common, settled once before the nodes are planned."""

    job: JobSpec
    cluster: ClusterSpec
    policy: PlanPolicy
    job_id: str
    nnodes: int
    probes: dict[int, NodeNetwork]
    batch: BatchPlan | None
    rendezvous: Rendezvous
    python: str
    launcher_python: str
    container: ContainerSpec | None
    program: tuple[bool, list[str]]
    cwd: str
    files: dict[str, tuple[str, str]]
    elastic: Elastic | None
    procs: list[int]


def _shared(
    job: JobSpec, cluster: ClusterSpec, policy: PlanPolicy, job_id: str, chosen: list[NodeSpec],
    probes: dict[int, NodeNetwork], rdzv_port: int, python: str | None, ds_config: dict | None, batch: BatchPlan | None,
    elastic: Elastic | None, procs: list[int],
) -> _Shared:
    """The rendezvous on node 0, the interpreter, the container, the working directory and the program."""
    python = python or policy.python
    container = effective_container(job.container, cluster.container)
    cwd = cluster.workdir or "."
    if container and not cwd.startswith("/"):
        raise PlanError(f"job '{job.name}': a container mounts the workdir at its own path: cluster.yaml workdir "
                        f"must be an absolute path (got {cwd!r})")
    return _Shared(
        job=job, cluster=cluster, policy=policy, job_id=job_id, nnodes=len(chosen), probes=probes, batch=batch,
        rendezvous=Rendezvous(backend=rendezvous_backend(job), id=job_id, host=_address(chosen[0], probes.get(0)),
                              port=rdzv_port),
        python=python,
        launcher_python=container.python if container else python,
        container=container,
        program=commands.program_args(job, batch, ds_config),
        cwd=cwd,
        files={"LAUNCH_DS_CONFIG": (DS_CONFIG_FILE, _json(ds_config))} if ds_config and job.entrypoint else {},
        elastic=elastic,
        procs=procs,
    )


def rendezvous_backend(job: JobSpec) -> str:
    """The one decision on torchrun's rendezvous. launch knows every node's rank before it starts, so a job
    whose node count is fixed needs no rendezvous rounds: ``static`` (node rank, master address and port).
    c10d's rounds cost every agent work per round, which grows with the node count (32 agents on shared cores
    never finished them, issue 23); they are kept for elastic jobs (a node count that may change while the
    job runs), which no job spec asks for yet."""
    elastic = False  # no spec field makes a job elastic yet; resources.nodes is fixed for the job's life
    return commands.C10D if elastic else commands.STATIC


def _node_plan(shared: _Shared, index: int, node: NodeSpec) -> NodePlan:
    """Node ``index``: its launcher command (in the job's container when it has one) and its environment."""
    job = shared.job
    address = _address(node, shared.probes.get(index))
    argv = _launcher_argv(shared, index, address)
    env = _node_env(job, shared.cluster, shared.policy, shared.job_id, index, node, shared.probes.get(index),
                    shared.rendezvous.host, shared.batch)
    env.update(elastic_env(shared.elastic))
    in_container = None
    if shared.container:
        leased = LEASED_GPU_ENV if shared.policy.leases and node.gpus else ()  # set by the agent once it holds them
        names = [*env, *job.secrets, *shared.files, "LAUNCH_RUN_DIR", *leased]
        ib, pending = infiniband(shared.cluster, shared.policy, shared.probes.get(index))
        in_container = _in_container(shared.container, shared.job_id, index, argv, names, shared.cwd, node.gpus,
                                     job.watch.grace_period, ib, pending)
    return NodePlan(
        index=index,
        host=node.host,
        address=address,
        nproc=shared.procs[index],
        first_rank=sum(shared.procs[:index]),
        gpus=node.gpus,
        argv=tuple(in_container.argv if in_container else argv),
        env={k: v for k, (v, _) in env.items() if not isinstance(v, Unprobed)},
        unprobed=tuple(k for k, (v, _) in env.items() if isinstance(v, Unprobed)),
        env_sources={k: s for k, (_, s) in env.items()},
        cwd=shared.cwd,
        files=shared.files,
        step_hooks=STEP_HOOKS in env,
        cleanup=in_container.cleanup if in_container else (),
        env_prefix=in_container.env_prefix if in_container else "",
        run_options=in_container.options if in_container else (),
    )


def infiniband(cluster: ClusterSpec, policy: PlanPolicy, probe: NodeNetwork | None
               ) -> tuple[containers.InfiniBand | None, bool]:
    """(the node's HCAs for its container, whether they are probed at launch): the HCAs its probe found, or
    those cluster.yaml pins (network.ib_hca), with the probe's memlock limit; none where ib_hca is null."""
    pinned = cluster.network.ib_hca
    if pinned is None or not policy.uses_hcas:
        return None, False
    memlock = probe.memlock_max if probe is not None else containers.MEMLOCK_UNLIMITED
    if pinned != AUTO:
        return containers.InfiniBand(tuple(pinned.split(",")), memlock), False
    if probe is None:
        return None, True
    return (containers.InfiniBand(probe.ib_hcas, memlock) if probe.ib_hcas else None), False


def _launcher_argv(shared: _Shared, index: int, address: str) -> list[str]:
    """The node's per-node launcher: DeepSpeed's, or torchrun with the plan's rendezvous."""
    job, rendezvous, nproc = shared.job, shared.rendezvous, shared.procs[index]
    if job.launcher == "deepspeed":
        return commands.deepspeed_argv(
            shared.launcher_python, shared.procs, index, rendezvous.host, rendezvous.port, shared.program,
            local_rank_flag=not job.deepspeed.no_local_rank,
        )
    return commands.torchrun_argv(
        shared.launcher_python, shared.nnodes, nproc, index, rendezvous, address, shared.program,
    )


class InContainer(Frozen):
    """A node's command wrapped in its container runtime, what launch added to it and why, and what removes the
    container afterwards."""

    argv: tuple[str, ...]
    cleanup: tuple[tuple[str, ...], ...]
    env_prefix: str
    options: tuple[containers.RunOption, ...]


def _in_container(spec: ContainerSpec, job_id: str, index: int, argv: list[str], env_names: list[str], cwd: str,
                  gpus: int, grace: float, ib: containers.InfiniBand | None, ib_pending: bool) -> InContainer:
    """The node's launcher command run in the job's image: the node's run directory mounted at its own path
    (the agent fills it in), every variable passed by name, the container named after the job and node."""
    name = containers.ContainerName(job_id, index)
    run_dir = ["--bind", RUN_DIR_TOKEN] if spec.runtime == Runtime.APPTAINER else ["-v", f"{RUN_DIR_TOKEN}:{RUN_DIR_TOKEN}"]
    with_run_dir = spec.model_copy(update={"options": [*run_dir, *spec.options]})
    wrapped = containers.run_argv(with_run_dir, name, argv, env_names, cwd, gpus, ib)
    cleanup = [command for command in (containers.stop_argv(spec.runtime, name, grace),
                                       containers.remove_argv(spec.runtime, name)) if command]
    return InContainer(argv=tuple(wrapped), cleanup=tuple(tuple(c) for c in cleanup),
                       env_prefix=containers.env_prefix(spec.runtime),
                       options=tuple(containers.node_options(spec.runtime, gpus, ib, ib_pending)))


def _json(data: dict) -> str:
    import json

    return json.dumps(data, indent=2, sort_keys=True)


def _fit_problems(job: JobSpec, cluster: ClusterSpec, policy: PlanPolicy, chosen: list[NodeSpec], procs: list[int],
                  placed: bool) -> list[str]:
    problems = [] if placed else list(policy.resource_problems)
    wanted = job.resources.nodes
    if job.leave_out_failed_nodes:
        spare = policy.spare_nodes
        if spare is None:
            problems.append(
                f"leave_out_failed_nodes: needs a cluster whose nodes are listed (ssh): a left-out node is a host of "
                f"its node list; cluster '{cluster.name}' is {cluster.backend}"
            )
        elif spare <= 0:
            problems.append(
                f"leave_out_failed_nodes: cluster '{cluster.name}' lists {len(cluster.nodes)} nodes and the job uses "
                f"{wanted}: no spare node to restart on; list more nodes or drop the option"
            )
    if job.recipe is not None:
        problems += get_strategy(job.strategy).resource_problems(wanted, max(procs))
    if (policy.places_nodes and not placed) or not policy.checks_capacity:
        return problems
    return problems + capacity_problems(procs, chosen)


def _address(node: NodeSpec, probe: NodeNetwork | None) -> str:
    if node.address and node.address != AUTO:
        return node.address
    if probe is not None:
        return probe.address
    return node.address or node.host


def _node_env(
    job: JobSpec, cluster: ClusterSpec, policy: PlanPolicy, job_id: str, index: int, node: NodeSpec,
    probe: NodeNetwork | None, master: str, batch: BatchPlan | None,
) -> dict[str, tuple[str | Unprobed, str]]:
    env: dict[str, tuple[str | Unprobed, str]] = {
        "LAUNCH_JOB_ID": (job_id, "launch: tags every process of the job"),
        "LAUNCH_NODE": (str(index), "launch: node index"),
        "PYTHONUNBUFFERED": ("1", "launch: logs stream as they are written"),
        "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": (LOG_PREFIX_TEMPLATE, "launch: rank prefix on every line"),
    }
    if job.launcher != "deepspeed":
        env[torchelastic.ERROR_FILE_ENV] = (torchelastic.error_file(RUN_DIR_TOKEN, index),
                                            "launch: torchrun records its first failed rank's error here")
    if job.entrypoint is None:  # a recipe: launch's own code, never a module in the workdir (a planted launcher/)
        env["PYTHONSAFEPATH"] = ("1", "launch: the recipe's interpreters do not put the workdir first on sys.path")
    if batch is not None and job.entrypoint is not None:
        env["LAUNCH_GLOBAL_BATCH"] = (str(batch.global_batch), "launch: batch.global_batch (micro x accumulation x world)")
        env["LAUNCH_MICRO_BATCH"] = (str(batch.micro_batch), "launch: batch.micro_batch")
        env["LAUNCH_GRAD_ACCUM"] = (str(batch.grad_accum), "launch: batch.grad_accum")
    if node.gpus == 0:
        env["OMP_NUM_THREADS"] = ("1", "launch: one thread per CPU rank (torchrun's default, made explicit)")
    else:
        trace = (f"{RUN_DIR_TOKEN}/nccl_trace_rank_", "launch: NCCL flight recorder dumps in the ranks' run directory")
        env["TORCH_FR_BUFFER_SIZE"] = (FLIGHT_RECORDER_EVENTS, "launch: NCCL flight recorder on (torch >= 2.9 name)")
        env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = (FLIGHT_RECORDER_EVENTS, "launch: NCCL flight recorder on (older torch)")
        env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = ("1", "launch: dump the flight recorder on a collective timeout")
        env["TORCH_FR_DUMP_TEMP_FILE"] = trace
        env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = trace
        if not NCCL_DEBUG_ENV & job.env.keys():  # the user's own NCCL_DEBUG settings are theirs, untouched
            why = "launch: NCCL says which transport it chose (read by the node's agent), in the run directory only"
            env["NCCL_DEBUG"] = ("INFO", why)
            env["NCCL_DEBUG_SUBSYS"] = ("INIT,NET", why)
            env["NCCL_DEBUG_FILE"] = (f"{RUN_DIR_TOKEN}/{NCCL_DEBUG_FILE}", why)
    if job.uses_deepspeed and node.gpus == 0:
        env["DS_ACCELERATOR"] = ("cpu", "launch: DeepSpeed on CPU ranks (gloo)")
    if job.entrypoint is not None and job.metrics.auto and job.container is None and cluster.container is None:
        env[STEP_HOOKS] = (str(job.metrics.every), "launch: step hooks observe the training step (metrics.auto, every)")
    env.update(network_env(cluster, policy, probe, master))
    for key, value in job.env.items():
        env[key] = (value, "job env")
    return env
