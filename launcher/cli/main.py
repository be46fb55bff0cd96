"""The `launch` command line: parse, call, render. The one place errors become exit codes.

Heavy modules (torch, deepspeed, ray, and even pydantic for `status`) are
imported inside the commands that need them, so `launch --help` and
`launch status` stay fast.
"""

from __future__ import annotations

import sys

import click

from launcher.cli.output import EXIT_CANCELLED
from launcher.errors import LaunchError


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  launch submit jobs/cifar10_convnet.yaml            run on the local cluster, stream logs
  launch submit jobs/bert_large_zero3.yaml --cluster examples/clusters/a800.yaml --dry-run
  launch submit jobs/cifar10_convnet.yaml --set resources.nproc_per_node=4 --detach
  launch status                                        all jobs; `launch status JOB` for one
  launch status JOB --watch                            live progress of a detached job
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


# Commands defined in their own modules (each imports only click at module level).
# One import and one add_command line per command, in this block.
from launcher.cli.submit import plan_command, submit  # noqa: E402

cli.add_command(submit)
from launcher.cli.jobs import cancel, logs, stacks_command, status  # noqa: E402

cli.add_command(status)
cli.add_command(plan_command)
cli.add_command(logs)
cli.add_command(cancel)
cli.add_command(stacks_command)
from launcher.cli.attach import attach  # noqa: E402

cli.add_command(attach)
from launcher.cli.specs import check, schema, validate  # noqa: E402

cli.add_command(check)
cli.add_command(validate)
cli.add_command(schema)
from launcher.cli.queue import queue_command  # noqa: E402

cli.add_command(queue_command)
from launcher.cli.trust import trust  # noqa: E402

cli.add_command(trust)
from launcher.cli.init import init  # noqa: E402

cli.add_command(init)
from launcher.cli.metrics import bench as bench_command  # noqa: E402
from launcher.cli.metrics import compare as compare_command  # noqa: E402
from launcher.cli.metrics import metrics as metrics_command  # noqa: E402
from launcher.cli.metrics import report as report_command  # noqa: E402

cli.add_command(metrics_command)
cli.add_command(compare_command)
cli.add_command(bench_command)
cli.add_command(report_command)


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


# Shell completion: `launch completion SHELL`; every JOB argument completes job ids (keep this last).
from launcher.cli.completion import complete_job_arguments, completion  # noqa: E402

cli.add_command(completion)
complete_job_arguments(cli)
