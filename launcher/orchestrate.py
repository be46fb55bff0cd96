"""Submit and cancel: load -> plan -> preflight -> record -> supervise (here or detached)."""

from __future__ import annotations

import json
import os
import secrets as token
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import LaunchError, PreflightError, SpecError
from launcher.spec.cluster import ClusterSpec
from launcher.spec.job import JobSpec
from launcher.store import CANCELLED, TERMINAL, Store

DEFAULT_CLUSTER_FILE = "cluster.yaml"


@dataclass(frozen=True)
class Prepared:
    """A validated job, its cluster, and the plan made from them."""

    job: JobSpec
    cluster: ClusterSpec
    plan: object


def new_job_id(name: str) -> str:
    """``<name>-<8 hex>``: readable, a valid rendezvous id, and unique (checked when stored)."""
    return f"{name}-{token.token_hex(4)}"


def load_cluster_spec(path: str | None) -> ClusterSpec:
    """The cluster from ``--cluster``, else ./cluster.yaml, else the embedded local default."""
    from launcher.spec.load import load_cluster

    if path is None and os.path.exists(DEFAULT_CLUSTER_FILE):
        path = DEFAULT_CLUSTER_FILE
    cluster = load_cluster(path) if path else ClusterSpec(name="local", backend="local")
    if cluster.backend == "local":
        updates = {}
        if cluster.python is None:
            updates["python"] = sys.executable
        if cluster.workdir is None:
            updates["workdir"] = os.getcwd()
        cluster = cluster.model_copy(update=updates)
    return cluster


def prepare(job_path: str, cluster_path: str | None, overrides: tuple[str, ...] = (), check_fit: bool = True) -> Prepared:
    """Validate the specs and make the plan; contacts nothing. ``check_fit=False`` plans a
    recipe job even when its strategy does not fit the GPUs (for `launch plan`)."""
    from launcher.spec.load import load_job

    return prepare_job(load_job(job_path, overrides), load_cluster_spec(cluster_path), check_fit)


def prepare_job(job: JobSpec, cluster: ClusterSpec, check_fit: bool = True) -> Prepared:
    """Plan a validated job on a cluster (a free port for its rendezvous unless pinned)."""
    from launcher.backends.local import free_port
    from launcher.plan import make_plan

    ds_config = deepspeed_config(job)
    port = cluster.rendezvous.port or free_port()
    plan = make_plan(job, cluster, new_job_id(job.name), rdzv_port=port, ds_config=ds_config, check_fit=check_fit)
    return Prepared(job, cluster, plan)


def deepspeed_config(job: JobSpec, world_size: int | None = None) -> dict | None:
    """The DeepSpeed config for a recipe under a DeepSpeed strategy, else None."""
    if not (job.recipe and job.uses_deepspeed):
        return None
    from launcher.batch import resolve_batch
    from launcher.dsconfig import make_ds_config
    from launcher.errors import PlanError

    world = world_size or job.resources.nodes * job.resources.nproc_per_node
    try:
        batch = resolve_batch(job.batch, world)
    except PlanError:
        return None
    user = None
    if job.deepspeed.config:
        try:
            user = json.loads(Path(job.deepspeed.config).expanduser().read_text())
        except (OSError, ValueError) as exc:
            raise SpecError(f"deepspeed.config: cannot read '{job.deepspeed.config}' as JSON: {exc}") from None
    try:
        return make_ds_config(
            job.strategy, job.precision, batch.micro_batch, batch.grad_accum, world,
            gradient_clipping=job.deepspeed.gradient_clipping, user_config=user,
        )
    except ValueError as exc:
        raise SpecError(f"deepspeed: {exc}") from None


def submit(
    prepared: Prepared,
    *,
    detach: bool,
    echo: Callable[[str], None] | None,
    on_recorded: Callable[[str], None] | None = None,
    run_check: bool = True,
    warn: Callable[[str], None] | None = None,
) -> tuple[str, str]:
    """Check, preflight, record and run the job; (job id, state). Nothing starts if a check fails.

    On SSH clusters ``run_check`` then compares the nodes (python, torch,
    deepspeed and NCCL versions; clock skew, disk and GPU processes as warnings).
    """
    from launcher.backends.base import get_backend
    from launcher.secrets import read_secrets
    from launcher.supervisor import Supervisor

    job, cluster, plan = prepared.job, prepared.cluster, prepared.plan
    secret_values = read_secrets(job.secrets)
    backend = get_backend(cluster.backend, cluster)
    try:
        plan = _preflight(prepared, backend, run_check, warn)
    except BaseException:
        backend.close()
        raise
    store = Store()
    store.create_job(plan, stored_spec(job, cluster, run_check))
    if on_recorded:
        on_recorded(plan.job_id)
    if detach:
        backend.close()
        _spawn_supervisor(store, plan.job_id)
        return plan.job_id, "PENDING"
    supervisor = Supervisor(
        store, plan, backend, echo=echo, secrets=secret_values, grace=job.watch.grace_period,
        restarts=job.restarts, stall_timeout=job.watch.stall_timeout,
        replan=replanner(job, cluster, store, run_check) if job.leave_out_failed_nodes else None,
    )
    supervisor.install_signal_handlers()
    return plan.job_id, supervisor.run()


def stored_spec(job: JobSpec, cluster: ClusterSpec, run_check: bool) -> dict:
    """What the store keeps of a job's specs: enough for a detached supervisor, `cancel` and a re-plan."""
    return {"job": job.model_dump(mode="json"), "cluster": cluster.model_dump(mode="json"), "check": run_check}


