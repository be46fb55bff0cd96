"""Commented cluster files, as `launch init` writes them: text from small templates, validated before written.

Each key has a comment saying what it does and where its value came from; differences between the
hosts are flagged next to the keys they affect. ``write`` checks the text with the spec loader
(``load_cluster``) on a temporary file beside the target and only then moves it into place: an
invalid file is never written, and an existing one is replaced only when asked.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from launcher.backends.ssh.spec import SSHSpec
from launcher.backends.ssh.survey import Difference, HostReport, PythonChoice
from launcher.errors import LaunchError, SpecError
from launcher.spec.cluster import ClusterSpec

COMMENT_COLUMN = 36
GIB = 2**30
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def scalar(value: object) -> str:
    """``value`` as one YAML flow scalar (quoted when it must be)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000, allow_unicode=True).strip()
    return text.removesuffix("...").strip()


def comment(text: str) -> str:
    """``text`` safe inside a YAML comment: one line, no control characters."""
    return " ".join(_CONTROL.sub(" ", text).split())


def line(indent: int, body: str, note: str | None = None) -> str:
    """``body`` indented, with ``# note`` aligned at COMMENT_COLUMN."""
    text = " " * indent + body
    if not note:
        return text
    return f"{text:<{COMMENT_COLUMN}}# {comment(note)}" if len(text) < COMMENT_COLUMN else f"{text}  # {comment(note)}"


def header(command: str, *what: str) -> list[str]:
    """The file's opening comment: what it describes, which command wrote it and when."""
    stamp = time.strftime("%Y-%m-%d %H:%M %Z")
    return [f"# {comment(text)}" for text in what] + [f"# Written by `{comment(command)}` on {stamp}.",
            "# Every key: `launch schema cluster`. Check this file with `launch validate FILE`."]


@dataclass(frozen=True)
class SSHDraft:
    """What an SSH cluster file is made from."""

    name: str
    command: str
    ssh: SSHSpec
    reports: list[HostReport]
    python: PythonChoice
    differences: list[Difference]


def ssh_cluster_text(draft: SSHDraft) -> str:
    """The commented cluster file for the probed hosts."""
    reports, hosts = draft.reports, [r.host for r in draft.reports]
    out = header(draft.command, f"{len(reports)} node(s) reached over SSH: {', '.join(hosts)}.")
    out += ["# Next: `launch check --cluster FILE` (versions, GPUs, ports, bandwidth), then `launch submit JOB --cluster FILE`.",
            line(0, f"name: {scalar(draft.name)}", "how jobs and `launch status` name this cluster"),
            line(0, "backend: ssh", "each node runs launch's node agent over SSH (paramiko)"), ""]
    out += _ssh_section(draft.ssh)
    out += ["", line(0, "nodes:", "in rank order: node 0 hosts the rendezvous")]
    for report in reports:
        out += _node_lines(report)
    out += [""] + _gpu_lines(reports) + _python_lines(draft, hosts) + [""] + _network_lines(reports)
    out += ["",
            line(0, "# workdir: /path/to/project", "SET THIS: where ranks start on every node (default: the login directory)"),
            line(0, "# sync_workdir: .", "optional: a local directory copied to workdir before every job"),
            line(0, "# setup: [\"pip install -e .\"]", "optional: shell commands run on every node before launch"),
            line(0, "# rendezvous: {port: 29500}", "optional: a fixed rendezvous port (default: a free one per job)")]
    if draft.differences:
        out += ["", "# DIFFERENCES between the nodes (`launch check` compares them again before every job):"]
        out += [f"#   {comment(d.describe(hosts))}" for d in draft.differences]
    return "\n".join(out) + "\n"


def _ssh_section(ssh: SSHSpec) -> list[str]:
    out = [line(0, "ssh:", "how to reach the nodes; these values win over ~/.ssh/config")]
    if ssh.user:
        out.append(line(2, f"user: {scalar(ssh.user)}", "login user on every node"))
    out.append(line(2, f"port: {ssh.port}", "sshd's port (a node's own `port:` wins)"))
    if ssh.key_file:
        out.append(line(2, f"key_file: {scalar(ssh.key_file)}", "private key (without it: ~/.ssh/config, your keys, the agent)"))
    out.append(line(2, f"known_hosts: {scalar(ssh.known_hosts)}", "host keys recorded by init/`launch trust`; any other key is refused"))
    out.append(line(2, f"config_file: {scalar(ssh.config_file)}", "OpenSSH config: HostName, User, Port, IdentityFile, ProxyJump"))
    if ssh.jump_host:
        out.append(line(2, f"jump_host: {scalar(ssh.jump_host)}", "every node is reached through this host"))
    return out


def _node_lines(report: HostReport) -> list[str]:
    memory = f"{report.memory_bytes / GIB:.1f} GiB" if report.memory_bytes else "memory unknown"
    gpus = f"{len(report.gpus)} x {report.gpu_model}" if report.gpus else "no GPU"
    out = [line(2, f"- host: {scalar(report.host)}", f"{report.hostname} at {report.address}: {gpus}, {report.cpus} CPUs, {memory}")]
    if report.gpus:
        out.append(line(4, f"gpus: {len(report.gpus)}", "GPUs nvidia-smi lists: one process per GPU"))
    else:
        out.append(line(4, "gpus: 0", "no GPU found: processes run on CPUs with gloo"))
        out.append(line(4, f"slots: {report.cpus}", "processes it takes without GPUs: the CPUs it may use"))
    return out


