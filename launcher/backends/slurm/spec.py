"""The Slurm backend's cluster model: ``backend: slurm``, its ``slurm:`` section, and Slurm's time-limit format.

A time limit is written as ``sbatch --time`` takes it (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``,
``D-HH:MM``, ``D-HH:MM:SS``); Slurm rounds seconds up to whole minutes and has no limit below one
minute. ``options`` are more ``sbatch`` options, one argument each (``--mem=0``), never one that
launch sets itself or that has its own key here.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from launcher.spec.base import Strict
from launcher.spec.cluster import ClusterSpec
from launcher.spec.fields import MAX_PROCS_PER_NODE, Arg, Name

UNLIMITED = ("UNLIMITED", "INFINITE")
MAX_WARNING_S = 65535  # sbatch --signal's @time is at most this
_TIME = re.compile(r"^(?:(\d{1,4})-)?(\d{1,6})(?::(\d{1,2}))?(?::(\d{1,2}))?$")
# Options launch sets itself (the job's shape, its files, its signal), and those with a key of their own here.
_OWN_OPTIONS = {
    "--nodes": "resources.nodes", "-N": "resources.nodes", "--ntasks": None, "-n": None, "--ntasks-per-node": None,
    "--job-name": None, "-J": None, "--output": None, "-o": None, "--error": None, "-e": None, "--parsable": None,
    "--signal": "slurm.time_warning", "--requeue": None, "--no-requeue": None, "--chdir": None, "-D": None,
    "--wrap": None, "--export": None, "--array": None, "-a": None, "--wait": None, "-W": None, "--test-only": None,
    "--hold": None, "-H": None, "--partition": "slurm.partition", "-p": "slurm.partition",
    "--account": "slurm.account", "-A": "slurm.account", "--qos": "slurm.qos", "-q": "slurm.qos",
    "--time": "slurm.time", "-t": "slurm.time", "--gpus-per-node": "slurm.gpus_per_node",
    "--gpus": "slurm.gpus_per_node", "-G": "slurm.gpus_per_node", "--exclusive": "slurm.exclusive",
    "--constraint": "slurm.constraint", "-C": "slurm.constraint",
}


def time_minutes(text: str) -> int | None:
    """Minutes in a Slurm time limit (seconds rounded up, as Slurm does); None for UNLIMITED.
    ValueError for text Slurm would not take."""
    if text.strip().upper() in UNLIMITED:
        return None
    match = _TIME.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)")
    days, first, second, third = (int(part) if part else None for part in match.groups())
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = first or 0, second or 0, third or 0  # the pattern makes HH present
    elif third is not None:  # HH:MM:SS
        hours, minutes, seconds = first or 0, second or 0, third  # all three present
    else:  # MM[:SS]
        hours, minutes, seconds = 0, first or 0, second or 0
    total = ((days or 0) * 24 + hours) * 60 + minutes + (1 if seconds else 0)
    if total == 0:
        raise ValueError(f"{text!r} is zero, which Slurm reads as UNLIMITED: write UNLIMITED, or at least 1 minute")
    return total


def _time(text: str) -> str:
    time_minutes(text)
    return text.strip()


def _no_space(value: str) -> str:
    if any(ch.isspace() for ch in value):
        raise ValueError("cannot contain spaces")
    return value


SlurmTime = Annotated[str, Field(max_length=32), AfterValidator(_time)]
SlurmName = Annotated[Name, AfterValidator(_no_space)]


class GpuFlag(StrEnum):
    """How the job asks for GPUs: ``--gpus-per-node=N`` (Slurm 19.05+, cons_tres) or ``--gres=gpu:N``."""

    GPUS_PER_NODE = "gpus-per-node"
    GRES = "gres"


class SlurmSpec(Strict):
    partition: SlurmName | None = Field(None, description="The partition jobs are submitted to (sbatch --partition); required.")
    account: SlurmName | None = Field(None, description="sbatch --account (default: the user's default account).")
    qos: SlurmName | None = Field(None, description="sbatch --qos (default: the account's default QOS).")
    time: SlurmTime | None = Field(
        None, description="The job's time limit as sbatch --time takes it ('24:00:00', '2-00:00:00', 'UNLIMITED'); "
        "default: the partition's DefaultTime.",
    )
    gpus_per_node: int = Field(0, ge=0, le=MAX_PROCS_PER_NODE,
                               description="GPUs each node gets (0: CPU ranks with gloo); asked for as gpu_flag says.")
    gpu_flag: GpuFlag = Field(
        GpuFlag.GPUS_PER_NODE,
        description="'gpus-per-node' (--gpus-per-node=N, needs SelectType=select/cons_tres) or 'gres' (--gres=gpu:N, "
        "what every Slurm takes); `scontrol show config | grep SelectType` and the site's docs say which.",
    )
    exclusive: bool = Field(False, description="Whole nodes for the job (sbatch --exclusive).")
    constraint: Annotated[Name, Field(max_length=1024)] | None = Field(None, description="sbatch --constraint (node features).")
    options: list[Arg] = Field(
        default_factory=list, max_length=64,
        description="More sbatch options, one argument each with its value: ['--mem=0', '--reservation=maint'].",
    )
    time_warning: int = Field(
        300, ge=0, le=MAX_WARNING_S,
        description="Seconds before the time limit at which ranks that handle SIGUSR1 get it, to checkpoint "
        "(sbatch --signal=B:USR1@N, forwarded by the node agents; Slurm sends it up to 30 s late); 0: none.",
    )

    @field_validator("options")
    @classmethod
    def _options(cls, options: list[str]) -> list[str]:
        problems = []
        for option in options:
            if not option.startswith("-"):
                problems.append(f"{option[:40]!r} is not an option: write each with its value, as '--reservation=maint'")
                continue
            name = option.split("=", 1)[0] if option.startswith("--") else option[:2]
            if name in _OWN_OPTIONS:
                key = _OWN_OPTIONS[name]
                problems.append(f"{name} is set by launch" + (f": use {key}" if key else ""))
            elif name == "--gres" and "gpu" in option:
                problems.append("--gres with GPUs: use slurm.gpus_per_node and slurm.gpu_flag: gres")
        if problems:
            raise ValueError("; ".join(problems))
        return options


class SlurmCluster(ClusterSpec):
    """A Slurm partition: Slurm places the nodes, which meet in a job directory under workdir (a shared filesystem)."""

    backend: Literal["slurm"]
    slurm: SlurmSpec = SlurmSpec()

    @model_validator(mode="after")
    def _check_slurm(self) -> SlurmCluster:
        problems = []
        if not self.slurm.partition:
            problems.append("backend 'slurm' needs 'slurm: {partition: NAME}' (`sinfo -s` lists the partitions)")
        if not self.workdir or not self.workdir.startswith("/"):
            problems.append("backend 'slurm' needs 'workdir': an absolute path on a filesystem every node and this "
                            "machine mount (the job's files meet there)")
        for key, why in (("nodes", "Slurm chooses the nodes"), ("sync_workdir", "workdir is shared: nothing to copy"),
                         ("setup", "put node set-up in the job's entrypoint or the site's prolog")):
            if getattr(self, key):
                problems.append(f"'{key}' is not used by backend 'slurm' ({why}): remove it")
        if problems:
            raise ValueError("; ".join(problems))
        return self
