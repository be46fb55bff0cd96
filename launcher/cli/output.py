"""What every command prints the same way: a relayed line, a job's reason, the exit code of a job's end.

Text that can come from a rank (a relayed line, a failure reason) goes through ``safe_text``.
Only click is imported here: `launch --help` stays light.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import click

from launcher.store.states import JobState
from launcher.views.terminal import safe_lines, safe_text

EXIT_CANCELLED = 130
CLUSTER_HELP = "Cluster spec (default: $LAUNCH_CLUSTER, else $LAUNCH_HOME/cluster.yaml, else ./cluster.yaml, else this machine)."


def echo_line(line: str) -> None:
    """One line on stdout, as given (callers make it safe), flushed: a pipe sees it at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def echo_safe_line(line: str) -> None:
    """One relayed line on stdout, its control sequences (but plain colour) made visible."""
    echo_line(safe_text(line))


def echo_reason(reason: str | None) -> None:
    """Say on stderr why a job did not succeed, so nobody has to ask ``launch status``."""
    if reason:
        click.echo(f"  reason: {safe_lines(reason, colour=False)}", err=True)


def exit_for(state: JobState | None) -> None:
    """Exit as a foreground job ends: 0 SUCCEEDED (returns), 130 CANCELLED, 1 otherwise."""
    if state != JobState.SUCCEEDED:
        sys.exit(EXIT_CANCELLED if state == JobState.CANCELLED else 1)


CANCEL_QUESTION = ("cancel the job? [y/N] (Ctrl-C again: yes; the job does not need this terminal: "
                   "`launch submit --detach` next time) ")


def cancel_question(say: Callable[[str], None] | None = None) -> Callable[[], bool] | None:
    """Ctrl-C's question on a terminal: a function that asks on stderr (or through ``say``, the live view) and reads
    the answer from stdin; True for yes. None where stdin is not a terminal (a pipe, CI): there Ctrl-C cancels at once,
    as SIGINT does for any command."""
    if not sys.stdin.isatty():
        return None

    def ask() -> bool:
        if say is not None:
            say(CANCEL_QUESTION)
        else:
            click.echo("\n" + CANCEL_QUESTION, err=True, nl=False)
        yes = _answer().strip().lower() in (b"y", b"yes")
        click.echo("cancelling the job" if yes else "the job goes on", err=True)
        return yes

    return ask


def _answer() -> bytes:
    """One line from stdin, read from its descriptor: the question's thread may still wait when the job ends, and a
    daemon thread holding ``sys.stdin``'s lock would abort the interpreter's exit. Empty at end of input."""
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 1024)
        if not chunk:
            break
        line += chunk
    return line