def _gpu_lines(reports: list[HostReport]) -> list[str]:
    models = {(g.name, g.memory_gib) for r in reports for g in r.gpus}
    if not models:
        return []
    if len(models) > 1 or any(not r.gpus for r in reports):
        seen = "; ".join(f"{r.host}: {len(r.gpus)} x {r.gpu_model}" for r in reports)
        return [f"# gpu: left unset: the nodes' GPUs DIFFER ({comment(seen)}).",
                "#   Set gpu.name and gpu.memory_gb to the smallest for `launch plan`'s memory limit.", ""]
    name, memory = models.pop()
    return [line(0, "gpu:", "every node has this GPU (`launch plan`'s memory limit, MFU)"),
            line(2, f"name: {scalar(name)}", "the model, as nvidia-smi names it"),
            line(2, f"memory_gb: {memory}", "GiB per GPU, as nvidia-smi reports it"), ""]


def _python_lines(draft: SSHDraft, hosts: list[str]) -> list[str]:
    choice = draft.python
    first = choice.per_host[0] if choice.per_host else None  # the first host's interpreter at the chosen path
    if choice.path is None or first is None:
        return [line(0, "python: python3", "WARNING: no interpreter found; set the path of one that imports torch")]
    where = "on every node" if choice.same_everywhere else f"on {hosts[0]}"
    out = [line(0, f"python: {scalar(choice.path)}", f"{where}: {first.describe()}")]
    missing = [h for h, i in zip(hosts, choice.per_host) if i is None]
    if missing:
        best = {r.host: r.best for r in draft.reports}
        seen = "; ".join(f"{h}: {found.path if (found := best[h]) else 'none found'}" for h in missing)
        out.append(f"# DIFFERS: {', '.join(missing)} lack this path; the first host's interpreter is used. "
                   f"Their best: {comment(seen)}")
    without = [h for h, i in zip(hosts, choice.per_host) if i is not None and not i.has_torch]
    if without:
        out.append(f"# WARNING: torch does not import with this interpreter on {', '.join(without)}: install it there "
                   "or point python at one that has it")
    return out


def _network_lines(reports: list[HostReport]) -> list[str]:
    names = {r.interface for r in reports}
    routes = ", ".join(f"{r.host} {r.interface or '?'}" for r in reports)
    if len(names) == 1 and None not in names:
        interface = line(2, f"interface: {scalar(names.pop())}", "socket interface for NCCL/gloo: the route to node 0 on every node")
    else:
        interface = line(2, "interface: auto", f"the route to node 0 differs ({routes}): probed per node at launch")
    hcas = sorted({h for r in reports for h in r.hcas})
    found = f"HCAs found: {', '.join(hcas)}" if hcas else "no InfiniBand HCA found"
    return [line(0, "network:", "how the ranks reach each other"), interface,
            line(2, "ib_hca: auto", f"{found}; auto sets NCCL_IB_HCA per node, null sets none")]


def local_cluster_text(command: str, name: str, hostname: str, slots: int, cpus: int | None, gpus: int, python: str) -> str:
    """The embedded local cluster of this machine, its real numbers written out."""
    out = header(command, f"The local cluster: this machine ({hostname}). `launch` uses the same without a file;",
                 "write it to pin or lower these numbers.")
    out += [line(0, f"name: {scalar(name)}", "how jobs and `launch status` name this cluster"),
            line(0, "backend: local", "every node of a job runs here, as processes of this machine"),
            line(0, "local:"),
            line(2, f"slots: {slots}", f"processes without GPUs: the CPUs launch may use here (of {cpus or '?'} on the machine)"),
            line(2, f"gpus: {gpus}", "GPUs nvidia-smi lists; 0: processes run on CPU slots with gloo"),
            line(0, f"# python: {scalar(python)}", "the ranks' interpreter (default: the one running launch, this one)"),
            line(0, "# workdir: /path/to/project", "where ranks start (default: the current directory)")]
    return "\n".join(out) + "\n"


def ray_cluster_text(command: str, name: str, address: str) -> str:
    """A Ray cluster spec for the head at ``address``."""
    out = header(command, f"A Ray cluster: its head at {address} answered.")
    out += [line(0, f"name: {scalar(name)}", "how jobs and `launch status` name this cluster"),
            line(0, "backend: ray", "Ray places the nodes: one placement-group bundle and node agent per node"),
            line(0, "ray:"),
            line(2, f"address: {scalar(address)}", "the head: ray://HOST:10001 (Ray Client), HOST:6379 (GCS), or auto on a node"),
            line(2, "placement_timeout: 60", "seconds to wait for the nodes to be placed"),
            line(0, "# python: /path/to/python", "default: the interpreter of the Ray workers"),
            line(0, "# workdir: /path/to/project", "where ranks start on every node")]
    return "\n".join(out) + "\n"


def write(text: str, out: Path, overwrite: bool) -> ClusterSpec:
    """Validate ``text`` as a cluster spec and write it to ``out`` (never replacing a file unless ``overwrite``)."""
    from launcher.backends import load_cluster

    out = out.expanduser()
    if not overwrite:
        refuse_existing(out)
    temporary: Path | None = None
    try:
        # a name of its own, created exclusively: a planted file or symlink at a fixed name was written through
        fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".launch-init", dir=out.parent)
        temporary = Path(name)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        try:
            spec = load_cluster(temporary)
        except SpecError as exc:
            raise LaunchError(f"launch init made an invalid cluster file; nothing was written: {exc}") from None
        if overwrite:
            os.replace(temporary, out)
        else:
            os.link(temporary, out)
    except FileExistsError:
        raise _exists(out) from None
    except OSError as exc:
        raise LaunchError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
    return spec


def refuse_existing(out: Path) -> None:
    """SpecError (exit 2) when ``out`` exists: init replaces a file only with --force (or --yes)."""
    if out.exists() or out.is_symlink():
        raise _exists(out)


def _exists(out: Path) -> SpecError:
    return SpecError(f"{out} exists; not overwritten (add --force, or --yes, to replace it, or choose --out FILE)")
