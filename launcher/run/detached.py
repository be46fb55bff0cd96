"""A detached supervisor: ``python -m launcher.run.detached JOB_ID`` runs a recorded job to its end.

`launch submit --detach` records the job (plan, specs) in the store and starts this in a session
of its own, so it survives the submitting shell. It is a small keeper: the supervisor itself runs
as its child (``--supervise``). When that child dies while the job has not ended (an OOM kill, a
crash, a stray ``kill -9``), the keeper files why, sends the job's ``unattended`` notice and starts
a new child that attaches to the job's node journals (``--attach``), at most ``MAX_REATTACH``
times: the nodes never noticed, each line is kept once. A child that a newer supervisor took the job
from (`launch attach --takeover`) exits ``FENCED_EXIT``, saying so: the keeper then stops too, and
starts nothing. The keeper imports no torch, holds no node connection and decides nothing about the job.

Whatever fails before a supervisor runs (a record that cannot be read, a secret missing, a backend
that cannot be made) ends the job FAILED with that reason, never a job left PENDING; once it runs,
the supervisor's own finish does.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable

from launcher.backends import Backend, get_backend
from launcher.errors import FENCED_EXIT, SupervisorFenced
from launcher.run import identity
from launcher.run.attach import attach
from launcher.run.cancel import MAX_REATTACH
from launcher.run.orchestrate import end_unsupervised, make_supervisor
from launcher.run.recorded import RecordedJob
from launcher.run.secrets import read_secrets
from launcher.store.db import Store
from launcher.store.states import JobState
from launcher.views.watch import STAGE_EVENT

SUPERVISE, ATTACH = "--supervise", "--attach"


def main(argv: list[str]) -> int:
    job_id, mode = argv[0], (argv[1] if len(argv) > 1 else None)
    try:
        store = Store()
    except Exception:  # noqa: BLE001 - no store, no job to end: say it in supervisor.log
        traceback.print_exc()
        return 1
    if mode == SUPERVISE:
        return supervise(store, job_id)
    if mode == ATTACH:
        return reattach(store, job_id)
    return keep(store, job_id)


def keep(store: Store, job_id: str) -> int:
    """Run the job's supervisor as a child; start one that re-attaches when it dies before the job ends."""
    identity.record_keeper(store.run_dir(job_id), job_id)  # `logs --follow` and `status --watch` wait while it lives
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # no terminal to lose; its children inherit this
    child = _child(job_id, SUPERVISE)
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    for restart in range(1, MAX_REATTACH + 2):
        code = child.wait()
        if code == FENCED_EXIT:  # taken over by a newer supervisor: it decides now, nothing to restart
            return FENCED_EXIT
        row = store.job(job_id)
        if row.terminal:
            return 0 if row.state == JobState.SUCCEEDED else 1
        died = f"the detached supervisor (PID {child.pid}) {_how(code)} while the job was {row.state}"
        if row.state == JobState.PENDING:
            end_unsupervised(store, job_id, f"{died}; nothing had been started")
            return 1
        if row.state != JobState.RUNNING or restart > MAX_REATTACH:
            why = (f"{died}; not restarted again after {MAX_REATTACH} restarts" if restart > MAX_REATTACH
                   else f"{died}, before its nodes could be followed again")
            store.add_event(job_id, "supervisor_lost", f"{why}: the node agents end the job after "
                            f"watch.unattended_timeout unless `launch attach {job_id}` takes it")
            _notify_unattended(store, job_id, why)
            return 1
        said = f"{died}; a new one re-attaches to the nodes' journals (restart {restart} of {MAX_REATTACH})"
        store.add_event(job_id, "supervisor_restarted", said)
        _notify_unattended(store, job_id, said)
        time.sleep(2 ** (restart - 1))  # a supervisor that dies at once must not spin
        child = _child(job_id, ATTACH)
    return 1


def supervise(store: Store, job_id: str) -> int:
    """Supervise the recorded job from its start (the keeper's first child)."""
    backend: Backend | None = None
    try:
        job = RecordedJob.read(store, job_id)
        secrets = read_secrets(job.plan.secrets)
        backend = get_backend(job.cluster)
        supervisor = make_supervisor(store, job.plan, job.job, job.cluster, job.check, backend, secrets,
                                     warn=_say, stage=stage_recorder(store, job.id))
        supervisor.install_signal_handlers()
    except Exception as exc:  # noqa: BLE001 - the job must end, whatever kept its supervisor from starting
        traceback.print_exc()
        try:
            if backend is not None:
                backend.close()
        finally:
            end_unsupervised(store, job_id, f"the detached supervisor could not start: {exc}")
        return 1
    try:
        return 0 if supervisor.run() == JobState.SUCCEEDED else 1
    except SupervisorFenced as exc:
        return _fenced(exc)


def reattach(store: Store, job_id: str) -> int:
    """Supervise the job again from its nodes' journals, as `launch attach` does (a later child of the keeper)."""
    try:
        _, state = attach(store, job_id, echo=None, warn=_say)
    except SupervisorFenced as exc:
        return _fenced(exc)
    except Exception:  # noqa: BLE001 - the keeper reads the job's state and says what happened
        traceback.print_exc()
        return 1
    return 0 if state == JobState.SUCCEEDED else 1


def _say(text: str) -> None:
    """A line of the supervisor's own (its warnings and ``[launch]`` decisions) in supervisor.log."""
    print(text, file=sys.stderr, flush=True)


def _fenced(exc: SupervisorFenced) -> int:
    """Say in supervisor.log that a newer supervisor took the job; the keeper's code not to restart this one."""
    print(exc.message, file=sys.stderr, flush=True)
    return FENCED_EXIT


def _child(job_id: str, mode: str) -> subprocess.Popen:
    """A supervisor process for the job, writing where the keeper writes (supervisor.log)."""
    return subprocess.Popen([sys.executable, "-P", "-m", "launcher.run.detached", job_id, mode], stdin=subprocess.DEVNULL)


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with {code}"


def _notify_unattended(store: Store, job_id: str, reason: str) -> None:
    """The job's ``unattended`` notice (``notify:``); a notifier's problem is the job's event."""
    from launcher.run.notify import Notifier

    try:
        job = RecordedJob.read(store, job_id)
        if job.job.notify is None:
            return
        notifier = Notifier(job.job.notify, read_secrets(job.plan.secrets))
        notifier.tell(store, job_id, job.plan.job_name, "unattended", store.state(job_id), reason)
    except Exception as exc:  # noqa: BLE001 - a notice never stops the keeper
        store.add_event(job_id, "notify_failed", f"the unattended notice could not be sent: {exc!r}")


def stage_recorder(store: Store, job_id: str) -> Callable[..., None]:
    """A stage sink (``sink(stage, node, host, state, detail="")``) that files each change as a ``stage``
    event, for a supervisor whose job is watched from elsewhere (`launch status --watch`)."""

    def record(stage: str, node: int | None, host: str, state: str, detail: str = "") -> None:
        data = {"stage": str(stage), "node": node, "host": host, "state": str(state), "detail": detail}
        where = "" if node is None else f" node {node} ({host})"  # a stage of the whole job (queued) has no node
        store.add_event(job_id, STAGE_EVENT, f"{stage}{where}: {state}{f' ({detail})' if detail else ''}", data)

    return record


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

