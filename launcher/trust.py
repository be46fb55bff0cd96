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

import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    import paramiko

    from launcher.sshconn import Pool, Target


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
    from launcher.errors import LaunchError
    from launcher.spec.cluster import SSHSpec
    from launcher.sshconn import (
        Pool,
        SSHSettings,
        error_text,
        fan_out,
        fingerprint,
        key_status,
    )

    spec, nodes = SSHSpec(), {}
    if cluster_file:
        from launcher.spec.load import load_cluster

        cluster = load_cluster(cluster_file)
        spec, nodes = cluster.ssh, {node.host: node for node in cluster.nodes}
        hosts = hosts or tuple(nodes)
    if not hosts:
        raise click.UsageError("name at least one HOST, or a cluster with --cluster FILE")
    settings = SSHSettings(spec)
    targets = []
    for host in dict.fromkeys(hosts):
        node = nodes.get(host)
        targets.append(settings.target(host, node.port, node.user) if node else settings.target(host))
    pool = Pool(settings, spec.connect_timeout)
    try:
        results = fan_out(lambda target: fetch_host_key(target, pool), targets)
    finally:
        pool.close()

    failed = []
    known = settings.host_keys()
    for result in results:
        target = result.key
        if not result.ok:
            failed.append(error_text(result.error))
            continue
        key = result.value
        status, recorded = key_status(known, target.known_hosts_name, key)
        click.echo(f"{target.label}  {key.get_name()}  {fingerprint(key)}")
        if status == "trusted":
            click.echo(f"  already trusted in {settings.known_hosts}")
            continue
        if status == "changed":
            click.echo(f"  CHANGED: {settings.known_hosts} has {recorded.get_name()} {fingerprint(recorded)}")
            if not replace:
                failed.append(f"{target.alias}: the recorded key differs; not replaced (use --replace after checking)")
                click.echo("  not replaced: rerun with --replace once the new fingerprint is confirmed", err=True)
                continue
        if yes or click.confirm(f"  trust this key for {target.known_hosts_name}?", default=False):
            record_key(settings.known_hosts, target, key, replace=status == "changed")
            click.echo(f"  recorded in {settings.known_hosts}")
        else:
            click.echo("  skipped")
    if failed:
        raise LaunchError(f"{len(failed)} host(s) not trusted:\n" + "\n".join(f"  {f}" for f in failed))


def fetch_host_key(target: Target, pool: Pool) -> paramiko.PKey:
    """The key ``target`` offers, without authenticating (jump hosts on the way must be trusted).

    A key type already recorded for the host is asked for first, so a
    comparison with known_hosts compares like with like.
    """
    import paramiko

    from launcher.errors import LaunchError
    from launcher.sshconn import CONNECTION_ERRORS, open_socket

    via = pool.get(target.via) if target.via else None
    transport = paramiko.Transport(open_socket(target, pool.timeout, via))
    try:
        recorded = pool.settings.host_keys().lookup(target.known_hosts_name)
        if recorded:
            options = transport.get_security_options()
            wanted = next(iter(recorded.keys()))
            wanted = "rsa-sha2-512" if wanted == "ssh-rsa" else wanted
            options.key_types = [wanted] + [t for t in options.key_types if t != wanted]
        transport.start_client(timeout=pool.timeout)
        return transport.get_remote_server_key()
    except CONNECTION_ERRORS as exc:
        raise LaunchError(f"{target.label}: SSH handshake failed: {exc}") from None
    finally:
        transport.close()


def record_key(known_hosts: Path, target: Target, key: paramiko.PKey, replace: bool = False) -> None:
    """Append ``key`` for ``target`` to known_hosts (created 0600); with ``replace``, drop its old lines first."""
    known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = target.known_hosts_name
    lines = known_hosts.read_text().splitlines(keepends=True) if known_hosts.exists() else []
    if replace:
        lines = [line for line in lines if not _names(line, name)]
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    lines.append(f"{name} {key.get_name()} {key.get_base64()}\n")
    temporary = known_hosts.with_name(f".{known_hosts.name}.launch-tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.writelines(lines)
    os.replace(temporary, known_hosts)


def _names(line: str, name: str) -> bool:
    """True if the known_hosts ``line`` is an entry for ``name`` (plain or hashed)."""
    from paramiko.hostkeys import HostKeyEntry, HostKeys, InvalidHostKey

    if not line.strip() or line.startswith("#"):
        return False
    try:
        entry = HostKeyEntry.from_line(line.strip())
    except InvalidHostKey:
        return False
    if entry is None:
        return False
    return any(
        host == name or (host.startswith("|1|") and HostKeys.hash_host(name, host) == host)
        for host in entry.hostnames
    )
