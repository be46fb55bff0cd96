"""`launch clean`: remove this user's run directories on a cluster's nodes, those never collected (docs/JOURNALS.md
"Run directories")."""

from __future__ import annotations

import sys
import time

import click

from launcher.cli.output import CLUSTER_HELP


@click.command("clean")
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), help=CLUSTER_HELP)
@click.option("--older-than", "older_than", default="0s", show_default=True, metavar="AGE",
              help="Only run directories unchanged for this long: 30s, 10m, 2h, 7d.")
@click.option("--job", "job_id", metavar="JOB", help="Only this job's run directory.")
@click.option("--dry-run", is_flag=True, help="List what would be removed; remove nothing.")
def clean_command(cluster_file, older_than, job_id, dry_run):
    """Remove your run directories on every node of a cluster in which no agent runs.

    A job's run directory on a node (journal, record, the ranks' directory)
    goes once every job store that followed the job there has filed it. One
    never collected (a supervisor that never came back, a node unreachable at
    the end) stays for `launch attach`; a new job of yours on the node removes
    those untouched for 7 days. This removes them now. A directory an agent
    still runs in is kept and named.

    \b
    Examples:
      launch clean --dry-run
      launch clean --cluster examples/clusters/a800.yaml --older-than 1d
      launch clean --job cifar10-convnet-3f2a1c9e
    """
    from launcher.run.clean import clean
    from launcher.run.orchestrate import load_cluster_spec
    from launcher.views.logs import parse_since
    from launcher.views.terminal import safe_text

    try:
        older_than_s = max(0.0, time.time() - parse_since(older_than))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    failed = False
    for node in clean(load_cluster_spec(cluster_file), older_than_s, job_id, dry_run):
        if node.error:
            failed = True
            click.echo(safe_text(f"{node.host}: not cleaned: {node.error}"), err=True)
            continue
        verb = "would remove" if dry_run else "removed"
        click.echo(safe_text(f"{node.host}: {verb} {len(node.removed)} run director{'y' if len(node.removed) == 1 else 'ies'}"
                             + (f" ({', '.join(node.removed)})" if node.removed else "")))
        for name, why in node.kept.items():
            click.echo(safe_text(f"{node.host}: kept {name}: {why}"))
    if failed:
        sys.exit(1)