def replanner(job: JobSpec, cluster: ClusterSpec, store: Store, run_check: bool):
    """The supervisor's way to re-plan a restart without some hosts. It checks the new nodes as submit did
    (``run_check``: versions compared, warnings filed as events) and records the smaller cluster, so that
    `launch cancel` and the final sweep address the nodes the job now runs on."""

    def replan(plan, hosts: frozenset[str]):
        def warn(text: str) -> None:
            store.add_event(plan.job_id, "warning", text)

        smaller, new_plan, backend = plan_without(job, cluster, plan, hosts, run_check, warn)
        store.update_job(plan.job_id, plan=new_plan.model_dump(mode="json"), spec=stored_spec(job, smaller, run_check))
        return new_plan, backend

    return replan


def _preflight(prepared: Prepared, backend, run_check: bool, warn: Callable[[str], None] | None):
    """Every check before the first process starts; the plan re-made with what the backend probed."""
    from launcher.plan import make_plan

    job, cluster, plan = prepared.job, prepared.cluster, prepared.plan
    validation = _start_ds_validation(plan.ds_config) if run_check else None
    found = backend.preflight(plan)
    if validation is not None:
        found.problems.extend(_ds_problems(validation))
    if found.problems:
        raise PreflightError(
            f"preflight failed on {len(found.problems)} check(s); nothing was started:\n"
            + "\n".join(f"  {p}" for p in found.problems)
        )
    if run_check and cluster.backend == "ssh":
        used = cluster.model_copy(update={"nodes": cluster.nodes[: plan.nnodes]})
        _check_consistency(used, plan.rendezvous.port, warn)
    if found.nodes is not None or found.probes:
        plan = make_plan(
            job, cluster, plan.job_id, rdzv_port=plan.rendezvous.port,
            nodes=found.nodes, probes=found.probes, ds_config=plan.ds_config,
        )
    if plan.unresolved():
        raise PreflightError("values could not be probed: " + ", ".join(plan.unresolved()))
    return plan


def plan_without(
    job: JobSpec, cluster: ClusterSpec, plan, hosts: frozenset[str], run_check: bool = True,
    warn: Callable[[str], None] | None = None,
):
    """For a restart that leaves ``hosts`` out: (the cluster without them, the preflighted plan on it, its backend).

    The job keeps its id, rendezvous port, world size and batch; PlanError or
    PreflightError (nothing started) when the other nodes cannot take it.
    """
    from launcher.backends.base import get_backend
    from launcher.plan import make_plan

    smaller = cluster.model_copy(update={"nodes": [n for n in cluster.nodes if n.host not in hosts]})
    job = job.model_copy(update={"leave_out_failed_nodes": False})
    fresh = make_plan(job, smaller, plan.job_id, rdzv_port=plan.rendezvous.port, ds_config=plan.ds_config)
    backend = get_backend(smaller.backend, smaller)
    try:
        return smaller, _preflight(Prepared(job, smaller, fresh), backend, run_check, warn), backend
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
        [sys.executable, "-m", "launcher.dsconfig", json.dumps(ds_config)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")},
    )


def _ds_problems(proc: subprocess.Popen) -> list[str]:
    out, err = proc.communicate()
    if proc.returncode != 0:
        last = err.strip().splitlines()[-1] if err.strip() else f"exit code {proc.returncode}"
        return [f"deepspeed config: DeepSpeed's validation could not run: {last}"]
    return [f"deepspeed config: {problem}" for problem in json.loads(out)]


def _check_consistency(cluster: ClusterSpec, port: int, warn: Callable[[str], None] | None) -> None:
    from launcher.check import consistency

    report = consistency(cluster, port)
    for warning in report.warnings:
        if warn:
            warn(f"warning: {warning}")
    if report.problems:
        raise PreflightError(
            f"launch check found {len(report.problems)} problem(s); nothing was started:\n"
            + "\n".join(f"  {p}" for p in report.problems),
            hint="`launch check` shows every node; `launch submit --skip-check` skips this comparison",
        )


def _spawn_supervisor(store: Store, job_id: str) -> None:
    log = open(store.run_dir(job_id) / "supervisor.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher.supervisor", job_id],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=os.environ.copy(),
    )
    log.close()
    store.update_job(job_id, supervisor_pid=proc.pid)


def cancel(store: Store, job_ref: str, wait: float = 30.0) -> dict:
    """Cancel a job: signal its supervisor, or clean up directly if it is gone; the final job row."""
    job = store.job(job_ref)
    if job["state"] in TERMINAL:
        raise LaunchError(f"job {job['id']} already ended {job['state']}; nothing to cancel")
    store.add_event(job["id"], "cancel_requested", "cancel requested by `launch cancel`")
    pid = job.get("supervisor_pid")
    if pid and _is_supervisor(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            job = store.job(job["id"])
            if job["state"] in TERMINAL:
                return job
            time.sleep(0.1)
    _cancel_orphaned(store, job)
    return store.job(job["id"])


def _is_supervisor(pid: int) -> bool:
    """True if ``pid`` is alive and is a `launch` process (a detached or foreground supervisor)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"launch" in handle.read()
    except OSError:
        return False


def _cancel_orphaned(store: Store, job: dict) -> None:
    """The supervisor is gone: end the job's processes ourselves and record CANCELLED."""
    from launcher.backends.base import get_backend
    from launcher.plan import Plan

    plan = Plan.model_validate(job["plan"])
    cluster = ClusterSpec.model_validate(job["spec"]["cluster"])
    backend = get_backend(plan.backend, cluster)
    try:
        left = backend.sweep(plan, job["spec"]["job"]["watch"]["grace_period"])
    finally:
        backend.close()
    if left:
        raise LaunchError(f"job {job['id']}: processes still alive after cancel: {left}")
    store.transition(job["id"], CANCELLED, reason="cancelled by user (supervisor was gone)")
