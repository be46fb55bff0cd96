"""A detached supervisor: ``python -m launcher.run.detached JOB_ID`` runs a recorded job to its end.

`launch submit --detach` records the job (plan, specs) in the store and starts this in a session
of its own, so it survives the submitting shell. Whatever fails before the supervisor runs (a
record that cannot be read, a secret missing, a backend that cannot be made) ends the job FAILED
with that reason, never a job left PENDING; once it runs, the supervisor's own finish does.
"""

from __future__ import annotations

import sys
import traceback

from launcher.backends import Backend, get_backend
from launcher.run.orchestrate import end_unsupervised, make_supervisor
from launcher.run.recorded import RecordedJob
from launcher.run.secrets import read_secrets
from launcher.store.db import Store
from launcher.store.states import JobState
from launcher.views.watch import stage_recorder


def main(argv: list[str]) -> int:
    job_id = argv[0]
    backend: Backend | None = None
    try:
        store = Store()
    except Exception:  # noqa: BLE001 - no store, no job to end: say it in supervisor.log
        traceback.print_exc()
        return 1
    try:
        job = RecordedJob.read(store, job_id)
        secrets = read_secrets(job.plan.secrets)
        backend = get_backend(job.cluster)
        supervisor = make_supervisor(store, job.plan, job.job, job.cluster, job.check, backend, secrets,
                                     stage=stage_recorder(store, job.id))
        supervisor.install_signal_handlers()
    except Exception as exc:  # noqa: BLE001 - the job must end, whatever kept its supervisor from starting
        traceback.print_exc()
        try:
            if backend is not None:
                backend.close()
        finally:
            end_unsupervised(store, job_id, f"the detached supervisor could not start: {exc}")
        return 1
    return 0 if supervisor.run() == JobState.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
