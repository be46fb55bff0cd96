"""``launch init``: write a commented cluster.yaml from host names (SSH), this machine (--local) or a Ray address.

For SSH hosts: show and record unknown host keys (as ``launch trust``), probe every host in parallel
(``launcher.backends.ssh.survey``), show a summary table with the differences between hosts flagged, and write
a cluster file that validates (``launcher.backends.ssh.clusterfile``). Only click is imported at module level,
so ``launch --help`` stays fast.
"""

from __future__ import annotations

import re
import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from launcher.backends.ssh.spec import SSHSpec
    from launcher.backends.ssh.survey import Difference, HostReport, PythonChoice

RAY_ADDRESS = re.compile(r"auto|(ray://)?[^\s:/]+:\d{1,5}")
SSH_ONLY = ("user", "key_file", "port", "known_hosts", "ssh_config", "jump_host", "python")


@click.command("init")
@click.argument("hosts", nargs=-1, metavar="[HOST]...")
@click.option("--user", "-u", help="SSH login user (default: ~/.ssh/config's, else yours).")
@click.option("--key-file", "-i", type=click.Path(exists=True, dir_okay=False), help="SSH private key.")
@click.option("--port", "-p", type=click.IntRange(1, 65535), help="sshd port on every host (default 22).")
@click.option("--known-hosts", type=click.Path(dir_okay=False), help="known_hosts file to check and record keys in (default ~/.ssh/known_hosts).")
@click.option("--ssh-config", type=click.Path(exists=True, dir_okay=False), help="OpenSSH config for aliases (default ~/.ssh/config).")
@click.option("--jump-host", metavar="[USER@]HOST[:PORT]", help="Reach every host through this one.")
@click.option("--python", metavar="PATH", help="Check this interpreter on every host instead of searching for one.")
@click.option("--name", help="The cluster's name (default: the --out file's name).")
@click.option("--out", "-o", default="cluster.yaml", show_default=True, type=click.Path(dir_okay=False), help="File to write.")
@click.option("--yes", "-y", is_flag=True, help="Trust new host keys and replace --out without asking.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--local", is_flag=True, help="Write the local cluster of this machine (its CPU slots and GPUs).")
@click.option("--ray", "ray_address", metavar="ADDRESS", help="Write a Ray cluster for the head at ADDRESS (HOST:PORT or ray://HOST:PORT).")
def init(hosts, user, key_file, port, known_hosts, ssh_config, jump_host, python, name, out, yes, force, local, ray_address):
    """Write a commented cluster.yaml for HOST... (SSH), this machine (--local) or a Ray cluster (--ray).

    For SSH hosts, each host's key is shown (SHA256 fingerprint) and recorded in known_hosts
    when you accept it, as `launch trust` does; a key that differs from the recorded one is
    refused. Every host is then probed in parallel: GPUs (model, memory), the interpreters that
    import torch (python3/python on PATH, conda, ~/.venv, pyenv... and this one's path) with their
    torch and deepspeed versions, the interface that routes to the first host, InfiniBand HCAs,
    CPUs and memory. A table shows them, differences between hosts flagged; the file says what
    each key means and which values differ. It is validated before it is written, and an existing
    file is replaced only with --force or --yes. A host that cannot be reached or probed writes
    nothing, but the others are still probed and shown, so one run lists every problem.
    Exit 2: bad input; 3: a host unreachable or unusable.

    \b
    Examples:
      launch init gpu-01 gpu-02 --user train --key-file ~/.ssh/id_ed25519
      launch init 10.0.0.11 10.0.0.12 --yes --out clusters/a800.yaml --name a800
      launch init --local --out local.yaml
      launch init --ray ray://head:10001 --out ray.yaml
    """
    from launcher.backends.ssh.clusterfile import refuse_existing

    ssh_flags = {"user": user, "key_file": key_file, "port": port, "known_hosts": known_hosts, "ssh_config": ssh_config,
             "jump_host": jump_host, "python": python}
    modes = [mode for mode, on in (("HOST", bool(hosts)), ("--local", local), ("--ray", bool(ray_address))) if on]
    if len(modes) != 1:
        raise click.UsageError("give HOST... (SSH hosts), --local or --ray ADDRESS" + (f", not {' and '.join(modes)}" if modes else ""))
    if not hosts and any(ssh_flags.values()):
        flags = ", ".join("--" + k.replace("_", "-") for k in SSH_ONLY if ssh_flags[k])
        raise click.UsageError(f"{flags}: for SSH hosts only")
    if len(set(hosts)) != len(hosts):
        raise click.UsageError("a HOST is given twice; each host is one node")
    for host in hosts:
        _check_host(host)
    target = Path(out)
    overwrite = yes or force
    if not overwrite:
        refuse_existing(target)
    command = _command_line(hosts, ssh_flags, name, out, local, ray_address)
    if local:
        _write_local(command, target, overwrite, name or "local")
    elif ray_address:
        _write_ray(command, target, overwrite, name or target.stem, ray_address)
    else:
        from launcher.backends.ssh.spec import SSHSpec

        ssh = SSHSpec(**{key: value for key, value in {
            "user": user, "port": port, "key_file": _spec_path(key_file), "known_hosts": _spec_path(known_hosts),
            "config_file": _spec_path(ssh_config), "jump_host": jump_host}.items() if value is not None})
        _write_ssh(command, target, overwrite, name or target.stem, hosts, ssh, python, yes)


