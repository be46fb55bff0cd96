"""`launch queue`: the leases of a cluster's nodes and the jobs waiting for them."""

from __future__ import annotations

import json

import click

from launcher.cli.output import CLUSTER_HELP


@click.command("queue")
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False), help=CLUSTER_HELP)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--set-up", "set_up", is_flag=True,
              help="As root, once on a shared node: make the lease directory and every lock file root's, so that no "
                   "other user can remove or plant one (docs/LEASES.md).")
def queue_command(cluster_file, as_json, set_up):
    """Who holds each GPU (or CPU slot) of every node, since when, and which jobs wait, in order.

    On local and SSH clusters each GPU or slot is leased to one job at a time by
    the job's node agent (docs/LEASES.md); a job submitted with --wait (or
    queue: wait) waits for its turn. Every node is asked at once. A holder
    whose ranks report steps shows its step and ETA, whoever's job it is
    (its node agents record them).

    \b
    Examples:
      launch queue
      launch queue --cluster examples/clusters/a800.yaml
      launch queue --cluster cluster.yaml --json
      sudo launch queue --set-up                    once, on a shared node
    """
    from launcher.run import queue
    from launcher.run.orchestrate import load_cluster_spec
    from launcher.views.terminal import safe_text

    nodes, waiting = queue.read_queue(load_cluster_spec(cluster_file), set_up)
    if as_json:
        click.echo(json.dumps(queue.queue_json(nodes, waiting), indent=2))
        return
    for line in queue.queue_lines(nodes, waiting):
        click.echo(safe_text(line))
