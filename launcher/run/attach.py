"""`launch attach`: a running job supervised here to its end, its supervisor gone or taken over (``--takeover``),
or read back from its nodes (``--cluster``)."""

from __future__ import annotations

import dataclasses
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from launcher.backends import get_backend
from launcher.errors import LaunchError, PreflightError, SpecError
from launcher.run import identity
from launcher.run.cancel import RECORDS_ITSELF_S, supervisor_presence
from launcher.run.orchestrate import load_cluster_spec, make_supervisor
from launcher.run.recorded import RecordedJob
from launcher.spec.cluster import ClusterSpec
from launcher.store.db import Store
from launcher.store.states import JobState

if TYPE_CHECKING:
    from launcher.run.takeover import NodeGeneration

TAKEOVER_WAIT_S = 30.0  # how long a takeover waits for the supervisor it fenced to stop


def attach(
    store: Store, job_ref: str, *, echo: Callable[[str], None] | None, warn: Callable[[str], None] | None = None,
    on_attached: Callable[[str, int], None] | None = None, takeover: bool = False, cluster_path: str | None = None,
    terminal: bool = False, ask: Callable[[], bool] | None = None,
) -> tuple[str, JobState]:
    """Supervise a running job here, to its end (`launch attach`); (job id, final state).

    Refused (LaunchError, saying where it runs) while its supervisor is alive unless ``takeover``, while one is
    starting, for a job that is not RUNNING, and on a backend that cannot follow its nodes' journals. A job this
    store does not know is read back from its nodes with ``cluster_path`` (``takeover.import_job``). Before it
    follows, a newer supervisor generation is recorded on the nodes (``takeover.take``): an older supervisor,
    alive or not, is fenced. Every node is resumed from the journal lines the store has (``nodes.seen``); then it
    goes on as the job's own supervisor would have. SupervisorFenced if a newer one takes it in turn.
    """

    from launcher.errors import JobNotFound
    from launcher.run import takeover as fencing

    say = warn or (lambda text: None)
    imported: str | None = None
    followed: str | None = None  # imported while a supervisor elsewhere followed it (``who``): taken from that one
    try:
        job = RecordedJob.read(store, job_ref)
    except JobNotFound:
        if cluster_path is None:
            raise
        job, imported, followed = _import_from_nodes(store, job_ref, load_cluster_spec(cluster_path), takeover)
    else:
        if cluster_path is not None:
            fencing.on_cluster(job.cluster, load_cluster_spec(cluster_path), job.id)
    if job.state.terminal:
        raise LaunchError(f"job {job.id} already ended {job.state}; nothing to attach to",
                          hint=f"`launch status {job.id}` shows how it ended; `launch logs {job.id}` its logs")
    run_dir = store.run_dir(job.id)
    found = (identity.Presence(gone=f"imported from its nodes ({imported})") if imported
             else supervisor_presence(store, job.id))
    deadline = time.monotonic() + RECORDS_ITSELF_S
    while found.pid is None and found.gone is None and time.monotonic() < deadline:
        time.sleep(0.1)  # a detached supervisor that is still starting records itself in a moment
        found = supervisor_presence(store, job.id)
    where = identity.described(run_dir, job.id, job.supervisor_pid, None)
    at = f"process {where.pid or found.pid} on {where.host or 'this machine'}"
    background = found.pid is not None and where.terminal_closed is not None  # its terminal closed: it gives way
    if found.gone is None and not ((takeover or background) and found.pid is not None):
        of = "" if where.generation is None else f" (generation {where.generation})"
        raise LaunchError(f"job {job.id} has a supervisor: {at}{of} follows it; only one supervisor decides",
                          hint=f"`launch status --watch {job.id}` follows it from here; `launch attach {job.id} "
                               f"--takeover` takes the job from it; `launch cancel {job.id}` ends it")
    row = store.job(job.id)
    if row.state != JobState.RUNNING:
        raise LaunchError(f"job {job.id} is {row.state}: only a RUNNING job's nodes can be followed again"
                          + (f" (its supervisor is gone: {found.gone})" if found.gone else ""),
                          hint=f"`launch cancel {job.id}` ends whatever it started")
    backend = get_backend(job.cluster)
    can = backend.capabilities
    if not can.follows or ((takeover or background) and not can.fences):
        backend.close()
        what = "take from a live supervisor" if can.follows else "follow again"
        raise LaunchError(f"job {job.id} runs on the {job.plan.backend} backend, whose nodes `launch attach` cannot "
                          f"{what} yet (local and SSH can)" + (f"; its supervisor ({at}) goes on in the background"
                                                               if background else ""),
                          hint=f"`launch status --watch {job.id}` and `launch logs --follow {job.id}` follow it; "
                               f"`launch cancel {job.id}` ends it")
    takeover = takeover or background
    lock = open(run_dir / "attach.lock", "a")  # noqa: SIM115 - held until this process ends
    try:
        refused = backend.untrusted(job.plan)
        if refused:  # as submit's preflight: a host whose key changed is not followed (nor the job failed for it)
            raise PreflightError(f"job {job.id}: not attached; " + "; ".join(refused) + "; the job was left as it is",
                                 hint="if the new key is expected, `launch trust HOST --replace`, then attach again")
        generation = 0
        if can.fences:  # before the lock: the supervisor taken over may be an attach holding it
            nodes = fencing.read_generations(backend, job.plan)
            if not takeover and not imported:
                _refuse_if_followed(job.id, nodes, where.generation)
            generation = fencing.take(backend, job.plan, nodes, every_node=takeover, warn=say,
                                      store=identity.store_id(store.home))
        if found.pid is not None:  # taken from a live supervisor: it stops within a second or two
            _wait_gone(store, job.id, found.pid, say)
        _lock(lock, job.id, wait=TAKEOVER_WAIT_S if takeover else 0.0)
        again = supervisor_presence(store, job.id)
        if not imported and again.gone is None and again.pid != found.pid:  # another one took it meanwhile
            raise LaunchError(f"job {job.id} has a supervisor again (process {again.pid})")
        secrets = _attach_secrets(job, say)
        if secrets is None:
            job = dataclasses.replace(job, job=job.job.model_copy(update={"restarts": 0}))
        supervisor = make_supervisor(store, job.plan, job.job, job.cluster, job.check, backend, secrets or {},
                                     echo=echo, warn=warn, generation=generation)
        supervisor.install_signal_handlers(terminal=terminal, ask=ask)
        if found.pid is not None or followed is not None:
            taken_from = at if found.pid is not None else followed
            how = "`launch attach`" if background else "`launch attach --takeover`"
            whose = "its supervisor in the background, whose terminal closed" if background else "its supervisor"
            store.add_event(job.id, "takeover", f"{how} (process {os.getpid()} on {socket.gethostname()}) took the job "
                            f"from {whose} ({taken_from}) at generation {generation}",
                            {"generation": generation, "pid": os.getpid(), "from": taken_from})
        else:
            store.add_event(job.id, "attach", f"`launch attach` took the job (pid {os.getpid()}, generation "
                            f"{generation}); its supervisor was gone: {found.gone}", {"generation": generation})
    except BaseException:
        backend.close()
        lock.close()
        raise
    if on_attached is not None:
        on_attached(job.id, row.attempt or 0)
    try:
        return job.id, supervisor.attach(row.attempt or 0)
    finally:
        lock.close()


