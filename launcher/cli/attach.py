"""`launch attach JOB`: supervise, here and in the foreground, a running job whose supervisor is gone.

Only click is imported at module level; the orchestration, the store and rich inside the command.
"""

from __future__ import annotations

import sys

import click

from launcher.cli.output import cancel_question, echo_reason, echo_safe_line, exit_for
from launcher.store.states import JobState


@click.command()
@click.argument("job")
@click.option("--cluster", "cluster_path", metavar="FILE",
              help="The cluster file the job runs on: attach from another machine or another store (LAUNCH_HOME); "
                   "a job this store does not know (give its full id) is read back from its nodes.")
@click.option("--takeover", is_flag=True,
              help="Take the job from a supervisor that is alive: it is fenced on every node and stops.")
def attach(job, cluster_path, takeover):
    """Follow JOB, whose supervisor is gone, to its end, as `launch submit` would have.

    A job belongs to its nodes, not to the terminal that started it: each node agent keeps a
    journal of what it reports and carries on when its supervisor dies (a laptop that slept, a
    closed SSH session, a killed `submit --detach`). `launch status` shows such a job as
    "unattended since HH:MM (no supervisor)". `launch attach` becomes its supervisor: it
    resumes every node's journal from the last line the store has (nothing lost, nothing
    twice: what the ranks printed meanwhile is shown and kept, their metrics stored), shows
    logs and progress as submit does, restarts as the job's policy says, and records how
    the job ended. As in submit, Ctrl-C asks before it cancels the job (on a pipe it
    cancels at once) and a closed terminal never ends it. Exit code: 0 SUCCEEDED, 1 FAILED,
    130 CANCELLED, 5 taken over in turn by a newer supervisor.

    A foreground supervisor whose terminal closed goes on in the background ("in the background
    since HH:MM" in `launch status`): a plain attach takes the job back from it.

    Exactly one supervisor decides. While the job's supervisor is alive, or another store's is in
    contact with the nodes, attach is refused (it says which: generation, host, PID, contact age;
    `launch status --watch JOB` follows the job from here); with --takeover it
    takes the job from it: a newer supervisor generation is recorded on every node, the old
    supervisor's streams and follows are refused, and it stops (no sweep, no cancel, no state
    written; it says "taken over by a newer supervisor ...", exit 5; a detached keeper does not
    restart it).

    --cluster FILE attaches from another machine, or another LAUNCH_HOME: a job this store does
    not know is read back from its nodes (each keeps its plan, specs and attempt, never a
    secret's value), imported with its whole history (logs and metrics fetched from the
    journals) and followed to its end. Refused while a supervisor follows it elsewhere, unless
    --takeover. Secrets the job names are read from this environment, as submit does: if some
    are missing, attach says which and follows the job without restarting it.

    Refused for a job that is not RUNNING, and on the Ray backend (local, SSH and Slurm can be
    followed again; --takeover and reading a job back from its nodes: local and SSH). Left
    alone, the node agents end the job themselves after watch.unattended_timeout seconds (job
    spec; default 1800, null: never); on Slurm the job's time limit bounds it, and on Ray the
    actors end it after that timeout.

    \b
    Examples:
      launch status                                   # RUNNING, unattended since 14:02 (no supervisor)
      launch attach cifar10-convnet-3f2a1c9e
      launch attach cifar10 > attach.log 2>&1 &       # a unique prefix of the id; plain lines on a pipe
      launch attach cifar10-convnet-3f2a1c9e --takeover          # from the supervisor on the laptop
      launch attach cifar10-convnet-3f2a1c9e --cluster lab.yaml  # on another machine
    """
    from launcher.errors import SupervisorFenced
    from launcher.run.attach import attach as attach_job
    from launcher.store.db import Store

    store = Store()
    view = None

    def attached(job_id: str, attempt: int) -> None:
        nonlocal view
        click.echo(f"job {job_id}: attached; following attempt {attempt}'s nodes from the lines the store has", err=True)
        from launcher.views.progress import open_progress  # live on a terminal, plain lines on a pipe

        row = store.job(job_id)
        view = open_progress(sys.stdout, max_steps=row.max_steps, nnodes=row.nnodes or 1)
        view.attach(store, job_id)

    try:
        job_id, state = attach_job(store, job, echo=lambda line: view.log(line) if view else echo_safe_line(line),
                                   warn=lambda text: click.echo(text, err=True), on_attached=attached,
                                   takeover=takeover, cluster_path=cluster_path, terminal=True,
                                   ask=cancel_question(lambda text: view.log(text) if view else click.echo(text, err=True)))
    except SupervisorFenced as exc:
        click.echo(exc.message, err=True)
        sys.exit(exc.exit_code)
    finally:
        if view is not None:
            view.close()
    click.echo(f"job {job_id}: {state}  (launch status {job_id})", err=True)
    if state != JobState.SUCCEEDED:
        echo_reason(store.job(job_id).reason)
    exit_for(state)
