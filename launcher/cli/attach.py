"""`launch attach JOB`: supervise, here and in the foreground, a running job whose supervisor is gone.

Only click is imported at module level; the orchestration, the store and rich inside the command.
"""

from __future__ import annotations

import sys

import click

from launcher.cli.output import echo_reason, echo_safe_line, exit_for


@click.command()
@click.argument("job")
def attach(job):
    """Follow JOB, whose supervisor is gone, to its end, as `launch submit` would have.

    A job belongs to its nodes, not to the terminal that started it: each node agent keeps a
    journal of what it reports and carries on when its supervisor dies (a laptop that slept, a
    closed SSH session, a killed `submit --detach`). `launch status` shows such a job as
    "unattended since HH:MM (no supervisor)". `launch attach` becomes its supervisor: it
    resumes every node's journal from the last line the store has (nothing lost, nothing
    twice: what the ranks printed meanwhile is shown and kept, their metrics stored), shows
    logs and progress as submit does, restarts as the job's policy says, and records how
    the job ended. Ctrl-C cancels the job, as in submit. Exit code: 0 SUCCEEDED, 1 FAILED,
    130 CANCELLED.

    Refused while the job's supervisor is alive (it says where: host and PID; `launch status
    --watch JOB` follows that one), for a job that is not RUNNING, and on the Ray backend
    (local, SSH and Slurm can be followed again). Left alone, the node agents end the job
    themselves after watch.unattended_timeout seconds (job spec; default 1800, null: never);
    on Slurm the job's time limit bounds it, and on Ray the actors end it after that timeout.

    \b
    Examples:
      launch status                                   # RUNNING, unattended since 14:02 (no supervisor)
      launch attach cifar10-convnet-3f2a1c9e
      launch attach cifar10 > attach.log 2>&1 &       # a unique prefix of the id; plain lines on a pipe
    """
    from launcher.run import orchestrate
    from launcher.store.db import Store

    store = Store()
    view = None
    if sys.stdout.isatty():
        from launcher.views.progress import open_progress

        row = store.job(job)
        view = open_progress(sys.stdout, max_steps=row["max_steps"], nnodes=row["nnodes"] or 1, plain=False)

    def attached(job_id: str, attempt: int) -> None:
        click.echo(f"job {job_id}: attached; following attempt {attempt}'s nodes from the lines the store has", err=True)
        if view is not None:
            view.attach(store, job_id)

    try:
        job_id, state = orchestrate.attach(store, job, echo=view.log if view else echo_safe_line,
                                           warn=lambda text: click.echo(text, err=True), on_attached=attached)
    finally:
        if view is not None:
            view.close()
    click.echo(f"job {job_id}: {state}  (launch status {job_id})", err=True)
    if state != "SUCCEEDED":
        echo_reason(store.job(job_id).get("reason"))
    exit_for(state)