def _import_from_nodes(store: Store, job_id: str, cluster: ClusterSpec,
                       takeover: bool) -> tuple[RecordedJob, str, str | None]:
    """`attach --cluster` of a job this store does not know: read it back from its nodes and import it (refused
    while a supervisor follows it elsewhere, unless ``takeover``); (the job, where it was read, the supervisor
    that followed it, if one did)."""
    from launcher.run import takeover as fencing

    backend = get_backend(cluster)
    try:
        if not backend.capabilities.fences:
            raise LaunchError(f"job {job_id} is not in this store, and jobs on the {cluster.backend} backend cannot be "
                              "read back from their nodes yet (local and SSH clusters can)")
        found = fencing.parse_record(fencing.read_record(backend, cluster, job_id), job_id, cluster)
        nodes = fencing.read_generations(backend, found.job.plan)
        followed = fencing.in_contact(nodes)
        if followed is not None and not takeover:
            raise LaunchError(f"job {job_id} is followed by a supervisor elsewhere ({fencing.who(followed)}: node "
                              f"{followed.index} was in contact {(followed.answer or {}).get('contact_s', 0):.1f} s ago); only one "
                              "supervisor decides", hint=f"`launch attach {job_id} --cluster FILE --takeover` takes it")
    finally:
        backend.close()
    fencing.import_job(store, found, backend.host(found.job.plan, 0))
    return (found.job, f"node 0, {backend.host(found.job.plan, 0)}",
            None if followed is None else fencing.who(followed).partition(", ")[2])


def _refuse_if_followed(job_id: str, nodes: list[NodeGeneration], ours: int | None) -> None:
    """A plain attach asks the nodes who is in contact: a supervisor of another generation than this store's own
    (gone) one that followed a node within ``takeover.FRESH_CONTACT_S`` decides for the job (another store's, or one
    that took it from this store): refused, naming it; only ``--takeover`` fences it."""
    from launcher.run import takeover as fencing

    followed = fencing.in_contact(nodes)
    if followed is None or followed.generation == (ours or 0):
        return
    contact = (followed.answer or {}).get("contact_s", 0)
    raise LaunchError(f"job {job_id} is followed by another supervisor ({fencing.who(followed)}: node "
                      f"{followed.index} was in contact {contact:.1f} s ago); only one supervisor decides",
                      hint=f"`launch attach {job_id} --takeover` takes the job from it; `launch cancel {job_id}` "
                           "ends it")


def _wait_gone(store: Store, job_id: str, pid: int, warn: Callable[[str], None]) -> None:
    """Wait (TAKEOVER_WAIT_S at most) for the supervisor ``pid`` that was just fenced to stop writing the store."""
    deadline = time.monotonic() + TAKEOVER_WAIT_S
    while time.monotonic() < deadline:
        if supervisor_presence(store, job_id).pid != pid:
            return
        time.sleep(0.1)
    warn(f"warning: job {job_id}: its former supervisor (process {pid}) has not stopped after {TAKEOVER_WAIT_S:g} s; "
         "it is fenced on every node and decides nothing, but lines it still relays may be stored twice")


def _lock(lock, job_id: str, wait: float) -> None:
    """Take the job's attach lock, waiting up to ``wait`` seconds (a takeover waits for the attach it fenced)."""
    import fcntl

    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise LaunchError(f"job {job_id}: another `launch attach` is taking it now") from None
            time.sleep(0.1)


def _attach_secrets(job: RecordedJob, warn: Callable[[str], None]) -> dict[str, str] | None:
    """The job's secrets from this machine's environment, as submit reads them. They matter only if the job
    restarts: when some are missing, that is said and None returned (the job is followed, never restarted here)."""
    from launcher.run.secrets import read_secrets

    if not job.plan.secrets:
        return {}
    try:
        return read_secrets(job.plan.secrets)
    except SpecError as exc:
        warn(f"warning: {exc.message}; the job is followed to its end but not restarted from here (a restart "
             "would start its ranks without them)")
        return None
