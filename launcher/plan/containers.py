"""Container runtimes as argv lists: run a node's command in a container, check and pull its image,
stop and remove a node's container. Pure: no I/O.

Docker and Podman keep named containers; ``launch`` names each after its job and node and labels it
``launch.job=<job id>``, ``launch.node=<index>``. Apptainer keeps none: its container is the process
``apptainer exec`` starts, ended with the node's other processes, so the functions that address a
container by name return None for it.

The environment goes by name only: ``-e NAME`` for Docker and Podman (the runtime copies the value from
its own environment), ``APPTAINERENV_NAME`` in Apptainer's environment (with ``--cleanenv``). The node's
agent starts the runtime with each value under its name after ``env_prefix``; no value is ever on a
command line. See docs/CONTAINERS.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from launcher.spec.container import ContainerSpec, Mount, Runtime

MEMLOCK_UNLIMITED = -1
IB_DEVICES = "/dev/infiniband"
NAME_PREFIX = "launch-"
JOB_LABEL = "launch.job"
NODE_LABEL = "launch.node"
APPTAINER_ENV_PREFIX = "APPTAINERENV_"
# What Docker and Podman accept as a container name (moby's restrictedNameChars).
_CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ContainerName:
    """The container of one node of one job: ``launch-<job id>-n<node index>``."""

    job_id: str
    node: int

    def __post_init__(self) -> None:
        if self.node < 0 or not _CONTAINER_NAME.fullmatch(self.job_id):
            raise ValueError(f"no valid container name for job {self.job_id!r}, node {self.node}")

    def __str__(self) -> str:
        return f"{NAME_PREFIX}{self.job_id}-n{self.node}"

    @property
    def labels(self) -> dict[str, str]:
        return {JOB_LABEL: self.job_id, NODE_LABEL: str(self.node)}


@dataclass(frozen=True)
class InfiniBand:
    """A node's InfiniBand HCAs as its probe found them (or the cluster pins them), and the largest memlock limit
    a process there may set (``MEMLOCK_UNLIMITED``, or bytes: the hard limit where it cannot be raised)."""

    hcas: tuple[str, ...]
    memlock_max: int = MEMLOCK_UNLIMITED


@dataclass(frozen=True)
class RunOption:
    """Options of ``run`` that launch adds for what a node has, and why (the dry run shows both). A ``pending``
    option waits for the node's probe at launch: it is shown, not yet on the command line."""

    args: tuple[str, ...]
    why: str
    pending: bool = False


def node_options(runtime: Runtime, gpus: int, ib: InfiniBand | None, ib_pending: bool = False) -> list[RunOption]:
    """What a node's container gets besides the job's own options: the host's network and IPC, its GPUs, and for a
    node with InfiniBand HCAs what NCCL's verbs need inside (without them NCCL silently falls back to TCP sockets).
    ``ib_pending``: the HCAs are probed at launch (shown as pending options)."""
    if runtime is Runtime.APPTAINER:  # shares the host's network, IPC, /dev and limits unless told otherwise
        return [RunOption(("--nv",), f"the node's {gpus} GPU(s): binds the driver's libraries and /dev/nvidia*")] \
            if gpus > 0 else []
    options = [
        RunOption(("--network", "host"), "the node's interfaces: the rendezvous address and NCCL_SOCKET_IFNAME "
                  "mean the same inside"),
        RunOption(("--ipc", "host"), "the host's /dev/shm and System V IPC for NCCL's shared memory between the "
                  "node's ranks and the DataLoader workers (a container's own /dev/shm is 64 MB)"),
    ]
    if gpus > 0 and runtime is Runtime.DOCKER:
        options.append(RunOption(("--gpus", "all"), f"the node's {gpus} GPU(s) (the NVIDIA Container Toolkit)"))
    elif gpus > 0:
        options.append(RunOption(("--device", "nvidia.com/gpu=all"),
                                 f"the node's {gpus} GPU(s) through CDI (nvidia-ctk cdi generate)"))
    if ib is not None:
        options += ib_options(ib)
    elif ib_pending:
        options += ib_options(InfiniBand(("probed at launch",)), pending=True)
    return options


def ib_options(ib: InfiniBand, pending: bool = False) -> list[RunOption]:
    """What NCCL's verbs need in a Docker or Podman container on a node with HCAs: the device files, the right to
    lock memory, and a memlock limit that lets it register its buffers (the largest the node allows)."""
    found = "if the node's probe finds InfiniBand HCAs" if pending else f"InfiniBand HCAs {','.join(ib.hcas)}"
    if ib.memlock_max == MEMLOCK_UNLIMITED:
        memlock = RunOption(("--ulimit", "memlock=-1"), f"{found}: NCCL registers (pins) its buffers with the HCA; "
                            "unlimited locked memory", pending)
    else:
        memlock = RunOption(("--ulimit", f"memlock={ib.memlock_max}:{ib.memlock_max}"),
                            f"{found}: the node's hard memlock limit ({ib.memlock_max // 1024} KiB) cannot be raised "
                            "here, so the container gets that much; NCCL may fail to register large buffers (raise "
                            "memlock in /etc/security/limits.conf, or run the runtime with CAP_SYS_RESOURCE)", pending)
    return [
        RunOption(("--device", IB_DEVICES), f"{found}: NCCL's verbs open {IB_DEVICES}/uverbs*", pending),
        RunOption(("--cap-add", "IPC_LOCK"), f"{found}: NCCL locks the memory it registers with the HCA", pending),
        memlock,
    ]