def _check_host(host: str) -> None:
    """A HOST argument is a name or an address: ``user@host`` and ``host:port`` get the option that says it."""
    from pydantic import ValidationError

    from launcher.spec.cluster import NodeSpec

    user, at, name = host.rpartition("@")
    if at:
        raise click.UsageError(f"{host!r}: give the user with --user, not in HOST: launch init {name} --user {user}")
    name, colon, port = host.partition(":")
    if colon and port.isdigit() and ":" not in port:
        raise click.UsageError(f"{host!r}: give the port with --port, not in HOST: launch init {name} --port {port}")
    try:
        NodeSpec(host=host)
    except ValidationError as exc:
        raise click.UsageError(str(exc.errors()[0]["msg"]).removeprefix("Value error, ")) from None


def _command_line(hosts, ssh_flags: dict, name, out, local: bool, ray_address) -> str:
    args = ["launch", "init", *hosts]
    args += ["--local"] * local + (["--ray", ray_address] if ray_address else [])
    args += [part for key, value in ssh_flags.items() if value for part in ("--" + key.replace("_", "-"), str(value))]
    args += (["--name", name] if name else []) + ["--out", out]
    return shlex.join(args)


def _spec_path(path: str | None) -> str | None:
    """A path as the cluster file keeps it: ``~/...`` as given, anything else absolute."""
    if path is None or path.startswith("~"):
        return path
    return str(Path(path).absolute())


def _write_ssh(command: str, target: Path, overwrite: bool, name: str, hosts: tuple[str, ...], ssh: SSHSpec,
               python: str | None, yes: bool) -> None:
    """Trust the hosts' keys, probe them, show what was found, write the file (nothing written while a host
    cannot be used; the others are still probed and shown, so one run shows every problem)."""
    from launcher.backends.ssh import survey
    from launcher.backends.ssh.backend import SSHBackend
    from launcher.backends.ssh.clusterfile import SSHDraft, ssh_cluster_text, write
    from launcher.backends.ssh.spec import SSHCluster
    from launcher.errors import PreflightError
    from launcher.spec.cluster import NodeSpec
    from launcher.views.render import console

    cluster = SSHCluster(name=name, backend="ssh", ssh=ssh, nodes=[NodeSpec(host=h) for h in hosts])
    backend = SSHBackend(cluster)
    recorded: list[str] = []
    try:
        problems = survey.trust_keys(
            backend, confirm=lambda question: yes or click.confirm(question, default=False), echo=click.echo,
            recorded_to=recorded)
        started = time.monotonic()
        reports, more = survey.probe(backend, python, skip=problems)
        problems |= more
    finally:
        backend.close()
    elapsed = time.monotonic() - started
    if not reports:
        raise PreflightError(survey.unusable(list(problems.values()), keys_recorded=recorded))
    choice = survey.choose_python(reports)
    found = survey.differences(reports, choice)
    out = console()
    out.print(summary_table(reports, choice, found))
    for difference in found:
        out.print(f"[yellow]warning:[/] {_escape(difference.describe([r.host for r in reports]))}")
    for warning in _warnings(reports, choice):
        out.print(f"[yellow]warning:[/] {_escape(warning)}")
    if problems:
        raise PreflightError(survey.unusable(list(problems.values()), probed=len(reports), keys_recorded=recorded))
    draft = SSHDraft(name, command, ssh, reports, choice, found)
    write(ssh_cluster_text(draft), target, overwrite)
    click.echo(f"probed {len(reports)} host(s) in {elapsed:.1f} s; wrote {target}: set workdir in it, then "
               f"`launch check --cluster {shlex.quote(str(target))}`")


