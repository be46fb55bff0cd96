"""Slurm's client commands as launch uses them: argv built from the spec, output parsed into typed values.

``sbatch --parsable`` submits; ``squeue -t all`` follows a job (it says nothing of an ended job
without ``-t all``); ``scontrol show job -o`` gives its Reason and exit code; ``scancel`` ends it;
``sinfo``/``scontrol show partition`` answer at submit whether the partition can ever hold the job.
No accounting is needed (``sacct`` is not used). Facts behind these choices: tools/SLURM-NOTES.md.

A command that fails is SlurmCommandError, never an empty answer: "no step left" or "no job of that
name" is what Slurm said, not what a busy controller's timeout looks like. Only a job the controller
has forgotten (``Invalid job id``) reads as gone.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from launcher.backends.slurm.spec import GpuFlag, SlurmSpec, time_minutes
from launcher.errors import LaunchError

COMMAND_TIMEOUT_S = 30.0


class SlurmState(StrEnum):
    """Job states as ``squeue %T`` prints them (COMPLETING is a flag Slurm shows as the state)."""

    PENDING = "PENDING"
    CONFIGURING = "CONFIGURING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    REQUEUED = "REQUEUED"
    RESIZING = "RESIZING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    GONE = "GONE"  # launch's own: the controller no longer knows the job

    @property
    def ended(self) -> bool:
        return self not in _LIVE


_LIVE = {SlurmState.PENDING, SlurmState.CONFIGURING, SlurmState.RUNNING, SlurmState.COMPLETING,
         SlurmState.SUSPENDED, SlurmState.REQUEUED, SlurmState.RESIZING}


@dataclass(frozen=True)
class JobStatus:
    """One line of ``squeue -h -t all -j ID -o '%T|%r|%N'``."""

    state: SlurmState
    reason: str
    nodelist: str


@dataclass(frozen=True)
class Partition:
    """What ``scontrol show partition NAME -o`` says of a partition, as far as launch needs it."""

    name: str
    up: bool
    total_nodes: int
    max_nodes: int | None
    max_minutes: int | None


class SlurmCommandError(LaunchError):
    """A Slurm client command failed or could not run; the message has Slurm's own words."""


def run(argv: Sequence[str], timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run a Slurm client command; SlurmCommandError naming it when it cannot run (not found, timed out)."""
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmCommandError(
            f"`{argv[0]}` not found: backend 'slurm' runs where Slurm's client commands work (a login node)",
            hint="run launch on a login node, or put Slurm's bin directory on PATH",
        ) from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmCommandError(f"`{shlex.join(argv[:3])}` failed: {exc}") from None


FORGOTTEN = "Invalid job id"  # what squeue and scontrol say of a job the controller no longer knows


def checked(argv: Sequence[str], timeout: float = COMMAND_TIMEOUT_S, forgotten: str | None = None) -> str:
    """stdout of a command that must succeed; SlurmCommandError with its stderr if it does not. ``forgotten``:
    the answer when the command failed because the controller no longer knows the job."""
    done = run(argv, timeout)
    if done.returncode != 0 and forgotten is not None and FORGOTTEN in done.stderr:
        return forgotten
    if done.returncode != 0:
        words = (done.stderr or done.stdout).strip()[-400:] or f"exit {done.returncode}"
        raise SlurmCommandError(f"`{shlex.join(argv[:4])}` failed: {words}")
    return done.stdout


def sbatch_argv(spec: SlurmSpec, *, nodes: int, job_name: str, output: str, workdir: str, script: str) -> list[str]:
    """The ``sbatch`` command for a job of ``nodes`` nodes, one task each, not requeued on a node failure."""
    argv = ["sbatch", "--parsable", "--no-requeue", f"--nodes={nodes}", "--ntasks-per-node=1",
            f"--job-name={job_name}", f"--output={output}", f"--chdir={workdir}", "--export=ALL",
            f"--partition={spec.partition}"]
    if spec.account:
        argv.append(f"--account={spec.account}")
    if spec.qos:
        argv.append(f"--qos={spec.qos}")
    if spec.time:
        argv.append(f"--time={spec.time}")
    if spec.gpus_per_node:
        argv.append(f"--gpus-per-node={spec.gpus_per_node}" if spec.gpu_flag == GpuFlag.GPUS_PER_NODE
                    else f"--gres=gpu:{spec.gpus_per_node}")
    if spec.exclusive:
        argv.append("--exclusive")
    if spec.constraint:
        argv.append(f"--constraint={spec.constraint}")
    if spec.time_warning:
        argv.append(f"--signal=B:USR1@{spec.time_warning}")
    return [*argv, *spec.options, script]


def srun_argv(spec: SlurmSpec, host: str, minutes: int) -> list[str]:
    """``srun`` of one task on node ``host`` of the partition, with the job's GPUs (for `launch check`)."""
    argv = ["srun", "--quiet", f"--partition={spec.partition}", "--nodes=1", "--ntasks=1", f"--nodelist={host}",
            f"--time={minutes}", f"--job-name=launch-check-{host}"]
    argv += [f"--account={spec.account}"] if spec.account else []
    argv += [f"--qos={spec.qos}"] if spec.qos else []
    if spec.gpus_per_node:
        argv.append(f"--gpus-per-node={spec.gpus_per_node}" if spec.gpu_flag == GpuFlag.GPUS_PER_NODE
                    else f"--gres=gpu:{spec.gpus_per_node}")
    return argv


def nodes_in_service(partition: str) -> list[str]:
    """The partition's nodes that take jobs now (idle, mixed or allocated), in sinfo's order."""
    out = checked(["sinfo", "-h", "-N", "-p", partition, "-t", "idle,mixed,allocated", "-o", "%N"])
    return list(dict.fromkeys(line.strip() for line in out.splitlines() if line.strip()))


def parse_job_id(out: str) -> str:
    """The id ``sbatch --parsable`` printed (``ID`` or ``ID;CLUSTER``)."""
    first = out.strip().split(";")[0]
    if not first.isdigit():
        raise SlurmCommandError(f"sbatch printed no job id: {out.strip()[:200]!r}")
    return first


def squeue_argv(job_id: str) -> list[str]:
    return ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%r|%N"]


def parse_squeue(out: str) -> JobStatus:
    """The status in ``squeue_argv``'s output; GONE when it printed nothing."""
    line = next((line for line in out.splitlines() if line.strip()), "")
    if not line:
        return JobStatus(SlurmState.GONE, "", "")
    state, _, rest = line.partition("|")
    reason, _, nodelist = rest.partition("|")
    word = state.strip().split()[0] if state.strip() else ""
    try:
        parsed = SlurmState(word)
    except ValueError:
        parsed = SlurmState.RUNNING if word else SlurmState.GONE  # a state this launch does not know: still there
    return JobStatus(parsed, reason.strip(), nodelist.strip())


def job_status(job_id: str) -> JobStatus:
    """The job's status from squeue (GONE once the controller has forgotten it)."""
    return parse_squeue(checked(squeue_argv(job_id), forgotten=""))


_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z/:_]*)=")


