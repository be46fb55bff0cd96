"""Container runtimes as argv lists: run a node's command in a container, check and pull its image,
find, stop and remove a job's containers, and read how a container ended. Pure: no I/O.

Docker and Podman keep named containers; ``launch`` names each after its job and node and labels it
``launch.job=<job id>``, ``launch.node=<index>``. Apptainer keeps none: its container is the process
``apptainer exec`` starts, ended with the node's other processes, so the functions that address a
container by name return None for it.

The environment goes by name only: ``-e NAME`` for Docker and Podman (the runtime copies the value from
its own environment), ``APPTAINERENV_NAME`` in Apptainer's environment (with ``--cleanenv``). The caller
starts the runtime with ``runtime_environment(...)`` merged into its environment; no value is ever on a
command line. See docs/CONTAINERS.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from launcher.spec.container import ContainerSpec, Mount, PullPolicy, Runtime

NAME_PREFIX = "launch-"
JOB_LABEL = "launch.job"
NODE_LABEL = "launch.node"
APPTAINER_ENV_PREFIX = "APPTAINERENV_"
# What Docker and Podman accept as a container name (moby's restrictedNameChars).
_CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Exit statuses the Docker and Podman clients use for their own failures (before the command ran).
_RUNTIME_EXITS = {
    125: "the container runtime itself failed (bad option, image missing, no permission); see its error above",
    126: "the container's command could not be invoked (not executable, or the runtime could not start it)",
    127: "the container's command was not found in the image",
}
SIGKILL_EXIT = 128 + 9


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


class PullAction(Enum):
    """What preflight does about a node's image."""

    USE = "use"        # present, and the policy does not ask for a fresh pull
    PULL = "pull"      # pull it (absent with pull: missing, or pull: always)
    REFUSE = "refuse"  # absent and cannot be pulled (pull: never, or an apptainer file)


@dataclass(frozen=True)
class ContainerState:
    """How a stopped container ended, as ``inspect`` reports it."""

    exit_code: int
    oom_killed: bool


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
             workdir: str, gpus: int, *, remove: bool = True) -> list[str]:
    """The runtime command that runs ``argv`` for one node, in the foreground, inside ``spec.image``.

    Host network and IPC, the node's GPUs when ``gpus`` > 0, the workdir mounted at its own path and
    used as the working directory, the user's mounts, ``env_names`` passed by name only, the user's
    options last before the image. ``remove``: the runtime deletes the container when it exits
    (Docker, Podman; pass False to ``inspect`` it first, then ``remove_argv``).
    """
    if not argv:
        raise ValueError("argv is empty: nothing to run in the container")
    if not workdir.startswith("/"):
        raise ValueError(f"workdir must be an absolute path, got {workdir!r}")
    names = _checked_names(env_names)
    mounts = [arg for m in _mounts(spec, workdir) for arg in _mount_args(spec.runtime, m)]
    if spec.runtime is Runtime.APPTAINER:
        return ["apptainer", "exec", "--cleanenv", *(["--nv"] if gpus > 0 else []), *mounts,
                "--pwd", workdir, *spec.options, _image(spec), *argv]
    gpu_flags = {Runtime.DOCKER: ["--gpus", "all"], Runtime.PODMAN: ["--device", "nvidia.com/gpu=all"]}
    labels = [arg for key, value in name.labels.items() for arg in ("--label", f"{key}={value}")]
    return [spec.runtime.value, "run", *(["--rm"] if remove else []), "--name", str(name), *labels,
            "--pull", "never", "--network", "host", "--ipc", "host",
            *(gpu_flags[spec.runtime] if gpus > 0 else []), *mounts, "-w", workdir,
            *[arg for n in names for arg in ("-e", n)], *spec.options, _image(spec), *argv]


def runtime_environment(runtime: Runtime, values: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to the runtime process's own environment so that the container gets
    ``values``: the same names for Docker and Podman (``-e NAME``), ``APPTAINERENV_NAME`` for Apptainer.

    Apptainer refuses ``APPTAINERENV_HOME`` (it sets HOME itself).
    """
    _checked_names(values)
    prefix = APPTAINER_ENV_PREFIX if runtime is Runtime.APPTAINER else ""
    return {f"{prefix}{key}": value for key, value in values.items()}


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


def pull_action(spec: ContainerSpec, present: bool) -> PullAction:
    """What to do about a node whose image is ``present`` or not, per ``spec.pull``."""
    if spec.runtime is Runtime.APPTAINER or spec.pull is PullPolicy.NEVER:
        return PullAction.USE if present else PullAction.REFUSE
    if spec.pull is PullPolicy.ALWAYS or not present:
        return PullAction.PULL
    return PullAction.USE


def pull_argv(spec: ContainerSpec) -> list[str]:
    """The command that pulls the image (Docker, Podman); ValueError for Apptainer (a file: never pulled)."""
    if spec.runtime is Runtime.APPTAINER:
        raise ValueError("apptainer images are files on each node: launch does not pull them")
    return [spec.runtime.value, "pull", _image(spec)]


def list_argv(runtime: Runtime, job_id: str) -> list[str] | None:
    """A command printing the names of every container of ``job_id``, running or stopped, one a line
    (``parse_names``); None for Apptainer, which keeps no containers."""
    if runtime is Runtime.APPTAINER:
        return None
    return [runtime.value, "ps", "-a", "--filter", f"label={JOB_LABEL}={job_id}", "--format", "{{.Names}}"]


def parse_names(output: str, job_id: str) -> list[str]:
    """The container names in ``list_argv``'s output that belong to ``job_id``; other lines are dropped."""
    prefix = f"{NAME_PREFIX}{job_id}-n"
    return [line.strip() for line in output.splitlines()
            if line.strip().startswith(prefix) and line.strip()[len(prefix):].isdigit()]


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


def inspect_argv(runtime: Runtime, name: ContainerName | str) -> list[str] | None:
    """A command printing ``<exit code> <true|false>`` (OOM-killed) for a stopped container
    (``parse_state``). Only for a container run with ``remove=False``. None for Apptainer."""
    if runtime is Runtime.APPTAINER:
        return None
    return [runtime.value, "inspect", "--type", "container", "--format",
            "{{.State.ExitCode}} {{.State.OOMKilled}}", str(name)]


def parse_state(output: str) -> ContainerState:
    """``inspect_argv``'s output as a ContainerState; ValueError when it is not that."""
    fields = output.split()
    if len(fields) != 2 or not fields[0].lstrip("-").isdigit() or fields[1] not in ("true", "false"):
        raise ValueError(f"not '<exit code> <true|false>': {output.strip()[:80]!r}")
    return ContainerState(exit_code=int(fields[0]), oom_killed=fields[1] == "true")


def exit_meaning(runtime: Runtime, code: int) -> str | None:
    """What a run command's exit status says beyond the program's own, or None.

    137 is a SIGKILL: the kernel's OOM killer (a memory limit or the host), ``kill``/``stop`` by the
    runtime, or a user. Podman before 5.0 does not set ``OOMKilled`` (containers/podman#13102): the
    kernel log tells. 125-127 are the Docker and Podman clients' own failures; Apptainer's is 255.
    """
    if code == SIGKILL_EXIT:
        return "killed (SIGKILL): by the OOM killer, by the container runtime (kill, stop) or by a user"
    if runtime is Runtime.APPTAINER:
        return "apptainer itself failed (see its FATAL line)" if code == 255 else None
    return _RUNTIME_EXITS.get(code)
