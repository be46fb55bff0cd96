"""What every command prints the same way: a relayed line, a job's reason, the exit code of a job's end.

Text that can come from a rank (a relayed line, a failure reason) goes through ``safe_text``.
Only click is imported here: `launch --help` stays light.
"""

from __future__ import annotations

import sys

import click

from launcher.store.states import JobState
from launcher.views.terminal import safe_lines, safe_text

EXIT_CANCELLED = 130


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
