"""A job as the store keeps it, read back as typed values: what a detached supervisor and `launch cancel` need."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from launcher.backends import cluster_spec
from launcher.errors import LaunchError
from launcher.plan.planner import Plan
from launcher.spec.cluster import ClusterSpec
from launcher.spec.job import JobSpec
from launcher.store.db import Store
from launcher.store.states import JobState

ORIGIN_KEYS = ("submitted", "overrides", "resubmit_of")  # what a job was submitted as: kept through its re-plans


@dataclass(frozen=True)
class Origin:
    """How a job came to be: the ``--set`` overrides it was submitted with (secret values masked) and the job it runs
    again (`launch resubmit`)."""

    overrides: tuple[str, ...] = ()
    resubmit_of: str | None = None


def stored_spec(job: JobSpec, cluster: ClusterSpec, run_check: bool, origin: Origin = Origin()) -> dict[str, Any]:
    """What the store keeps of a job's specs: enough for a detached supervisor, `cancel` and a re-plan (``job``, what
    runs now), and what it was submitted as (``submitted``: the effective spec, its overrides applied; the
    ``overrides``; ``resubmit_of``), for `status --json` and `launch resubmit`. Secrets are names here, never values."""
    dumped = job.model_dump(mode="json")
    return {"job": dumped, "cluster": cluster.model_dump(mode="json"), "check": run_check, "submitted": dumped,
            "overrides": list(origin.overrides), "resubmit_of": origin.resubmit_of}


def replanned_spec(previous: dict[str, Any] | None, job: JobSpec, cluster: ClusterSpec, run_check: bool) -> dict[str, Any]:
    """The stored spec of a job re-planned on other nodes (``job`` and ``cluster`` what it runs on now), what it was
    submitted as kept from ``previous``."""
    kept = {key: value for key, value in (previous or {}).items() if key in ORIGIN_KEYS}
    return {**stored_spec(job, cluster, run_check), **kept}


@dataclass(frozen=True)
class RecordedJob:
    """One stored job: its id and state, its plan and specs, whether submit checked versions, its supervisor's PID."""

    id: str
    state: JobState
    plan: Plan
    job: JobSpec
    cluster: ClusterSpec
    check: bool
    supervisor_pid: int | None

    @classmethod
    def read(cls, store: Store, ref: str) -> RecordedJob:
        """The job ``ref`` names (an id or its unique prefix); LaunchError if its record cannot be read back."""
        row = store.job(ref)
        spec = row.spec or {}
        if row.state is None:
            raise LaunchError(f"job {row.id}: its stored state is not one this launch knows")
        try:
            return cls(id=row.id, state=row.state, plan=Plan.model_validate(row.plan),
                       job=JobSpec.model_validate(spec.get("job")), cluster=cluster_spec(spec.get("cluster")),
                       check=spec.get("check", True) is not False, supervisor_pid=row.supervisor_pid)
        except (ValidationError, ValueError) as exc:
            raise LaunchError(f"job {row.id}: its stored record cannot be read back: {exc}") from None