def _image(spec: ContainerSpec) -> str:
    """The spec's image; ValueError for a section without one (merge with ``effective_container`` first)."""
    if spec.image is None:
        raise ValueError("the container section has no image: merge it with effective_container() first")
    return spec.image


def _mount_args(runtime: Runtime, mount: Mount) -> list[str]:
    return ["--bind" if runtime is Runtime.APPTAINER else "-v", str(mount)]


def _mounts(spec: ContainerSpec, workdir: str) -> list[Mount]:
    """The user's mounts, after the workdir at its own path unless one of them targets it."""
    if any(m.target.rstrip("/") == workdir.rstrip("/") for m in spec.mounts):
        return list(spec.mounts)
    return [Mount(source=workdir, target=workdir), *spec.mounts]


def _checked_names(env_names: Iterable[str]) -> list[str]:
    names = list(dict.fromkeys(env_names))
    bad = [n for n in names if not _ENV_NAME.fullmatch(n)]
    if bad:
        raise ValueError(f"not environment variable names: {', '.join(map(repr, bad))}")
    return names


def run_argv(spec: ContainerSpec, name: ContainerName, argv: Sequence[str], env_names: Iterable[str],
             workdir: str, gpus: int, ib: InfiniBand | None = None) -> list[str]:
    """The runtime command that runs ``argv`` for one node, in the foreground, inside ``spec.image``.

    ``node_options`` (host network and IPC, the node's GPUs when ``gpus`` > 0, InfiniBand's device, capability
    and memlock when ``ib``), the workdir mounted at its own path and used as the working directory, the user's
    mounts, ``env_names`` passed by name only, the user's options last before the image. Docker and Podman
    delete the container when it exits (``--rm``).
    """
    if not argv:
        raise ValueError("argv is empty: nothing to run in the container")
    if not workdir.startswith("/"):
        raise ValueError(f"workdir must be an absolute path, got {workdir!r}")
    names = _checked_names(env_names)
    mounts = [arg for m in _mounts(spec, workdir) for arg in _mount_args(spec.runtime, m)]
    added = [arg for option in node_options(spec.runtime, gpus, ib) for arg in option.args]
    if spec.runtime is Runtime.APPTAINER:
        return ["apptainer", "exec", "--cleanenv", *added, *mounts, "--pwd", workdir, *spec.options, _image(spec), *argv]
    labels = [arg for key, value in name.labels.items() for arg in ("--label", f"{key}={value}")]
    return [spec.runtime.value, "run", "--rm", "--name", str(name), *labels, "--pull", "never",
            *added, *mounts, "-w", workdir,
            *[arg for n in names for arg in ("-e", n)], *spec.options, _image(spec), *argv]


def env_prefix(runtime: Runtime) -> str:
    """What the runtime process's environment names a variable the container gets: the same name for Docker and
    Podman (``-e NAME``), ``APPTAINERENV_NAME`` for Apptainer (which refuses ``APPTAINERENV_HOME``: it sets HOME)."""
    return APPTAINER_ENV_PREFIX if runtime is Runtime.APPTAINER else ""


def probe_argv(runtime: Runtime) -> list[str]:
    """A quick command that fails unless this user can use the runtime (Docker: reach its daemon)."""
    return {
        Runtime.DOCKER: ["docker", "version", "--format", "{{.Server.Version}}"],
        Runtime.PODMAN: ["podman", "version", "--format", "{{.Client.Version}}"],
        Runtime.APPTAINER: ["apptainer", "--version"],
    }[runtime]


def image_present_argv(spec: ContainerSpec) -> list[str]:
    """A command that exits 0 when the node has the image, non-zero when it does not."""
    image = _image(spec)
    return {
        Runtime.DOCKER: ["docker", "image", "inspect", "--format", "{{.Id}}", image],
        Runtime.PODMAN: ["podman", "image", "exists", image],
        Runtime.APPTAINER: ["test", "-e", image],
    }[spec.runtime]


def pull_argv(spec: ContainerSpec) -> list[str]:
    """The command that pulls the image (Docker, Podman); ValueError for Apptainer (a file: never pulled)."""
    if spec.runtime is Runtime.APPTAINER:
        raise ValueError("apptainer images are files on each node: launch does not pull them")
    return [spec.runtime.value, "pull", _image(spec)]


def stop_argv(runtime: Runtime, name: ContainerName | str, grace_s: float) -> list[str] | None:
    """Stop a container: SIGTERM, then SIGKILL after ``grace_s`` seconds. None for Apptainer."""
    if runtime is Runtime.APPTAINER:
        return None
    return [runtime.value, "stop", "-t", str(max(0, math.ceil(grace_s))), str(name)]


def remove_argv(runtime: Runtime, name: ContainerName | str) -> list[str] | None:
    """Remove a container, killing it if it still runs; exits 0 when there is none (Docker 20.10+,
    Podman). None for Apptainer."""
    if runtime is Runtime.APPTAINER:
        return None
    return [runtime.value, "rm", "-f", str(name)]
