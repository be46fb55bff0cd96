"""Submit: load -> plan -> preflight -> record -> supervise (here or detached), and ``make_supervisor``, the one
wiring of a recorded job's supervisor (its restarts re-planned and checked as submit checks)."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets as token
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from launcher.backends import Backend, cluster_spec, get_backend, plan_job, planning
from launcher.backends.base import Preflight, Stage, StageSink, StageState, no_stage
from launcher.backends.failures import Failure, FailureKind
from launcher.errors import PreflightError, SpecError
from launcher.plan.planner import Plan, make_plan
from launcher.plan.policy import node_procs
from launcher.plan.shell import mask
from launcher.run import identity
from launcher.run.checks import version_differences
from launcher.run.recorded import Origin, replanned_spec, stored_spec
from launcher.spec.cluster import ClusterSpec
from launcher.spec.files import expand_user, read_regular
from launcher.spec.job import JobSpec
from launcher.spec.load import MAX_NAMED_FILE_BYTES
from launcher.store.db import Store
from launcher.store.states import JobState

if TYPE_CHECKING:
    from launcher.run.supervisor import Supervisor

DEFAULT_CLUSTER_FILE = "cluster.yaml"
CLUSTER_ENV = "LAUNCH_CLUSTER"
#: where a cluster file is looked for when ``--cluster`` is not given, in this order (said in the submit banner)
CLUSTER_LOOKUP = f"${CLUSTER_ENV}, $LAUNCH_HOME/{DEFAULT_CLUSTER_FILE}, ./{DEFAULT_CLUSTER_FILE}"
SUBMITTED_WAIT_S = 30.0  # --detach on a scheduler: how long to wait for the scheduler to have the job
DS_CHECK_WAIT_S = 120.0  # DeepSpeed's config check, once preflight is done: importing deepspeed takes 5-30 s


@dataclass(frozen=True)
class Prepared:
    """A validated job, its cluster, and the plan made from them."""

    job: JobSpec
    cluster: ClusterSpec
    plan: Plan
    #: the cluster file used, or the job whose cluster it is (None: none was given or found: this machine)
    cluster_file: str | None = None
    #: the overrides it was made with, the job it runs again
    origin: Origin = Origin()


def new_job_id(name: str) -> str:
    """``<name>-<8 hex>``: readable, a valid rendezvous id, and unique (checked when stored)."""
    return f"{name}-{token.token_hex(4)}"


def find_cluster_file(path: str | None) -> str | None:
    """The cluster file to use: ``--cluster``, else ``$LAUNCH_CLUSTER``, else ``$LAUNCH_HOME/cluster.yaml``, else
    ``./cluster.yaml``; None when none of them exists (the job runs on this machine). A ``$LAUNCH_CLUSTER`` that
    names no file is an error, not a silent fall back to this machine."""
    from launcher.store.base import launch_home

    if path is not None:
        return path
    named = os.environ.get(CLUSTER_ENV)
    if named:
        if not os.path.exists(expand_user(named, CLUSTER_ENV)):
            raise SpecError(f"{CLUSTER_ENV}={named}: no such file (unset {CLUSTER_ENV} to use {DEFAULT_CLUSTER_FILE} "
                            "from $LAUNCH_HOME or the current directory)")
        return named
    for candidate in (launch_home() / DEFAULT_CLUSTER_FILE, DEFAULT_CLUSTER_FILE):
        if os.path.exists(candidate):
            return str(candidate)
    return None


def load_cluster_spec(path: str | None) -> ClusterSpec:
    """The cluster from the file ``find_cluster_file`` finds, else the embedded local default (this machine),
    with what its backend fills in (the local cluster: this machine's CPUs, GPUs, directory)."""
    from launcher.backends import load_cluster

    path = find_cluster_file(path)
    cluster = load_cluster(path) if path else cluster_spec(name="local", backend="local")
    return planning(cluster).resolve_defaults()


def prepare(job_path: str, cluster_path: str | None, overrides: tuple[str, ...] = (), check_fit: bool = True) -> Prepared:
    """Validate the specs and make the plan; contacts nothing. ``check_fit=False`` plans a
    recipe job even when its strategy does not fit the GPUs (for `launch plan`)."""
    from launcher.spec.load import load_job

    cluster_file = find_cluster_file(cluster_path)
    prepared = prepare_job(load_job(job_path, overrides), load_cluster_spec(cluster_file), check_fit)
    return dataclasses.replace(prepared, cluster_file=cluster_file, origin=Origin(tuple(overrides)))


def prepare_job(job: JobSpec, cluster: ClusterSpec, check_fit: bool = True) -> Prepared:
    """Plan a validated job on a cluster (a free port for its rendezvous unless pinned)."""
    from launcher.run.ports import free_port

    decides = planning(cluster)
    port = cluster.rendezvous.port or free_port()
    plan = make_plan(job, cluster, new_job_id(job.name), policy=decides.plan_policy(job), rdzv_port=port,
                     ds_config=deepspeed_config(job, planned_world(job, cluster)), check_fit=check_fit)
    if check_fit:
        decides.check_host_memory(job, plan)
    return Prepared(job, cluster, plan)


def planned_world(job: JobSpec, cluster: ClusterSpec) -> int:
    """The job's world size on the nodes its backend would plan it on (``nproc_per_node: auto`` counts each node's)."""
    nodes = planning(cluster).plan_policy(job).nodes
    return sum(node_procs(job.resources.nproc_per_node, nodes))


def deepspeed_config(job: JobSpec, world_size: int | None = None) -> dict | None:
    """The DeepSpeed config the job's ranks get: a recipe's under a DeepSpeed strategy, or, for an
    entrypoint under `launcher: deepspeed`, the generated one merged with the user's (LAUNCH_DS_CONFIG)."""
    entrypoint = job.entrypoint is not None and job.launcher == "deepspeed"
    if not (job.recipe and job.uses_deepspeed) and not entrypoint:
        return None
    from launcher.errors import PlanError
    from launcher.plan.batch import resolve_batch
    from launcher.plan.dsconfig import DSConfigError, entrypoint_ds_config, make_ds_config

    nproc = job.resources.nproc_per_node
    world = world_size or job.resources.nodes * (nproc if isinstance(nproc, int) else 1)
    try:
        batch = resolve_batch(job.batch, world) if job.batch is not None else None
    except PlanError:
        return None
    user = None
    if job.deepspeed.config:
        try:
            path = expand_user(job.deepspeed.config, "deepspeed.config")
            user = json.loads(read_regular(path, "deepspeed.config", MAX_NAMED_FILE_BYTES))
        except (OSError, ValueError) as exc:
            raise SpecError(f"deepspeed.config: cannot read '{job.deepspeed.config}' as JSON: {exc}") from None
        if not isinstance(user, dict):
            raise SpecError(f"deepspeed.config: '{job.deepspeed.config}' must hold a JSON object")
    try:
        if entrypoint:
            if batch is None and user is None:
                return None  # nothing of the job's to give the program: it brings its own config
            return entrypoint_ds_config(job.precision, batch, job.deepspeed.gradient_clipping, user)
        assert batch is not None  # a recipe job has a batch (JobSpec's validation refuses one without)
        return make_ds_config(
            job.strategy, job.precision, batch.micro_batch, batch.grad_accum, world,
            gradient_clipping=job.deepspeed.gradient_clipping, user_config=user,
        )
    except DSConfigError as exc:
        raise SpecError(f"deepspeed: {exc}") from None


def submit(
    prepared: Prepared,
    *,
    detach: bool,
    echo: Callable[[str], None] | None,
    on_recorded: Callable[[str], None] | None = None,
    run_check: bool = True,
    warn: Callable[[str], None] | None = None,
    stage: StageSink = no_stage,
    store: Store | None = None,
    ask: Callable[[], bool] | None = None,
) -> tuple[str, JobState]:
    """Check, preflight, record (in ``store``, else the user's) and run the job; (job id, state). Nothing starts if a
    check fails. In the foreground, a closed terminal never ends the job and Ctrl-C cancels it, after ``ask`` says
    yes where given (``Supervisor.install_signal_handlers``).

    ``run_check`` also compares the nodes' python, torch, deepspeed and NCCL versions (from the
    facts preflight gathered) and validates a DeepSpeed config with DeepSpeed's own classes.
    One backend, so one connection per host, serves the whole submit.
    """
    from launcher.run.secrets import read_secrets

    job, cluster = prepared.job, prepared.cluster
    secret_values = read_secrets(job.secrets)
    backend = get_backend(cluster)
    try:
        if not detach:  # this process starts and supervises the job: get both ready while preflight runs
            backend.warm(prepared.plan)
            _import_ahead("launcher.run.supervisor", "launcher.run.notify")
        plan = preflight(prepared, backend, run_check, warn, stage)
    except BaseException:
        backend.close()
        raise
    store, created = store or Store(), False
    try:  # until a supervisor owns the job: a failure here closes the backend and ends a recorded job FAILED
        origin = dataclasses.replace(prepared.origin, overrides=tuple(mask(item, secret_values)
                                                                      for item in prepared.origin.overrides))
        store.create_job(plan, stored_spec(job, cluster, run_check, origin), user=identity.user_and_host()[0])
        created = True
        if not detach:  # this process supervises it: provable at once (`launch cancel` finds it)
            identity.record(store.run_dir(plan.job_id), plan.job_id)
            store.update_job(plan.job_id, supervisor_pid=os.getpid())
        if on_recorded:
            on_recorded(plan.job_id)
        if detach:
            backend.close()
            _spawn_supervisor(store, plan.job_id)
        else:
            supervisor = make_supervisor(store, plan, job, cluster, run_check, backend, secret_values,
                                         echo=echo, warn=warn, stage=stage)
            supervisor.install_signal_handlers(terminal=True, ask=ask)
    except BaseException as exc:
        backend.close()
        if created:
            end_unsupervised(store, plan.job_id, f"submit failed before the job was supervised: {exc!r}")
        raise
    if detach:
        if backend.capabilities.places_at_start:
            return plan.job_id, _scheduler_has(store, plan.job_id)
        return plan.job_id, JobState.PENDING
    return plan.job_id, supervisor.run()


def _import_ahead(*modules: str) -> None:
    """Import ``modules`` in a thread while this one waits for preflight's node probes (other processes), so that
    the supervisor's imports (~40 ms) are not on the way from `launch submit` to the job's start."""
    import importlib
    import threading

    threading.Thread(target=lambda: [importlib.import_module(name) for name in modules], daemon=True).start()


def make_supervisor(
    store: Store, plan: Plan, job: JobSpec, cluster: ClusterSpec, run_check: bool, backend: Backend,
    secrets: Mapping[str, str], *, echo: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None, stage: StageSink = no_stage, generation: int = 0,
) -> Supervisor:
    """The supervisor of a recorded job, wired from its specs (the foreground submit and the detached one alike)."""
    from launcher.run.notify import Notifier
    from launcher.run.supervisor import Supervisor

    mirror = None
    if job.tracking is not None and (job.tracking.mlflow or job.tracking.wandb):
        from launcher.run.trackers import configured
        from launcher.run.tracking import make_mirror

        mirror = make_mirror(store, job.tracking, job.model_dump(mode="json", exclude_none=True), plan, secrets,
                             configured)
    return Supervisor(
        store, plan, backend, echo=echo, warn=warn, stage=stage, secrets=secrets, grace=job.watch.grace_period,
        restarts=job.restarts, restart_on=job.restart_on, stall_timeout=job.watch.stall_timeout,
        replan=replanner(job, cluster, store, run_check) if job.leave_out_failed_nodes else None,
        place=placer(job, cluster),
        elastic=elastic_replanner(job, cluster, store, run_check) if job.elastic else None,
        notifier=Notifier(job.notify, secrets) if job.notify else None, mirror=mirror, generation=generation,
    )


def end_unsupervised(store: Store, job_id: str, reason: str) -> None:
    """End a job FAILED that no supervisor took (its reason says why); a job already ended keeps its state."""
    failure = Failure(kind=FailureKind.INTERNAL, reason=reason)
    if store.transition(job_id, JobState.FAILED, reason=reason, first_failure=failure.model_dump(mode="json"),
                        failure_kind=failure.kind):
        store.add_event(job_id, "failed", reason)


def _scheduler_has(store: Store, job_id: str, timeout: float = SUBMITTED_WAIT_S) -> JobState:
    """Wait until the detached supervisor has handed the job to the scheduler (its id recorded) or the job
    ended; the job's state then (PENDING if neither came within ``timeout``: the supervisor goes on)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = store.job(job_id)
        if job.scheduler_id or job.terminal:
            return store.state(job_id)
        time.sleep(0.1)
    return store.state(job_id)


def replanner(job: JobSpec, cluster: ClusterSpec, store: Store, run_check: bool):
    """The supervisor's way to re-plan a restart without some hosts. It checks the new nodes as submit did
    (``run_check``: versions compared, warnings filed as events) and records the smaller cluster, so that
    `launch cancel` and the final sweep address the nodes the job now runs on."""

    def replan(plan: Plan, hosts: frozenset[str]) -> tuple[Plan, Backend]:
        def warn(text: str) -> None:
            store.add_event(plan.job_id, "warning", text)

        smaller, new_plan, backend = plan_without(job, cluster, plan, hosts, run_check, warn)
        store.update_job(plan.job_id, plan=new_plan.model_dump(mode="json"),
                         spec=replanned_spec(store.job(plan.job_id).spec, job, smaller, run_check))
        return new_plan, backend

    return replan


def elastic_replanner(job: JobSpec, cluster: ClusterSpec, store: Store, run_check: bool):
    """The supervisor's way to re-plan an elastic job's next attempt (``run.elastic``), checked as submit checks,
    the new plan and specs recorded (so cancel, the sweep and status address the nodes it now runs on)."""
    from launcher.run import elastic

    def check(smaller_job: JobSpec, smaller: ClusterSpec, previous: Plan, attempt: int) -> tuple[Plan, Backend]:
        job_id = previous.job_id
        fresh = plan_job(smaller_job, smaller, job_id, rdzv_port=previous.rendezvous.port,
                         ds_config=deepspeed_config(smaller_job, planned_world(smaller_job, smaller)),
                         resumed=(attempt, previous.world_size))
        backend = get_backend(smaller)
        try:
            checked = preflight(Prepared(smaller_job, smaller, fresh), backend, run_check,
                                lambda text: store.add_event(job_id, "warning", text))
        except BaseException:
            backend.close()
            raise
        store.update_job(job_id, plan=checked.model_dump(mode="json"),
                         spec=replanned_spec(store.job(job_id).spec, smaller_job, smaller, run_check),
                         nnodes=checked.nnodes, world_size=checked.world_size,
                         grad_accum=checked.batch.grad_accum if checked.batch else None)
        return checked, backend

    def replan(plan: Plan, lost: elastic.Lost, attempt: int) -> elastic.Replanned:
        done = elastic.replan(job, cluster, plan, lost, attempt, check)
        return dataclasses.replace(done, place=placer(done.job, done.cluster))  # a scheduler places the smaller job

    return replan


def preflight(
    prepared: Prepared, backend: Backend, run_check: bool, warn: Callable[[str], None] | None,
    stage: StageSink = no_stage,
) -> Plan:
    """Every check before the first process starts; the plan re-made with what the backend probed."""
    job, cluster, plan = prepared.job, prepared.cluster, prepared.plan
    validation = _start_ds_validation(plan.ds_config) if run_check else None
    try:
        for node in plan.nodes:
            stage(Stage.PREFLIGHT, node.index, node.host, StageState.RUNNING)
        found = backend.preflight(plan)
        skippable = _ds_problems(validation) if validation is not None else []  # what --skip-check leaves out
    finally:
        if validation is not None and validation.poll() is None:  # preflight failed, or the check hung
            validation.kill()
            validation.wait()
    if run_check and len(found.facts) > 1:
        skippable += version_differences({plan.nodes[i].host: f for i, f in sorted(found.facts.items())})
    found.problems.extend(skippable)
    for node in plan.nodes:
        failed = any(problem.startswith((f"{node.host}:", f"node {node.index} ")) for problem in found.problems)
        stage(Stage.PREFLIGHT, node.index, node.host, StageState.FAILED if failed else StageState.DONE)
    if found.problems:
        raise PreflightError(
            f"preflight failed on {len(found.problems)} check(s); nothing was started:\n"
            + "\n".join(f"  {p}" for p in found.problems),
            hint=found.hint or "`launch check` shows every node" + (
                "; `launch submit --skip-check` skips the version comparison and DeepSpeed's config check"
                if skippable else ""),
        )
    if run_check and warn is not None:
        from launcher.run.checks import CheckedNode, node_warnings

        for text in node_warnings([CheckedNode(i, plan.nodes[i].host, f) for i, f in sorted(found.facts.items())]):
            warn(f"warning: {text}")
    if backend.capabilities.places_at_start:
        return plan  # placed by the supervisor once the scheduler allocates the nodes (StartContext.place)
    return placed(job, cluster, plan, found)


def placed(job: JobSpec, cluster: ClusterSpec, plan: Plan, found: Preflight) -> Plan:
    """The plan re-made with what the backend found on the nodes (addresses, network, interpreter);
    PreflightError if a value the plan needs is still unknown."""
    if found.nodes is not None or found.probes or found.python:
        plan = make_plan(
            job, cluster, plan.job_id, policy=planning(cluster).plan_policy(job), rdzv_port=plan.rendezvous.port,
            nodes=found.nodes, probes=found.probes, python=found.python or plan.python, ds_config=plan.ds_config,
            resumed=plan.elastic.resumed if plan.elastic else None,
        )
    if plan.unresolved():
        raise PreflightError("values could not be probed: " + ", ".join(plan.unresolved()))
    return plan


def placer(job: JobSpec, cluster: ClusterSpec) -> Callable[[Plan, Preflight], Plan]:
    """For backends that learn the nodes only once a scheduler allocates them (Slurm): the supervisor's way
    to re-plan the job with the preflight it ran inside the allocation."""
    return lambda plan, found: placed(job, cluster, plan, found)


def plan_without(
    job: JobSpec, cluster: ClusterSpec, plan: Plan, hosts: frozenset[str], run_check: bool = True,
    warn: Callable[[str], None] | None = None,
) -> tuple[ClusterSpec, Plan, Backend]:
    """For a restart that leaves ``hosts`` out: (the cluster without them, the preflighted plan on it, its backend).

    The job keeps its id, rendezvous port, world size and batch; PlanError or
    PreflightError (nothing started) when the other nodes cannot take it.
    """
    smaller = cluster.model_copy(update={"nodes": [n for n in cluster.nodes if n.host not in hosts]})
    job = job.model_copy(update={"leave_out_failed_nodes": False})
    fresh = plan_job(job, smaller, plan.job_id, rdzv_port=plan.rendezvous.port,
                      ds_config=plan.ds_config)
    backend = get_backend(smaller)
    try:
        return smaller, preflight(Prepared(job, smaller, fresh), backend, run_check, warn), backend
    except BaseException:
        backend.close()
        raise


def _start_ds_validation(ds_config: dict | None) -> subprocess.Popen | None:
    """Validate the DeepSpeed config with DeepSpeed's own classes, in a subprocess beside preflight
    (only when deepspeed is installed on the submitting machine)."""
    import importlib.util

    if ds_config is None or importlib.util.find_spec("deepspeed") is None:
        return None
    return subprocess.Popen(
        [sys.executable, "-P", "-m", "launcher.plan.dsconfig", json.dumps(ds_config)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")},
    )


def _ds_problems(proc: subprocess.Popen) -> list[str]:
    """The problems DeepSpeed found in the config; one saying why it could not tell (it failed, or was still
    running ``DS_CHECK_WAIT_S`` after preflight)."""
    try:
        out, err = proc.communicate(timeout=DS_CHECK_WAIT_S)
    except subprocess.TimeoutExpired:
        return [f"deepspeed config: DeepSpeed's validation did not finish within {DS_CHECK_WAIT_S:.0f} s of "
                "preflight (importing deepspeed hung?)"]
    if proc.returncode != 0:
        last = err.strip().splitlines()[-1] if err.strip() else f"exit code {proc.returncode}"
        return [f"deepspeed config: DeepSpeed's validation could not run: {last}"]
    return [f"deepspeed config: {problem}" for problem in json.loads(out)]


def _spawn_supervisor(store: Store, job_id: str) -> None:
    log = open(store.run_dir(job_id) / "supervisor.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "launcher.run.detached", job_id],  # -P: not the caller's cwd first on sys.path
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=os.environ.copy(),
    )
    log.close()
    store.update_job(job_id, supervisor_pid=proc.pid)
