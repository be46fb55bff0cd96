"""``launch trust HOST...``: record SSH host keys in known_hosts after showing their fingerprints.

The ``ssh`` backend accepts only hosts whose key is already in the cluster's
known_hosts file. This command fetches each host's key (in parallel, without
logging in), prints its SHA256 fingerprint (compare it with the one the host's
administrator gives you, or with ``ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub``
on the host) and appends it after you confirm. A host whose recorded key
differs is refused unless ``--replace`` is given.

Only click is imported at module level, so ``launch --help`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    import paramiko

    from launcher.backends.ssh.settings import SSHSettings
    from launcher.backends.ssh.target import Target


@click.command()
@click.argument("hosts", nargs=-1, metavar="[HOST]...")
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False),
              help="Use this cluster's ssh settings (known_hosts, ports, users); no HOST: all its nodes.")
@click.option("--yes", "-y", is_flag=True, help="Record the keys without asking.")
@click.option("--replace", is_flag=True, help="Replace a recorded key that differs (the host was reinstalled).")
def trust(hosts, cluster_file, yes, replace):
    """Show the SSH host keys of HOST... and record them in known_hosts.

    HOST is a name, an address or a ~/.ssh/config alias. Without --cluster the
    defaults apply: ~/.ssh/known_hosts, ~/.ssh/config, port 22.

    \b
    Examples:
      launch trust gpu-01 gpu-02
      launch trust --cluster examples/clusters/a800.yaml
      launch trust gpu-02 --replace          after gpu-02 was reinstalled
    """
    from launcher.backends.ssh.connection import Pool, error_text, fan_out
    from launcher.backends.ssh.trust import fetch_host_key
    from launcher.errors import LaunchError

    settings, targets = _targets(hosts, cluster_file)
    pool = Pool(settings, settings.spec.connect_timeout)
    try:
        results = fan_out(lambda target: fetch_host_key(target, pool), targets, settings.fanout)
    finally:
        pool.close()
    failed = [error_text(result.failure) if not result.ok else _trust_key(settings, result.key, result.got, yes, replace)
              for result in results]
    problems = [problem for problem in failed if problem]
    if problems:
        raise LaunchError(f"{len(problems)} host(s) not trusted:\n" + "\n".join(f"  {p}" for p in problems))


def _targets(hosts: tuple[str, ...], cluster_file: str | None) -> tuple[SSHSettings, list[Target]]:
    """The SSH settings to use and one target a host (all the cluster's nodes when no HOST is named)."""
    from launcher.backends.ssh.settings import SSHSettings
    from launcher.backends.ssh.spec import SSHCluster, SSHSpec

    spec, nodes = SSHSpec(), {}
    if cluster_file:
        from launcher.backends import load_cluster

        cluster = load_cluster(cluster_file)
        spec = cluster.ssh if isinstance(cluster, SSHCluster) else spec
        nodes = {node.host: node for node in cluster.nodes}
        hosts = hosts or tuple(nodes)
    if not hosts:
        raise click.UsageError("name at least one HOST, or a cluster with --cluster FILE")
    settings = SSHSettings(spec)
    targets = []
    for host in dict.fromkeys(hosts):
        node = nodes.get(host)
        targets.append(settings.target(host, node.port, node.user) if node else settings.target(host))
    return settings, targets


def _trust_key(settings: SSHSettings, target: Target, key: paramiko.PKey, yes: bool, replace: bool) -> str | None:
    """Show ``key`` and record it when the user agrees; why it was not trusted, or None."""
    from launcher.backends.ssh.hostkeys import fingerprint, key_status
    from launcher.backends.ssh.trust import record_key

    click.echo(f"{target.label}  {key.get_name()}  {fingerprint(key)}")
    known = settings.host_keys()
    if known.is_revoked(key):
        return f"{target.alias}: the key it offers is marked @revoked in {settings.known_hosts}; not recorded"
    status, recorded = key_status(known, target.known_hosts_name, key)
    if status == "trusted":
        click.echo(f"  already trusted in {settings.known_hosts}")
        return None
    if status == "changed" and recorded is not None:  # "changed" always comes with the recorded key
        click.echo(f"  CHANGED: {settings.known_hosts} has {recorded.get_name()} {fingerprint(recorded)}")
        if not replace:
            click.echo("  not replaced: rerun with --replace once the new fingerprint is confirmed", err=True)
            return f"{target.alias}: the recorded key differs; not replaced (use --replace after checking)"
    if yes or click.confirm(f"  trust this key for {target.known_hosts_name}?", default=False):
        record_key(settings.known_hosts, target, key, replace=status == "changed")
        click.echo(f"  recorded in {settings.known_hosts}")
    else:
        click.echo("  skipped")
    return None
