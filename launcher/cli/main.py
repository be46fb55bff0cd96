"""The `launch` command line: parse, call, render. The one place errors become exit codes.

Heavy modules (torch, deepspeed, ray, and even pydantic for `status`) are
imported inside the commands that need them, so `launch --help` and
`launch status` stay fast.
"""

from __future__ import annotations

import sys

import click

from launcher.cli.lazy import LazyGroup
from launcher.cli.output import EXIT_CANCELLED
from launcher.errors import LaunchError

# Each command lives in its own module (which imports only click at module level) and is imported when used:
# `launch status` loads launcher.cli.jobs alone.
COMMANDS = {
    "submit": "launcher.cli.submit:submit",
    "resubmit": "launcher.cli.submit:resubmit",
    "plan": "launcher.cli.submit:plan_command",
    "status": "launcher.cli.jobs:status",
    "logs": "launcher.cli.jobs:logs",
    "cancel": "launcher.cli.jobs:cancel",
    "stacks": "launcher.cli.jobs:stacks_command",
    "attach": "launcher.cli.attach:attach",
    "check": "launcher.cli.specs:check",
    "validate": "launcher.cli.specs:validate",
    "schema": "launcher.cli.specs:schema",
    "queue": "launcher.cli.queue:queue_command",
    "clean": "launcher.cli.clean:clean_command",
    "trust": "launcher.cli.trust:trust",
    "init": "launcher.cli.init:init",
    "metrics": "launcher.cli.metrics:metrics",
    "compare": "launcher.cli.metrics:compare",
    "bench": "launcher.cli.metrics:bench",
    "report": "launcher.cli.metrics:report",
    "completion": "launcher.cli.completion:completion",
    "dashboard": "launcher.cli.dashboard:dashboard",
}


@click.group(
    cls=LazyGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  launch submit jobs/cifar10_convnet.yaml            run on the local cluster, stream logs
  launch submit jobs/bert_large_zero3.yaml --cluster examples/clusters/a800.yaml --dry-run
  launch submit jobs/cifar10_convnet.yaml --set resources.nproc_per_node=4 --detach
  launch status                                        all jobs; `launch status JOB` for one
  launch status JOB --watch                            live progress of a detached job
  launch resubmit JOB --set max_steps=200              the same job again, one value changed
  launch logs JOB --node 1 --rank 3 --follow
  launch attach JOB                                    supervise a job whose supervisor is gone
  launch cancel JOB""",
)
@click.version_option(package_name="launch")
def cli() -> None:
    """Launch, watch and compare multi-node PyTorch training.

    A job spec (YAML) says what to train and how; a cluster spec (cluster.yaml,
    default: this machine) says where. `launch` validates both, plans the run
    (per-node torchrun/deepspeed command, rendezvous, batch arithmetic), checks
    every host, starts every node, streams logs, and keeps state, logs and
    metrics in a job store (~/.launch, or $LAUNCH_HOME).
    """


def quiet_libraries() -> None:
    """Keep paramiko's own log records (its transport thread logs a whole traceback for a host that
    answers with something else than SSH) off the console: launch reports the problem in one line."""
    import logging

    paramiko_log = logging.getLogger("paramiko")
    paramiko_log.addHandler(logging.NullHandler())
    paramiko_log.propagate = False


def main(argv: list[str] | None = None) -> None:
    """Console entry point: run the CLI, print LaunchErrors as one paragraph, exit with their code."""
    quiet_libraries()
    try:
        cli.main(args=argv, prog_name="launch", standalone_mode=False)
    except LaunchError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(EXIT_CANCELLED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(0)
