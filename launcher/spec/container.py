"""The ``container:`` section of a job or cluster spec: run every node's command in one image.

The cluster's section is a default for its jobs; ``effective_container`` merges the two
(the job's keys win). Validation here is per runtime: what each runtime can run and which
``run`` options `launch` sets itself.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any

from pydantic import (
    BeforeValidator,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
    model_validator,
)

from launcher.errors import SpecError
from launcher.spec.base import Strict


class Runtime(str, Enum):
    DOCKER = "docker"
    PODMAN = "podman"
    APPTAINER = "apptainer"


class PullPolicy(str, Enum):
    MISSING = "missing"
    ALWAYS = "always"
    NEVER = "never"


@dataclass(frozen=True)
class Mount:
    """A bind mount ``SOURCE:TARGET[:ro|rw]`` from the node into the container."""

    source: str
    target: str
    read_only: bool = False

    def __str__(self) -> str:
        return f"{self.source}:{self.target}:{'ro' if self.read_only else 'rw'}"


def parse_mount(value: Any) -> Mount:
    """``SOURCE:TARGET[:ro|rw]`` (absolute paths, no ',' which Apptainer splits on) as a Mount."""
    if isinstance(value, Mount):
        return value
    if not isinstance(value, str):
        raise ValueError("expected a string SOURCE:TARGET[:ro|rw], e.g. '/data:/data:ro'")
    parts = value.split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"expected SOURCE:TARGET[:ro|rw], e.g. '/data:/data:ro'; got {len(parts)} ':'-separated "
                         "parts (paths cannot contain ':')")
    source, target, *mode = parts
    if mode and mode[0] not in ("ro", "rw"):
        raise ValueError(f"the mode after the second ':' must be 'ro' or 'rw', not {mode[0]!r}")
    for what, path in (("source", source), ("target", target)):
        if not path.startswith("/"):
            raise ValueError(f"the {what} {path!r} must be an absolute path (starting with '/')")
        if "," in path:
            raise ValueError(f"the {what} {path!r} contains ',', which Apptainer reads as a list separator")
    if posixpath.normpath(target) == "/":
        raise ValueError("the target cannot be '/': it would hide the image's whole file system")
    return Mount(source=source, target=target, read_only=bool(mode) and mode[0] == "ro")


MountValue = Annotated[Mount, BeforeValidator(parse_mount), PlainSerializer(str, return_type=str)]

# `run` options `launch` sets itself, per runtime (a second value would conflict or leak values onto argv).
RESERVED_OPTIONS: dict[Runtime, frozenset[str]] = {
    Runtime.DOCKER: frozenset({"--name", "--rm", "--pull", "--network", "--net", "--ipc", "-d", "--detach",
                               "-e", "--env", "--env-file", "-w", "--workdir"}),
    Runtime.PODMAN: frozenset({"--name", "--rm", "--pull", "--network", "--net", "--ipc", "-d", "--detach",
                               "-e", "--env", "--env-file", "--env-host", "-w", "--workdir"}),
    Runtime.APPTAINER: frozenset({"-e", "--cleanenv", "--env", "--env-file", "--pwd", "--cwd", "-C",
                                  "--containall", "--net", "--network", "--ipc"}),
}


class ContainerSpec(Strict):
    """Run every node's command inside a container of one image."""

    image: str | None = Field(
        None, min_length=1,
        description="Image to run: a reference such as registry.local/pytorch:2.9 (docker, podman), "
                    "or the absolute path of a SIF file or sandbox directory on every node (apptainer). "
                    "Required in the job or in the cluster's default.",
    )
    runtime: Runtime = Field(Runtime.DOCKER, description="Container runtime on the nodes: docker | podman | apptainer.")
    pull: PullPolicy = Field(
        PullPolicy.MISSING,
        description="missing: pull only where the image is absent; always: pull before every launch; "
                    "never: refuse a node without the image. Apptainer images are files: never pulled.",
    )
    mounts: list[MountValue] = Field(
        default_factory=list,
        description="Bind mounts SOURCE:TARGET[:ro|rw] (absolute paths). The workdir is mounted at its own path "
                    "unless a mount targets it.",
    )
    python: str = Field(
        "python3", min_length=1,
        description="The interpreter inside the image that runs torchrun or the DeepSpeed launcher "
                    "(a name on the image's PATH, or an absolute path).",
    )
    options: list[str] = Field(
        default_factory=list,
        description="More options for the runtime's run command, as a list of arguments "
                    "(e.g. ['--ulimit', 'memlock=-1']); placed after launch's own, before the image.",
    )

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        if v is not None and (v.startswith("-") or any(c.isspace() for c in v)):
            raise ValueError("an image cannot start with '-' or contain spaces")
        return v

    @field_validator("mounts")
    @classmethod
    def _distinct_targets(cls, v: list[Mount]) -> list[Mount]:
        targets = [posixpath.normpath(m.target) for m in v]
        twice = sorted({t for t in targets if targets.count(t) > 1})
        if twice:
            raise ValueError(f"more than one mount targets {', '.join(twice)}")
        return v

    @field_validator("options", mode="before")
    @classmethod
    def _options_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            raise ValueError("expected a list of arguments, one item each, e.g. ['--ulimit', 'nofile=16384:16384']")
        return v

    @field_validator("options")
    @classmethod
    def _options(cls, v: list[str]) -> list[str]:
        if any(not option for option in v):
            raise ValueError("an option cannot be an empty string")
        return v

    @model_validator(mode="after")
    def _fits_runtime(self) -> ContainerSpec:
        reserved = sorted({o for o in self.options if o.split("=", 1)[0] in RESERVED_OPTIONS[self.runtime]})
        if reserved:
            raise ValueError(
                f"options {', '.join(reserved)}: launch sets these itself for {self.runtime.value} "
                "(container name, removal, pull, host network and IPC, environment by name, working directory)"
            )
        if self.runtime is Runtime.APPTAINER:
            if self.image is not None and not self.image.startswith("/"):
                raise ValueError(
                    f"runtime apptainer runs a SIF file or sandbox directory present on every node: give image as an "
                    f"absolute path (got {self.image!r}); make one with `apptainer pull /path/image.sif docker://...`"
                )
            if self.pull is PullPolicy.ALWAYS:
                raise ValueError("pull: always does not apply to apptainer (the image is a file on each node); "
                                 "use 'missing' or 'never'")
        return self


def effective_container(job_value: ContainerSpec | None, cluster_value: ContainerSpec | None) -> ContainerSpec | None:
    """The container a job runs in: the cluster's section as a default, each key the job sets winning.

    Lists are keys too: a job's ``mounts`` or ``options`` replace the cluster's. None when neither has a
    section. SpecError when the merged section has no image or does not fit its runtime.
    """
    if job_value is None and cluster_value is None:
        return None
    merged: dict[str, Any] = {}
    for section in (cluster_value, job_value):
        if section is not None:
            merged.update(section.model_dump(mode="json", include=section.model_fields_set))
    try:
        spec = ContainerSpec.model_validate(merged)
    except ValidationError as exc:
        problems = "; ".join(e["msg"].removeprefix("Value error, ") for e in exc.errors())
        raise SpecError(f"container: the job's section merged over the cluster's default is invalid: {problems}") from None
    if spec.image is None:
        raise SpecError("container: no image; set container.image in the job spec or in the cluster spec's default")
    return spec
