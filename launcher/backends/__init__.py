"""Backends run a plan's nodes: ``local`` (this machine), ``ssh`` (paramiko), ``ray`` (placement groups), ``slurm`` (sbatch).

``BACKENDS`` maps a cluster spec's ``backend:`` name to where its parts live in its package: its
cluster model (``spec.py``: the ``ClusterSpec`` subclass with its own section, pydantic only) and
its ``Backend`` class (the runtime, which names its ``Planning`` class: capabilities and the
plan's policy). A part is imported only when asked for, so the CLI never loads paramiko or ray
for a job that does not use them. A new backend is a package and one line here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from launcher.backends.base import Backend
from launcher.backends.planning import Planning
from launcher.plan.planner import Plan, make_plan
from launcher.spec import load
from launcher.spec.cluster import ClusterSpec
from launcher.spec.clusters import ClusterModels
from launcher.spec.job import JobSpec


@dataclass(frozen=True)
class Registered:
    """A backend's parts, each ``module:name``."""

    spec: str
    backend: str


BACKENDS: dict[str, Registered] = {
    "local": Registered("launcher.backends.local.spec:LocalCluster", "launcher.backends.local.backend:LocalBackend"),
    "ssh": Registered("launcher.backends.ssh.spec:SSHCluster", "launcher.backends.ssh.backend:SSHBackend"),
    "ray": Registered("launcher.backends.ray.spec:RayCluster", "launcher.backends.ray.backend:RayBackend"),
    "slurm": Registered("launcher.backends.slurm.spec:SlurmCluster", "launcher.backends.slurm.backend:SlurmBackend"),
}


def _part(where: str) -> Any:
    module, _, name = where.partition(":")
    return getattr(importlib.import_module(module), name)


def _registered(name: str) -> Registered:
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; known: {', '.join(BACKENDS)}") from None


@cache
def cluster_models() -> ClusterModels:
    """Every registered backend's cluster model, one union chosen by ``backend:`` (what the loader is given)."""
    return ClusterModels({name: _part(parts.spec) for name, parts in BACKENDS.items()})


def cluster_spec(data: Any = None, /, **fields: Any) -> ClusterSpec:
    """A cluster spec from plain data (a stored record) or keyword fields, as its backend's model
    (pydantic's ValidationError when it is not one)."""
    return cluster_models().validate(fields if data is None else data)


def load_cluster(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> ClusterSpec:
    """A cluster spec file, as its backend's model; SpecError naming file, line and field of every problem."""
    return load.load_cluster(path, cluster_models(), overrides)


def backend_class(name: str) -> type[Backend]:
    """The Backend subclass registered as ``name``."""
    return _part(_registered(name).backend)


def planning(cluster: ClusterSpec) -> Planning:
    """What ``cluster``'s backend decides before anything runs (its capabilities, the plan's policy, defaults)."""
    return backend_class(cluster.backend).planning_class(cluster)


def get_backend(cluster: ClusterSpec) -> Backend:
    """A connected backend for ``cluster``."""
    return backend_class(cluster.backend)(cluster)


def plan_job(job: JobSpec, cluster: ClusterSpec, job_id: str, **options: Any) -> Plan:
    """``make_plan`` under the policy of ``cluster``'s backend (the options are ``make_plan``'s)."""
    return make_plan(job, cluster, job_id, policy=planning(cluster).plan_policy(job), **options)


__all__ = ["BACKENDS", "Backend", "backend_class", "cluster_models", "cluster_spec", "get_backend", "load_cluster", "plan_job", "planning"]
