"""The Slurm test cluster itself: real munged, slurmctld and slurmd on the namespaced testbed.

What a user of the ``slurm`` fixture relies on: idle nodes named after the hosts, jobs that run
on both hosts, a cancelled job that leaves nothing behind, a drained node that holds jobs back.
torchrun across the allocation and a second job queued behind the first are what launch's own
Slurm tests run (test_slurm_backend.py: two nodes with metrics, a job queued behind another).
"""

from __future__ import annotations

from pathlib import Path

from tests.slurm_fixture import (  # the `slurm` fixture comes from tests/conftest.py
    JOB_END_STATES,
    SLURM_NODES,
    job_state,
    node_drained,
    steps,
    submit,
    wait_for,
    wait_for_state,
)
from tests.testbed_fixture import needs_root
from tools import slurm as sl
from tools import testbed as tb

pytestmark = needs_root


def _node_names(cluster: sl.SlurmCluster) -> list[str]:
    return [host.name for host in cluster.nodes]


def _batch_script(path: Path, *lines: str) -> Path:
    path.write_text("#!/bin/bash\nset -e\n" + "\n".join(lines) + "\n")
    return path


def _job_processes(cluster: sl.SlurmCluster) -> dict[str, list[int]]:
    """Processes on each node other than its sshd and slurmd: what jobs run or left behind."""
    return {host.name: tb.pids(host) for host in cluster.nodes}


def test_every_node_is_idle_in_one_partition(slurm: sl.SlurmCluster) -> None:
    out = slurm.run(["sinfo", "-h", "-N", "-o", "%P %N %T"]).stdout
    partition = f"{slurm.partition}*"  # the default partition
    assert sorted(out.splitlines()) == [f"{partition} {name} idle" for name in _node_names(slurm)]
    assert len(slurm.nodes) == SLURM_NODES


def test_srun_runs_on_both_hosts(slurm: sl.SlurmCluster) -> None:
    out = slurm.run(["srun", "-N2", "hostname"]).stdout
    assert sorted(out.split()) == _node_names(slurm)


def test_scancel_ends_a_running_job_and_leaves_nothing_on_the_hosts(slurm: sl.SlurmCluster,
                                                                     tmp_path: Path) -> None:
    script = _batch_script(tmp_path / "sleep.sh", "srun --ntasks-per-node=1 sleep 300")
    job = submit(slurm, "-N2", f"--output={tmp_path}/job.out", str(script))
    wait_for(lambda: all(_job_processes(slurm).values()), 60, "the job's processes on both hosts")
    wait_for(lambda: f"{job}.0" in steps(slurm, job), 10, "step 0 to be listed")
    slurm.run(["scancel", job])
    assert wait_for_state(slurm, job, JOB_END_STATES, timeout=30)[0] == "CANCELLED"
    wait_for(lambda: not steps(slurm, job), 30, "every step of the job to end")
    wait_for(lambda: not any(_job_processes(slurm).values()), 30, "both hosts to hold no job process")


def test_a_drained_node_holds_two_node_jobs_back(slurm: sl.SlurmCluster, tmp_path: Path) -> None:
    with node_drained(slurm, slurm.nodes[1], reason="maintenance"):
        assert sl.node_states(slurm)[slurm.nodes[1].name] == "drained"
        job = submit(slurm, "-N2", f"--output={tmp_path}/job.out", "--wrap=hostname")
        try:
            wait_for(lambda: job_state(slurm, job)[1] != "None", 10, "a pending reason")
            state, reason, _ = job_state(slurm, job)
            assert state == "PENDING"
            assert reason == f"ReqNodeNotAvail, UnavailableNodes:{slurm.nodes[1].name}"
        finally:
            slurm.run(["scancel", job])
    assert wait_for_state(slurm, job, JOB_END_STATES)[0] == "CANCELLED"
