"""A detached supervisor: ``python -m launcher.run.detached JOB_ID`` runs a recorded job to its end.

`launch submit --detach` records the job (plan, specs) in the store and starts this in a session
of its own, so it survives the submitting shell.
"""

from __future__ import annotations

import sys

from launcher.backends import get_backend
from launcher.plan.planner import Plan
from launcher.run.orchestrate import placer, replanner
from launcher.run.secrets import read_secrets
from launcher.run.supervisor import Supervisor
from launcher.spec.cluster import ClusterSpec
from launcher.spec.job import JobSpec
from launcher.store.db import Store
from launcher.store.states import JobState
from launcher.views.watch import stage_recorder


def main(argv: list[str]) -> int:
    store = Store()
    row = store.job(argv[0])
    plan = Plan.model_validate(row["plan"])
    cluster = ClusterSpec.model_validate(row["spec"]["cluster"])
    job = JobSpec.model_validate(row["spec"]["job"])
    run_check = row["spec"].get("check", True)
    supervisor = Supervisor(
        store, plan, get_backend(cluster), stage=stage_recorder(store, plan.job_id),
        secrets=read_secrets(plan.secrets), grace=job.watch.grace_period,
        restarts=job.restarts, restart_on=job.restart_on, stall_timeout=job.watch.stall_timeout,
        replan=replanner(job, cluster, store, run_check) if job.leave_out_failed_nodes else None,
        place=placer(job, cluster),
    )
    supervisor.install_signal_handlers()
    return 0 if supervisor.run() == JobState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
