"""This machine, as the embedded local cluster describes it, and whether a job fits in it.

The local cluster tells the truth: its slots are the CPUs this process may use, its GPUs those
nvidia-smi lists. A job that needs more processes than that, or whose estimated host memory
exceeds this machine's, is refused before a process starts, with the numbers and a command
line that fits.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from launcher.backends.local.hostfit import GIB, host_memory, suggestion
from launcher.backends.nodechecks import HOST_MEMORY_SHARE as MEMORY_SHARE
from launcher.errors import PlanError


def cpu_slots() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's total)."""
    return len(os.sched_getaffinity(0))


def gpu_count() -> int:
    """GPUs nvidia-smi lists on this machine (0 without a driver)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU ")) if done.returncode == 0 else 0


def memory_total() -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_fits(job, cluster, plan) -> None:
    """PlanError when the job's processes or their estimated host memory exceed this machine."""
    ranks = plan.nnodes * plan.nproc_per_node
    problems = []
    slots = cluster.local.gpus or cluster.local.slots
    if ranks > slots:
        what = f"has {slots} GPU(s) (local.gpus)" if cluster.local.gpus else f"may use {slots} CPU(s) (local.slots)"
        problems.append(f"resources: {plan.nnodes} node(s) x {plan.nproc_per_node} = {ranks} processes on this machine, which {what}")
    total = memory_total()
    need = host_memory(job, plan)
    if total and need is not None and need.total_bytes > total * MEMORY_SHARE:
        problems.append(
            f"memory: about {need.total_bytes / GIB:.1f} GiB of host memory needed ({need.describe()}), "
            f"this machine has {total / GIB:.1f} GiB ({MEMORY_SHARE:.0%} usable: {total * MEMORY_SHARE / GIB:.1f} GiB)"
        )
    if problems:
        fix = suggestion(job, cluster, plan, slots, total and total * MEMORY_SHARE)
        raise PlanError(
            f"job '{job.name}' does not fit this machine (the local cluster); nothing was started:\n"
            + "\n".join(f"  {p}" for p in problems)
            + (f"\n  this fits: {fix}" if fix else "")
        )