def _warnings(reports: list[HostReport], choice: PythonChoice) -> list[str]:
    """What would stop or slow a job, beyond the differences."""
    out = []
    if choice.path is None:
        out.append(f"{reports[0].host}: no Python interpreter found; the file names python3: set python in it")
    for report, interp in zip(reports, choice.per_host):
        if interp is None and choice.path is not None:
            out.append(f"{report.host}: {choice.path} does not exist there; the file names it anyway (the first host's)")
        elif interp is not None and not interp.has_torch:
            out.append(f"{report.host}: {interp.path} does not import torch ({interp.describe()})")
        if report.route_error and not report.interface:
            out.append(f"{report.host}: no route to {reports[0].host}: {report.route_error}")
        if report.hostname_resolves not in (None, True):
            out.append(f"{report.host}: its hostname '{report.hostname}' does not resolve there ({report.hostname_resolves}); "
                       "torchrun's rendezvous needs it (/etc/hosts or DNS)")
    return out


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def summary_table(reports: list[HostReport], choice: PythonChoice, found: list[Difference]):
    """One row per host; cells of a property that differs between hosts are yellow and marked ``!``."""
    from rich.table import Table
    from rich.text import Text

    differs = {d.what for d in found}
    table = Table(box=None, header_style="bold")
    for column in ("HOST", "GPUS", "PYTHON", "VERSION", "TORCH", "DEEPSPEED", "INTERFACE", "HCAS", "CPUS", "MEMORY"):
        table.add_column(column, no_wrap=column != "PYTHON")

    def cell(text: str, *whats: str) -> Text:
        flagged = any(w in differs for w in whats)
        return Text(text + (" !" if flagged else ""), style="bold yellow" if flagged else "")

    for report, interp in zip(reports, choice.per_host):
        gpus = f"{len(report.gpus)} x {report.gpu_model} ({report.gpus[0].memory_gib:g} GiB)" if report.gpus else "0 (CPU)"
        python = interp.path if interp else f"missing (best here: {report.best.path if report.best else 'none'})"
        table.add_row(
            Text(report.host), cell(gpus, "GPU model", "GPU count"),
            Text(python, style="" if interp and interp.has_torch else "red"),
            cell(interp.version or "-" if interp else "-", "python version"),
            cell(interp.torch or "none" if interp else "-", "torch"),
            cell(interp.deepspeed or "none" if interp else "-", "deepspeed"),
            Text(report.interface or "?"), Text(", ".join(report.hcas) or "-"), Text(str(report.cpus)),
            Text(f"{report.memory_bytes / 2**30:.1f} GiB" if report.memory_bytes else "?"),
        )
    return table


def _write_local(command: str, target: Path, overwrite: bool, name: str) -> None:
    import os
    import socket

    from launcher.backends.local.host import cpu_slots, gpu_count
    from launcher.backends.ssh.clusterfile import local_cluster_text, write

    slots, gpus = cpu_slots(), gpu_count()
    write(local_cluster_text(command, name, socket.gethostname(), slots, os.cpu_count(), gpus, sys.executable), target, overwrite)
    click.echo(f"wrote {target}: {slots} CPU slot(s), {gpus} GPU(s)")


def _write_ray(command: str, target: Path, overwrite: bool, name: str, address: str) -> None:
    from launcher.backends.ray.backend import _check_reachable
    from launcher.backends.ssh.clusterfile import ray_cluster_text, write

    if not RAY_ADDRESS.fullmatch(address):
        raise click.BadParameter(f"'{address}' is not HOST:PORT, ray://HOST:PORT or auto", param_hint="--ray")
    _check_reachable(address)
    write(ray_cluster_text(command, name, address), target, overwrite)
    click.echo(f"wrote {target}: the Ray head at {address} answered; `launch submit JOB --cluster {shlex.quote(str(target))}`")
