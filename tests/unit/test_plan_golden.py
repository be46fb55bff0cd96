"""Plans are pure values: compared with golden files. UPDATE_GOLDEN=1 rewrites them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from launcher.backends import cluster_spec, plan_job
from launcher.spec import JobSpec
from launcher.views.render import plan_json

GOLDEN = Path(__file__).resolve().parent.parent / "golden"

LOCAL = cluster_spec(name="local", backend="local", python="/usr/bin/python3", workdir="/work")


def _job(nodes: int, nproc: int) -> JobSpec:
    return JobSpec(
        name="golden",
        recipe="convnet",
        batch={"global_batch": 64 * nodes * nproc, "micro_batch": 32},
        resources={"nodes": nodes, "nproc_per_node": nproc},
        max_steps=50,
        env={"NCCL_DEBUG": "WARN"},
        secrets=["WANDB_API_KEY"],
    )


def check_golden(name: str, data: dict) -> None:
    path = GOLDEN / f"{name}.json"
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with UPDATE_GOLDEN=1 once and review it"
    assert json.loads(path.read_text()) == json.loads(text)


@pytest.mark.parametrize("nodes,nproc", [(1, 1), (1, 2), (2, 2)])
def test_local_plan_matches_golden(nodes, nproc):
    plan = plan_job(_job(nodes, nproc), LOCAL, "golden-abc123", rdzv_port=29500)
    check_golden(f"plan_local_{nodes}x{nproc}", plan_json(plan))


def test_plan_is_pure_and_repeatable():
    job = _job(2, 2)
    first = plan_job(job, LOCAL, "golden-abc123", rdzv_port=29500)
    second = plan_job(job, LOCAL, "golden-abc123", rdzv_port=29500)
    assert first == second
    with pytest.raises(ValidationError, match="frozen"):
        first.world_size = 3


def test_plan_facts():
    plan = plan_job(_job(2, 2), LOCAL, "golden-abc123", rdzv_port=29500)
    assert plan.world_size == 4 and plan.batch.grad_accum == 2 and plan.batch.global_batch == 256
    assert [n.index for n in plan.nodes] == [0, 1]
    for node in plan.nodes:
        argv = list(node.argv)
        assert argv[argv.index("--node-rank") + 1] == str(node.index)
        assert argv[argv.index("--rdzv-backend") + 1] == "static"
        assert argv[argv.index("--master-addr") + 1] == "127.0.0.1"
        assert argv[argv.index("--master-port") + 1] == "29500"
        assert argv[argv.index("--rdzv-id") + 1] == "golden-abc123"
        assert "--rdzv-endpoint" not in argv and "--local-addr" not in argv
        assert node.env["LAUNCH_JOB_ID"] == "golden-abc123"
    assert "WANDB_API_KEY" not in plan.nodes[0].env
    assert plan_json(plan)["nodes"][0]["env"]["WANDB_API_KEY"] == "****"


def test_ssh_plan_pins_and_probes():
    from launcher.plan.netenv import NodeNetwork

    cluster = cluster_spec(
        name="a800", backend="ssh", python="/opt/py/bin/python", workdir="/shared",
        nodes=[{"host": "gpu-01", "address": "10.0.0.11", "gpus": 8}, {"host": "gpu-02", "gpus": 8}],
        network={"interface": "auto", "ib_hca": "auto"},
    )
    job = JobSpec(name="j", entrypoint=["python", "train.py"], batch={"micro_batch": 4},
                  resources={"nodes": 2, "nproc_per_node": 8})
    unresolved = plan_job(job, cluster, "j-1", rdzv_port=29500)
    assert unresolved.dist_backend == "nccl"
    assert "node 1: NCCL_SOCKET_IFNAME" in unresolved.unresolved()
    probes = {0: NodeNetwork("ib0", "10.0.0.11", ("mlx5_0",)), 1: NodeNetwork("bond0", "10.0.0.12", ("mlx5_1", "mlx5_2"))}
    plan = plan_job(job, cluster, "j-1", rdzv_port=29500, probes=probes)
    assert plan.unresolved() == []
    assert plan.rendezvous.endpoint == "10.0.0.11:29500"
    assert plan.nodes[1].address == "10.0.0.12"
    assert plan.nodes[1].env["NCCL_SOCKET_IFNAME"] == "bond0"
    assert plan.nodes[1].env["NCCL_IB_HCA"] == "mlx5_1,mlx5_2"
    assert plan.nodes[0].env["NCCL_IB_HCA"] == "mlx5_0"
    assert "probed" in plan.nodes[1].env_sources["NCCL_IB_HCA"]
    pinned = cluster.model_copy(update={"network": cluster.network.model_copy(update={"interface": "eth9"})})
    assert plan_job(job, pinned, "j-1", rdzv_port=29500, probes=probes).nodes[1].env["GLOO_SOCKET_IFNAME"] == "eth9"


def test_too_many_nodes_for_the_cluster():
    from launcher.errors import PlanError

    cluster = cluster_spec(name="c", backend="ssh", nodes=[{"host": "a"}])
    job = JobSpec(name="j", entrypoint=["python", "t.py"], batch={"micro_batch": 4}, resources={"nodes": 3})
    with pytest.raises(PlanError, match="asks for 3 nodes; cluster 'c' lists 1"):
        plan_job(job, cluster, "j-1", rdzv_port=29500)


def test_rendezvous_is_static_for_a_fixed_node_count_and_c10d_stays_for_elastic_jobs():
    from launcher.plan import commands
    from launcher.plan.planner import Rendezvous, rendezvous_backend

    assert rendezvous_backend(_job(2, 2)) == "static"
    plan = plan_job(_job(2, 2), LOCAL, "golden-abc123", rdzv_port=29500)
    assert plan.rendezvous.backend == "static"
    c10d = Rendezvous(backend="c10d", id="golden-abc123", host="10.0.0.11", port=29500)
    argv = commands.torchrun_argv("/usr/bin/python3", 2, 2, 1, c10d, "10.0.0.12", (True, ["t.py"]))
    assert argv[argv.index("--rdzv-backend") + 1] == "c10d"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.11:29500"
    assert argv[argv.index("--local-addr") + 1] == "10.0.0.12"
    assert "--master-addr" not in argv
