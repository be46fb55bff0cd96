"""The Slurm test cluster itself: real munged, slurmctld and slurmd on the namespaced testbed.

What a user of the ``slurm`` fixture relies on: idle nodes named after the hosts, jobs
that run on both hosts (torchrun included), a second 2-node job queued behind the first,
and a cancelled job that leaves nothing behind.
"""

from __future__ import annotations

import json
import sys
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

PROBE = Path(__file__).resolve().parents[1] / "programs" / "rank_probe.py"


def _node_names(cluster: sl.SlurmCluster) -> list[str]:
    return [host.name for host in cluster.nodes]


def _batch_script(path: Path, *lines: str) -> Path:
    path.write_text("#!/bin/bash\nset -e\n" + "\n".join(lines) + "\n")
    return path


def _holding_script(path: Path, release: Path) -> Path:
    """A 2-node job whose step runs on every node until ``release`` exists."""
    return _batch_script(path, f"srun --ntasks-per-node=1 bash -c 'while [ ! -e {release} ]; do sleep 0.1; done'")


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


def test_sbatch_torchrun_job_completes_with_a_rank_on_each_host(slurm: sl.SlurmCluster, tmp_path: Path) -> None:
    script = _batch_script(
        tmp_path / "torchrun.sh",
        'MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"srun --ntasks-per-node=1 {sys.executable} -m torch.distributed.run --nnodes=2 --nproc-per-node=1 "
        '--rdzv-backend=c10d --rdzv-endpoint="$MASTER:29500" --rdzv-id="$SLURM_JOB_ID" '
        f"{PROBE}",
    )
    env = f"ALL,PROBE_OUT={tmp_path},PROBE_STEPS=1"
    job = submit(slurm, "-N2", f"--export={env}", f"--output={tmp_path}/job.out", str(script))
    state, _, nodes = wait_for_state(slurm, job, JOB_END_STATES, timeout=120)
    log = (tmp_path / "job.out").read_text()
    assert state == "COMPLETED", log
    assert slurm.run(["scontrol", "show", "hostnames", nodes]).stdout.split() == _node_names(slurm)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(r["hostname"] for r in reports) == _node_names(slurm)
    assert [r["identity"]["WORLD_SIZE"] for r in reports] == ["2", "2"]
    assert [r["all_reduce"] for r in reports] == [1.0, 1.0]  # 0 + 1: the ranks talked over gloo


def test_a_second_two_node_job_waits_for_the_first(slurm: sl.SlurmCluster, tmp_path: Path) -> None:
    release = tmp_path / "release"
    first = submit(slurm, "-N2", f"--output={tmp_path}/first.out", str(_holding_script(tmp_path / "a.sh", release)))
    second = submit(slurm, "-N2", f"--output={tmp_path}/second.out", str(_holding_script(tmp_path / "b.sh", release)))
    try:
        wait_for_state(slurm, first, ("RUNNING",))
        # the reason is "None" until the scheduler has looked at the job (about a second)
        state, reason, nodes = wait_for(lambda: (found := job_state(slurm, second))[1] != "None" and found,
                                        10, f"a pending reason for job {second}")
        assert (state, nodes) == ("PENDING", "")
        assert reason in ("Resources", "Priority")
        release.touch()
        assert wait_for_state(slurm, first, JOB_END_STATES)[0] == "COMPLETED"
        assert wait_for_state(slurm, second, JOB_END_STATES)[0] == "COMPLETED"
    finally:
        slurm.run(["scancel", first, second])


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
