"""Shell completion for bash, zsh and fish, through click's own mechanism.

`launch completion SHELL` prints the script to source. The shell then runs `launch` with
``_LAUNCH_COMPLETE=<shell>_complete`` for each completion; click answers from the command tree,
and every JOB argument completes job ids from the store (newest first). Nothing heavy is
imported on that path: click, sqlite3 and the store module.
"""

from __future__ import annotations

import click
from click.shell_completion import CompletionItem, get_completion_class

SHELLS = ("bash", "zsh", "fish")
JOB_ARGUMENTS = ("job", "jobs")
COMPLETE_VAR = "_LAUNCH_COMPLETE"
MAX_IDS = 100


class JobIdType(click.ParamType):
    """A job id or a unique prefix of one (a string); completes from the job store."""

    name = "job"

    def convert(self, value, param, ctx):
        return value

    def shell_complete(self, ctx, param, incomplete):
        from launcher.store.db import Store, launch_home

        if not (launch_home() / "jobs.db").exists():
            return []
        store = Store()
        try:
            return [CompletionItem(job_id, help=state) for job_id, state in store.job_ids(incomplete, MAX_IDS)]
        finally:
            store.close()


JOB_ID = JobIdType()


def complete_job_arguments(command: click.Command) -> None:
    """Give a command's JOB (or JOBS) argument job-id completion: commands need nothing in their own module."""
    for param in command.params:
        if isinstance(param, click.Argument) and param.name in JOB_ARGUMENTS and param.type is click.STRING:
            param.type = JOB_ID


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx, shell):
    """Print the completion script for SHELL (bash, zsh or fish): commands, options and job ids complete
    on Tab.

    Source it from your shell's startup file (bash 4.4 or later). Job ids complete from the
    job store ($LAUNCH_HOME, default ~/.launch), newest first; type the start of a name or id.

    \b
    Examples:
      launch completion bash >> ~/.bashrc       # or: eval "$(launch completion bash)"
      eval "$(launch completion zsh)"           # in ~/.zshrc, after compinit
      launch completion fish > ~/.config/fish/completions/launch.fish
    """
    root = ctx.find_root().command
    script = get_completion_class(shell)(root, {}, "launch", COMPLETE_VAR).source()
    click.echo(script)