def parse_key_values(line: str) -> dict[str, str]:
    """``Key=Value Key2=Value two`` (scontrol ``-o``) as a dict; a value runs up to the next key."""
    matches = list(_KEY.finditer(line))
    return {m[1]: line[m.end(): matches[i + 1].start() if i + 1 < len(matches) else len(line)].strip()
            for i, m in enumerate(matches)}


def show_job(job_id: str) -> dict[str, str]:
    """``scontrol show job -o ID`` as keys and values ({} once the controller has forgotten the job)."""
    return parse_key_values(checked(["scontrol", "show", "job", "-o", job_id], forgotten="").strip())


def hostnames(nodelist: str) -> list[str]:
    """A node list (``lt-h[1-2]``) expanded, in Slurm's order (node index order)."""
    if not nodelist or nodelist in ("(null)", "None"):
        return []
    return checked(["scontrol", "show", "hostnames", nodelist]).split()


def node_reasons(names: Sequence[str]) -> dict[str, tuple[str, str]]:
    """(state, reason) of each named node, from sinfo (``down*``, ``Not responding``)."""
    if not names:
        return {}
    out = checked(["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N|%T|%E"])
    found = {}
    for line in out.splitlines():
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        found[name.strip()] = (state.strip(), reason.strip())
    return found


def steps(job_id: str) -> list[str]:
    """Ids of the job's steps still running (``12.0``, ``12.batch``); none once the controller forgot the job."""
    out = checked(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"], forgotten="")
    return [line.strip() for line in out.splitlines() if line.strip()]


def jobs_named(name: str) -> list[str]:
    """Ids of the jobs the controller knows with this name (every attempt of a launch job)."""
    out = checked(["squeue", "-h", "-t", "all", "-n", name, "-o", "%i"])
    return [line.strip() for line in out.splitlines() if line.strip().isdigit()]


def cancel(job_id: str) -> None:
    """``scancel ID`` (a job that already ended is not an error)."""
    done = run(["scancel", job_id])
    if done.returncode != 0 and "Invalid job id" not in done.stderr and "already completing" not in done.stderr:
        raise SlurmCommandError(f"`scancel {job_id}` failed: {done.stderr.strip()[-300:]}")


def parse_partition(line: str) -> Partition:
    """A partition from ``scontrol show partition NAME -o``."""
    values = parse_key_values(line)

    def number(key: str) -> int | None:
        value = values.get(key, "")
        return int(value) if value.isdigit() else None

    limit = values.get("MaxTime", "UNLIMITED")
    return Partition(name=values.get("PartitionName", ""), up=values.get("State", "UP") == "UP",
                     total_nodes=number("TotalNodes") or 0, max_nodes=number("MaxNodes"),
                     max_minutes=time_minutes(limit) if limit not in ("", "UNLIMITED", "INFINITE") else None)


def partition(name: str) -> Partition | None:
    """The partition called ``name``, or None when the controller knows none."""
    done = run(["scontrol", "show", "partition", name, "-o"])
    if done.returncode != 0 or not done.stdout.strip():
        if "not found" in (done.stderr + done.stdout):
            return None
        raise SlurmCommandError(f"`scontrol show partition {name}` failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return parse_partition(done.stdout.strip().splitlines()[0])


def partition_gpus(name: str) -> list[tuple[int, int]]:
    """(nodes, GPUs per node) for each group of the partition's nodes, from sinfo's GRES column
    (``gpu:8``, ``gpu:a800:8(S:0-1)``; 0 GPUs where a group has none)."""
    out = checked(["sinfo", "-h", "-p", name, "-o", "%D|%G"])
    return [parse_gres_line(line) for line in out.splitlines() if "|" in line]


def parse_gres_line(line: str) -> tuple[int, int]:
    """(nodes, GPUs per node) in one ``%D|%G`` line of sinfo."""
    count, _, gres = line.partition("|")
    gpus = sum(int(m[1]) for m in re.finditer(r"gpu(?::[A-Za-z][\w.-]*)?:(\d+)", gres))
    return int(count) if count.strip().isdigit() else 0, gpus
