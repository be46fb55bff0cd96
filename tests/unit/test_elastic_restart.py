"""Which nodes an elastic job's next attempt gets, and what it is told (run.elastic, without processes).

The check (plan + preflight) is a stand-in that plans for real and refuses the hosts a test calls down;
numbers are worked out by hand in the comments. The real thing is tests/integration/test_elastic.py.
"""

from __future__ import annotations

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.backends.base import Preflight
from launcher.errors import LaunchError, PreflightError
from launcher.plan.netenv import NodeNetwork
from launcher.run import elastic
from launcher.run.orchestrate import placed
from launcher.spec import ClusterSpec, JobSpec

SSH = cluster_spec(name="a800", backend="ssh", python="/usr/bin/python3", workdir="/work",
                  nodes=[{"host": f"a800-0{i}", "address": f"10.0.0.{i}", "gpus": 8} for i in range(1, 5)])
# global 1024 = micro 16 x GA 2 x (4 nodes x 8): 3 nodes would need 1024 / 384 (not whole), 2 nodes GA 4
JOB = JobSpec(name="big", entrypoint=["python", "t.py"], batch={"global_batch": 1024, "micro_batch": 16},
              resources={"nodes": 4, "nproc_per_node": 8}, restarts=3, elastic={"min_nodes": 2})
# global 24 = micro 2 x GA 3 x 4: 3 nodes GA 4, 2 nodes GA 6
EVEN = JOB.model_copy(update={"batch": JOB.batch.model_copy(update={"global_batch": 24, "micro_batch": 2}),
                              "resources": JOB.resources.model_copy(update={"nproc_per_node": 1})})


class Checker:
    """Plans for real; preflight fails on the hosts in ``down`` (as the real one words it)."""

    def __init__(self, down: frozenset[str] = frozenset()) -> None:
        self.down = down
        self.tried: list[list[str]] = []

    def __call__(self, job, cluster, previous, attempt):
        plan = plan_job(job, cluster, previous.job_id, rdzv_port=previous.rendezvous.port,
                        resumed=(attempt, previous.world_size))
        self.tried.append([n.host for n in plan.nodes])
        bad = [n.host for n in plan.nodes if n.host in self.down]
        if bad:
            raise PreflightError("preflight failed; nothing was started:\n" + "\n".join(f"  {h}: unreachable" for h in bad))
        return plan, object()


def _first(job: JobSpec = EVEN, cluster: ClusterSpec = SSH):
    return plan_job(job, cluster, "big-00000001", rdzv_port=29500)


def test_losing_one_of_four_skips_three_nodes_without_a_whole_grad_accum() -> None:
    done = elastic.replan(JOB, SSH, _first(JOB), elastic.Lost("a800-04", 18231), 1, Checker())
    assert [n.host for n in done.plan.nodes] == ["a800-01", "a800-02"]
    assert done.message == "attempt 1: 2 nodes (a800-04 lost at step 18231), grad_accum 2 -> 4, global batch 1024 kept"
    env = done.plan.nodes[0].env
    assert (env["LAUNCH_GRAD_ACCUM"], env["LAUNCH_MICRO_BATCH"], env["LAUNCH_GLOBAL_BATCH"]) == ("4", "16", "1024")
    assert (env["LAUNCH_ATTEMPT"], env["LAUNCH_PREVIOUS_WORLD_SIZE"]) == ("1", "32")
    found = Preflight(probes={i: NodeNetwork(interface="eth0", address=f"10.0.0.{i + 1}", ib_hcas=("mlx5_0",))
                              for i in (0, 1)})
    two = JOB.model_copy(update={"resources": JOB.resources.model_copy(update={"nodes": 2})})
    again = placed(two, SSH, done.plan, found).nodes[0].env  # made again with what preflight found
    assert (again["LAUNCH_ATTEMPT"], again["LAUNCH_PREVIOUS_WORLD_SIZE"]) == ("1", "32")


def test_a_divisible_batch_goes_on_with_the_three_left() -> None:
    first = _first()
    done = elastic.replan(EVEN, SSH, first, elastic.Lost("a800-02", 7), 1, Checker())
    assert [n.host for n in done.plan.nodes] == ["a800-01", "a800-03", "a800-04"]
    assert done.message == "attempt 1: 3 nodes (a800-02 lost at step 7), grad_accum 3 -> 4, global batch 24 kept"
    assert done.data["previous_world_size"] == 4 and done.data["world_size"] == 3


