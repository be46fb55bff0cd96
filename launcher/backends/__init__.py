"""Backends run a plan's nodes: ``local`` (this machine), ``ssh`` (paramiko), ``ray`` (placement groups), ``slurm`` (sbatch).

``BACKENDS`` maps a cluster spec's ``backend:`` name to the class that implements it; a backend
module is imported only when its class is asked for, so the CLI never loads paramiko or ray
for a job that does not use them. A new backend is a module with a ``Backend`` subclass and
one line here (and its spec section in ``launcher/spec/cluster.py``).
"""

from __future__ import annotations

import importlib
from typing import Any

from launcher.backends.base import Backend
from launcher.plan.planner import Plan, make_plan
from launcher.spec.cluster import ClusterSpec
from launcher.spec.job import JobSpec

BACKENDS: dict[str, str] = {
    "local": "launcher.backends.local.backend:LocalBackend",
    "ssh": "launcher.backends.ssh.backend:SSHBackend",
    "ray": "launcher.backends.ray.backend:RayBackend",
    "slurm": "launcher.backends.slurm.backend:SlurmBackend",
}


def backend_class(name: str) -> type[Backend]:
    """The Backend subclass registered as ``name``."""
    try:
        module, _, cls = BACKENDS[name].partition(":")
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}") from None
    return getattr(importlib.import_module(module), cls)


def get_backend(cluster: ClusterSpec) -> Backend:
    """A connected backend for ``cluster``."""
    return backend_class(cluster.backend)(cluster)


def plan_job(job: JobSpec, cluster: ClusterSpec, job_id: str, **options: Any) -> Plan:
    """``make_plan`` under the policy of ``cluster``'s backend (the options are ``make_plan``'s)."""
    return make_plan(job, cluster, job_id, policy=backend_class(cluster.backend).plan_policy(job, cluster), **options)


__all__ = ["BACKENDS", "Backend", "backend_class", "get_backend", "plan_job"]
