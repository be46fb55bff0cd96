"""nproc_per_node: auto on nodes with different GPU counts: per-node launchers, rank ranges, the batch, warnings.

Expected numbers by hand: nodes of 8 and 4 GPUs give 12 ranks, node 1's first rank is 8.
"""

from __future__ import annotations

import base64
import json

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.errors import PlanError
from launcher.run.orchestrate import deepspeed_config, planned_world
from launcher.spec import JobSpec
from launcher.views.render import plan_text

MIXED = cluster_spec(name="mixed", backend="ssh", python="/usr/bin/python3", workdir="/work",
                    nodes=[{"host": "big", "address": "10.0.0.1", "gpus": 8},
                           {"host": "small", "address": "10.0.0.2", "gpus": 4}])


def _job(**update) -> JobSpec:
    spec = {"name": "mixed", "recipe": "convnet", "batch": {"global_batch": 96, "micro_batch": 4},
            "resources": {"nodes": 2, "nproc_per_node": "auto"}, **update}
    return JobSpec.model_validate(spec)


def _flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_each_node_runs_one_process_a_gpu_and_ranks_follow_on() -> None:
    plan = plan_job(_job(), MIXED, "mixed-00000001", rdzv_port=29500)
    assert [(n.nproc, n.first_rank) for n in plan.nodes] == [(8, 0), (4, 8)]
    assert [_flag(n.argv, "--nproc-per-node") for n in plan.nodes] == ["8", "4"]
    # global 96 = micro 4 x GA 2 x 12 ranks
    assert plan.batch is not None and (plan.world_size, plan.batch.grad_accum) == (12, 2)
    text = plan_text(plan)
    assert "2 node(s) x 8+4 process(es) = 12 ranks" in text
    assert "node 0  big (10.0.0.1)  8 proc  ranks 0-7" in text and "node 1  small (10.0.0.2)  4 proc  ranks 8-11" in text


def test_deepspeed_gets_each_nodes_slots_and_the_whole_world_in_its_config() -> None:
    job = _job(strategy="zero2", launcher="deepspeed")
    plan = plan_job(job, MIXED, "mixed-00000001", rdzv_port=29500, ds_config=deepspeed_config(job, planned_world(job, MIXED)))
    info = next(a for a in plan.nodes[1].argv if a.startswith("--world_info="))
    world = json.loads(base64.urlsafe_b64decode(info.split("=", 1)[1]))
    assert world == {"node0": list(range(8)), "node1": list(range(4))}
    assert plan.ds_config is not None and plan.ds_config["train_batch_size"] == 96
    assert plan.ds_config["gradient_accumulation_steps"] == 2


def test_a_number_keeps_its_uniform_meaning() -> None:
    plan = plan_job(_job(resources={"nodes": 2, "nproc_per_node": 4}), MIXED, "mixed-00000001", rdzv_port=29500)
    assert [(n.nproc, n.first_rank) for n in plan.nodes] == [(4, 0), (4, 4)] and plan.warnings == ()


@pytest.mark.parametrize("setting, named", [
    ({"env": {"TP_SIZE": "8"}}, "env TP_SIZE = 8"),
    ({"recipe": None, "entrypoint": ["python", "t.py", "--tensor-parallel-size", "8"]}, "argument --tensor-parallel-size = 8"),
    ({"recipe": None, "entrypoint": ["python", "t.py", "--mesh-shape=2,8"]}, "argument --mesh-shape = 2,8"),
])
def test_a_tensor_parallel_size_beyond_the_smallest_node_is_warned_in_the_plan(setting: dict, named: str) -> None:
    plan = plan_job(_job(**setting), MIXED, "mixed-00000001", rdzv_port=29500)
    assert len(plan.warnings) == 1 and plan.warnings[0].startswith(named)
    assert "does not fit the smallest node (4 process(es); nodes have 8+4)" in plan_text(plan)


def test_a_size_that_fits_the_smallest_node_is_not_warned() -> None:
    plan = plan_job(_job(env={"TP_SIZE": "4"}), MIXED, "mixed-00000001", rdzv_port=29500)
    assert plan.warnings == ()


def test_elastic_on_unlike_nodes_is_checked_when_planned() -> None:
    # 8 + 4 ranks, micro 4: at 2 nodes GA 96 / 48 = 2; at 1 node (the first, 8 ranks) 96 / 32 = 3
    plan = plan_job(_job(restarts=1, elastic={"min_nodes": 1}), MIXED, "mixed-00000001", rdzv_port=29500)
    assert plan.elastic is not None and plan.elastic.describe() == "2 nodes: GA 2, 1 node: GA 3"
    # global 48 at 12 ranks: GA 1; on the first node alone 48 / 32 is not whole
    with pytest.raises(PlanError, match="min_nodes 1 admits no node count below 2"):
        plan_job(_job(batch={"global_batch": 48, "micro_batch": 4}, restarts=1, elastic={"min_nodes": 1}),
                 MIXED, "mixed-00000001", rdzv_port=29500)


@pytest.mark.parametrize("backend", ["slurm", "ray"])
def test_backends_that_place_alike_nodes_refuse_auto(backend: str) -> None:
    cluster = {"slurm": cluster_spec(name="s", backend="slurm", workdir="/shared", slurm={"partition": "p"}),
               "ray": cluster_spec(name="r", backend="ray")}[backend]
    with pytest.raises(PlanError, match="'auto' needs nodes whose GPUs or slots the cluster spec lists"):
        plan_job(_job(), cluster, "mixed-00000001", rdzv_port=29500)


def test_min_nodes_not_below_the_node_count_is_refused_with_auto_too() -> None:
    with pytest.raises(ValueError, match="min_nodes 2 leaves no node to lose"):
        _job(restarts=1, elastic={"min_nodes": 2})


def test_status_shows_each_nodes_count(tmp_path, monkeypatch, capsys) -> None:
    from launcher.cli.main import main
    from launcher.run.recorded import stored_spec
    from launcher.store.db import Store

    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "home"))
    job = _job()
    plan = plan_job(job, MIXED, "mixed-00000001", rdzv_port=29500)
    Store(tmp_path / "home").create_job(plan, stored_spec(job, MIXED, run_check=True))
    main(["status", "mixed-00000001"])
    assert "2 node(s) x 8+4 = 12 ranks" in capsys.readouterr().out
