"""Elastic jobs, planned: the node counts with a whole grad_accum, refused specs, what the plan shows.

Expected numbers are worked out by hand in the comments (global = micro x GA x world).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.cli.main import main
from launcher.errors import PlanError, SpecError
from launcher.spec.load import load_job
from launcher.views.render import plan_json, plan_text

SSH4 = cluster_spec(name="four", backend="ssh", python="/usr/bin/python3", workdir="/work",
                   nodes=[{"host": f"a800-0{i}", "address": f"10.0.0.{i}", "gpus": 0, "slots": 2} for i in range(1, 5)])


def _job_file(tmp_path: Path, body: str, restarts: int = 3) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"name: el\nrecipe: convnet\nrestarts: {restarts}\n" + body)
    return path


def test_counts_without_a_whole_grad_accum_are_left_out(tmp_path: Path) -> None:
    # global 16, micro 2, 1 process a node: 4 nodes -> 16/8 = GA 2; 3 -> 16/6 not whole; 2 -> 16/4 = GA 4
    job = load_job(_job_file(tmp_path, "batch: {global_batch: 16, micro_batch: 2}\nresources: {nodes: 4}\n"
                                       "elastic: {min_nodes: 2}\n"))
    plan = plan_job(job, SSH4, "el-00000001", rdzv_port=29500)
    assert plan.elastic is not None
    assert [(c.nodes, c.world_size, c.grad_accum) for c in plan.elastic.counts] == [(4, 4, 2), (2, 2, 4)]
    assert "elastic     min_nodes 2: 4 nodes: GA 2, 2 nodes: GA 4" in plan_text(plan)
    assert plan_json(plan)["elastic"]["counts"][1] == {"nodes": 2, "world_size": 2, "grad_accum": 4}


def test_the_issue_example_keeps_global_1024() -> None:
    # 4 nodes x 8 GPUs, micro 16, GA 2: global 16 x 2 x 32 = 1024; 3 nodes: 1024 / (16 x 24) not whole;
    # 2 nodes: 1024 / (16 x 16) = GA 4
    cluster = SSH4.model_copy(update={"nodes": [n.model_copy(update={"gpus": 8}) for n in SSH4.nodes]})
    from launcher.spec import JobSpec

    job = JobSpec(name="big", entrypoint=["python", "t.py"], batch={"micro_batch": 16, "grad_accum": 2},
                  resources={"nodes": 4, "nproc_per_node": 8}, restarts=2, elastic={"min_nodes": 2})
    plan = plan_job(job, cluster, "big-00000001", rdzv_port=29500)
    assert plan.batch is not None and plan.batch.global_batch == 1024
    assert plan.elastic is not None and plan.elastic.describe() == "4 nodes: GA 2, 2 nodes: GA 4"
    env = plan.nodes[0].env
    assert (env["LAUNCH_GRAD_ACCUM"], env["LAUNCH_ELASTIC_MIN_NODES"], env["LAUNCH_ATTEMPT"]) == ("2", "2", "0")
    assert "LAUNCH_PREVIOUS_WORLD_SIZE" not in env


def test_a_min_nodes_that_admits_no_smaller_count_is_refused_with_the_legal_ones(tmp_path: Path) -> None:
    # global 16, micro 2: 3 nodes gives 16/6; legal are 4 (GA 2), 2 (GA 4), 1 (GA 8)
    path = _job_file(tmp_path, "batch: {global_batch: 16, micro_batch: 2}\nresources: {nodes: 4}\n"
                               "elastic: {min_nodes: 3}\n")
    with pytest.raises(SpecError) as info:
        load_job(path)
    message = str(info.value)
    assert f"{path}:6: elastic: min_nodes 3 admits no node count below 4" in message
    assert "legal counts: 4 nodes: GA 2, 2 nodes: GA 4, 1 node: GA 8; set min_nodes to 2 or lower" in message


@pytest.mark.parametrize("nodes, restarts, says", [
    (2, 3, "min_nodes 2 leaves no node to lose"),
    (3, 0, "set restarts: 1 or more"),
])
def test_other_elastic_mistakes_are_one_line_each(tmp_path: Path, nodes: int, restarts: int, says: str) -> None:
    path = _job_file(tmp_path, f"batch: {{global_batch: 12, micro_batch: 2}}\nresources: {{nodes: {nodes}}}\n"
                               "elastic: {min_nodes: 2}\n", restarts)
    with pytest.raises(SpecError, match=says):
        load_job(path)


def test_ray_refuses_an_elastic_job_saying_why(tmp_path: Path) -> None:
    job = load_job(_job_file(tmp_path, "batch: {global_batch: 12, micro_batch: 2}\nresources: {nodes: 3}\n"
                                       "elastic: {min_nodes: 2}\n"))
    with pytest.raises(PlanError, match="elastic: not on Ray: the Ray backend places a job's nodes once"):
        plan_job(job, cluster_spec(name="r", backend="ray"), "el-00000001", rdzv_port=29500)


def test_launch_plan_lists_the_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # global 12, micro 2, 3 nodes: GA 2; 2 nodes: GA 3 (the done-when job)
    path = _job_file(tmp_path, "batch: {global_batch: 12, micro_batch: 2}\nresources: {nodes: 3}\n"
                               "elastic: {min_nodes: 2}\n")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("name: l\nbackend: local\nlocal: {slots: 4}\n")
    main(["plan", str(path), "--cluster", str(cluster)])
    assert "elastic: min_nodes 2: 3 nodes: GA 2, 2 nodes: GA 3" in capsys.readouterr().out


def test_elastic_and_leave_out_failed_nodes_are_one_or_the_other(tmp_path: Path) -> None:
    path = _job_file(tmp_path, "batch: {global_batch: 12, micro_batch: 2}\nresources: {nodes: 3}\n"
                               "leave_out_failed_nodes: true\nelastic: {min_nodes: 2}\n")
    with pytest.raises(SpecError, match="give elastic or leave_out_failed_nodes, not both"):
        load_job(path)
