"""Pytest fixture and helpers for a real Slurm cluster on the session's testbed (tools/slurm.py).

Loaded once, from tests/conftest.py, as a plugin (next to tests.testbed_fixture)::

    pytest_plugins = ["tests.testbed_fixture", "tests.slurm_fixture"]

``slurm`` starts munged, slurmctld and one slurmd on each of the first ``SLURM_NODES``
hosts of the one ``testbed`` (never a second testbed: it holds the machine-wide lock),
once per session; before each test it restarts a slurmd found dead. One partition of 2 nodes, 1 CPU each: a 2-node job takes the whole
partition, so a second 2-node job queues behind it (PENDING, reason Resources) - the
queueing the Slurm backend must show - and the other testbed hosts stay free for
tests that break hosts. Tests that stop a slurmd or drain a node use the context
managers below, which give the next test idle nodes again even when the test fails.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from tests.testbed_fixture import SLURM_BED, Beds
from tools import slurm as sl
from tools import testbed as tb

SLURM_NODES = 2
JOB_END_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                  "BOOT_FAIL", "DEADLINE")
T = TypeVar("T")


@pytest.fixture(scope="session")
def slurm_cluster(testbeds: Beds, tmp_path_factory: pytest.TempPathFactory) -> Iterator[sl.SlurmCluster]:
    """The session's Slurm cluster: the first SLURM_NODES hosts of bed SLURM_BED in one partition."""
    cluster = sl.up(testbeds.get(SLURM_BED), tmp_path_factory.mktemp("slurm"), nodes=SLURM_NODES)
    try:
        yield cluster
    finally:
        sl.down(cluster)


@pytest.fixture
def slurm(slurm_cluster: sl.SlurmCluster) -> sl.SlurmCluster:
    """The session's Slurm cluster with a slurmd on every node: one that an earlier test left
    dead (or that a testbed ``down``/``up`` took away) is started again first."""
    for host in slurm_cluster.nodes:
        if not sl.slurmd_running(slurm_cluster, host):
            sl.restart_slurmd(slurm_cluster, host)
    return slurm_cluster


def wait_for(predicate: Callable[[], T], timeout: float, what: str, every: float = 0.1) -> T:
    """Poll ``predicate`` until it returns something true, and return that; fail the test
    naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)
    return value


def submit(cluster: sl.SlurmCluster, *sbatch_args: str) -> str:
    """``sbatch --parsable ARGS``; the job id."""
    return cluster.run(["sbatch", "--parsable", *sbatch_args]).stdout.strip().split(";")[0]


def job_state(cluster: sl.SlurmCluster, job_id: str) -> tuple[str, str, str]:
    """(state, reason, node list) of a job the controller still remembers."""
    out = cluster.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T|%r|%N"]).stdout.strip()
    state, reason, nodes = out.split("|")
    return state, reason, nodes


def wait_for_state(cluster: sl.SlurmCluster, job_id: str, states: tuple[str, ...],
                   timeout: float = 60.0) -> tuple[str, str, str]:
    """Wait until the job's state is one of ``states``; return (state, reason, node list)."""
    return wait_for(lambda: (found := job_state(cluster, job_id))[0] in states and found, timeout,
                    f"job {job_id} to be {' or '.join(states)}")


def steps(cluster: sl.SlurmCluster, job_id: str) -> list[str]:
    """Ids of the job's steps that still run (``batch``, ``0``, ...)."""
    out = cluster.run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i"], check=False).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


@contextlib.contextmanager
def slurmd_killed(cluster: sl.SlurmCluster, host: tb.Host) -> Iterator[None]:
    """``host``'s slurmd is SIGKILLed inside the block (steps there keep running); after it,
    slurmd runs again, the node is idle and the steps the controller no longer knows are gone
    (slurmd ends them a few seconds after it registers)."""
    sl.kill_slurmd(cluster, host)
    try:
        yield
    finally:
        sl.restart_slurmd(cluster, host)
        wait_for(lambda: not tb.pids(host), 30, f"the orphaned steps on {host.name} to end")


@contextlib.contextmanager
def node_drained(cluster: sl.SlurmCluster, host: tb.Host, reason: str = "test") -> Iterator[None]:
    """``host``'s node is drained inside the block and back in service after it."""
    sl.drain(cluster, host, reason)
    try:
        yield
    finally:
        sl.resume(cluster, host)
        sl.wait_for_nodes(cluster, "idle", [host])