def test_a_host_lost_before_is_used_again_when_it_passes_preflight() -> None:
    three = elastic.replan(EVEN, SSH, _first(), elastic.Lost("a800-04", 7), 1, Checker()).plan
    back = elastic.replan(EVEN, SSH, three, elastic.Lost("a800-01", 12), 2, Checker())
    assert [n.host for n in back.plan.nodes] == ["a800-02", "a800-03", "a800-04"]
    assert back.message == "attempt 2: 3 nodes (a800-01 lost at step 12; a800-04 back), grad_accum 4 kept, global batch 24 kept"


def test_a_candidate_failing_preflight_is_dropped_and_the_rest_tried() -> None:
    checker = Checker(down=frozenset({"a800-03"}))
    done = elastic.replan(EVEN, SSH, _first(), elastic.Lost("a800-04", 7), 1, checker)
    assert checker.tried == [["a800-01", "a800-02", "a800-03"], ["a800-01", "a800-02"]]
    assert done.plan.batch is not None and done.plan.batch.grad_accum == 6


def test_fewer_nodes_than_min_nodes_end_the_job_saying_so() -> None:
    two = SSH.model_copy(update={"nodes": SSH.nodes[:3]})
    job = EVEN.model_copy(update={"resources": EVEN.resources.model_copy(update={"nodes": 3})})
    # global 24 at 3 nodes: GA 4; one lost, one down: a single node is left, min_nodes is 2
    with pytest.raises(LaunchError, match=r"elastic: 1 node\(s\) left, and min_nodes is 2 \(legal counts: 3 nodes: GA 4, 2 nodes: GA 6\)"):
        elastic.replan(job, two, _first(job, two), elastic.Lost("a800-03", 7), 1, Checker(down=frozenset({"a800-02"})))


def test_on_a_cluster_without_a_node_list_one_node_fewer() -> None:
    local = cluster_spec(name="l", backend="local", python="/usr/bin/python3", workdir="/work", local={"slots": 4})
    done = elastic.replan(EVEN, local, _first(EVEN, local), elastic.Lost("localhost", 3), 1, Checker())
    assert done.plan.nnodes == 3 and done.plan.batch is not None and done.plan.batch.grad_accum == 4


def test_a_hang_keeps_every_node() -> None:
    done = elastic.replan(EVEN, SSH, _first(), elastic.Lost(), 1, Checker())
    assert done.plan.nnodes == 4 and done.message == "attempt 1: 4 nodes, grad_accum 3 kept, global batch 24 kept"


def test_on_slurm_the_job_is_resubmitted_with_one_node_fewer() -> None:
    from launcher.backends.slurm import commands

    slurm = cluster_spec(name="s", backend="slurm", workdir="/shared", python="/usr/bin/python3",
                        slurm={"partition": "gpu"})
    done = elastic.replan(EVEN, slurm, _first(EVEN, slurm), elastic.Lost("node-7", 9), 1, Checker())
    argv = commands.sbatch_argv(slurm.slurm, nodes=done.plan.nnodes, job_name="j", output="o", workdir="/shared",
                                script="s")
    assert "--nodes=3" in argv and done.plan.batch is not None and done.plan.batch.grad_accum == 4


def test_a_scheduler_places_the_smaller_job_with_its_global_batch() -> None:
    from launcher.run.orchestrate import placer
    from launcher.spec.cluster import NodeSpec

    slurm = cluster_spec(name="s", backend="slurm", workdir="/shared", python="/usr/bin/python3",
                        slurm={"partition": "gpu"})
    # micro 2 x GA 3 x 4 nodes = global 24; on 3 nodes the global stays 24: GA 4 (not micro 2 x GA 3 x 3 = 18)
    job = EVEN.model_copy(update={"batch": EVEN.batch.model_copy(update={"global_batch": None, "grad_accum": 3})})
    done = elastic.replan(job, slurm, _first(job, slurm), elastic.Lost("node-7", 9), 1, Checker())
    allocated = [NodeSpec(host=f"node-{i}", address=f"10.1.0.{i}", slots=1) for i in range(3)]
    found = Preflight(nodes=allocated, probes={i: NodeNetwork(interface="eth0", address=f"10.1.0.{i}") for i in range(3)})
    placed_plan = placer(done.job, done.cluster)(done.plan, found)
    assert placed_plan.batch is not None and (placed_plan.batch.global_batch, placed_plan.batch.grad_accum) == (24, 4)
    assert placed_plan.nodes[0].env["LAUNCH_ATTEMPT"] == "1"
