"""`launch resubmit`: a stored job run again as a new job, from the spec it was submitted with (its overrides
applied), with new ``--set`` overrides on top, on its own cluster or another one."""

from __future__ import annotations

import dataclasses

from pydantic import ValidationError

from launcher.backends import cluster_spec
from launcher.errors import LaunchError
from launcher.run.orchestrate import Prepared, find_cluster_file, load_cluster_spec, prepare_job
from launcher.run.recorded import Origin
from launcher.spec.load import job_from_data
from launcher.store.db import Store


def prepare_again(store: Store, ref: str, overrides: tuple[str, ...], cluster_path: str | None) -> Prepared:
    """The job ``ref`` names, planned again as a new job: its submitted spec with ``overrides`` applied (a problem is a
    SpecError naming the override), on ``cluster_path`` when given, else on the cluster it ran on."""
    row = store.job(ref)
    spec = row.spec or {}
    submitted = spec.get("submitted") or spec.get("job")  # a job stored before `submitted` was kept: what it ran
    if not isinstance(submitted, dict):
        raise LaunchError(f"job {row.id}: its stored spec cannot be read back; submit its job file again")
    job = job_from_data(submitted, f"job {row.id}", overrides)
    if cluster_path is not None:
        cluster_file = find_cluster_file(cluster_path)
        cluster = load_cluster_spec(cluster_file)
    else:
        try:
            cluster = cluster_spec(spec.get("cluster"))
        except (ValidationError, ValueError) as exc:
            raise LaunchError(f"job {row.id}: its stored cluster cannot be read back ({exc}); give --cluster FILE") from None
        cluster_file = f"the cluster job {row.id} ran on"
    prepared = prepare_job(job, cluster)
    return dataclasses.replace(prepared, cluster_file=cluster_file, origin=Origin(overrides, row.id))
