"""What a node's facts say is wrong with it for a plan (the rules every backend's preflight applies)."""

from __future__ import annotations

from pathlib import Path

from launcher.backends import load_cluster, plan_job
from launcher.backends.facts import NodeFacts
from launcher.backends.nodechecks import node_problems
from launcher.node.protocol import FactsRequest
from launcher.spec.load import load_job

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30


def _offload_plan():
    job = load_job(ROOT / "jobs" / "bert_large_zero3.yaml", ["strategy=zero3_offload"])
    cluster = load_cluster(ROOT / "examples" / "clusters" / "a800.yaml")
    return plan_job(job, cluster, "offload-1", rdzv_port=29500)


def test_zero3_offload_is_refused_on_a_node_whose_memory_cannot_hold_the_offloaded_states() -> None:
    plan = _offload_plan()
    need = plan.memory.cpu_gib_per_node
    assert need > 1
    small = node_problems("gpu-01", plan, NodeFacts.parse({"mem_total_bytes": int(need * GIB)}))
    assert len(small) == 1 and "zero3_offload keeps about" in small[0] and small[0].startswith("gpu-01: ")
    assert node_problems("gpu-01", plan, NodeFacts.parse({"mem_total_bytes": int(4 * need * GIB)})) == []


def test_every_problem_of_a_node_is_listed_with_its_host() -> None:
    plan = _offload_plan()
    facts = {"missing": ["deepspeed"], "workdir_ok": False, "missing_ifaces": ["ib9"], "port_free": False,
             "gpus": [{"name": "A800"}] * 4, "route_error": "no route", "hostname_resolves": "Name or service not known"}
    problems = node_problems("gpu-02", plan, NodeFacts.parse(facts), plan.nodes[1], gpus=8)
    assert len(problems) == 7 and all(p.startswith("gpu-02: ") for p in problems)
    assert any("cannot import deepspeed" in p for p in problems) and any("nvidia-smi lists 4" in p for p in problems)


def test_a_torch_build_lock_left_by_a_killed_build_stops_a_deepspeed_job_and_a_fresh_one_does_not(tmp_path: Path) -> None:
    import os
    import time

    from launcher.backends.nodechecks import facts_request
    from launcher.node import facts as node_facts

    plan = _offload_plan()
    assert facts_request(plan, 1).build_locks  # a DeepSpeed job asks every node for them
    left = tmp_path / "cpu_adam" / "lock"  # TORCH_EXTENSIONS_DIR/<op>/lock
    building = tmp_path / "py311_cu121" / "fused_adam" / "lock"  # torch's default layout: <root>/py<ver>_<cuda>/<op>/lock
    for lock in (left, building):
        lock.parent.mkdir(parents=True)
        lock.touch()
    two_hours_ago = time.time() - 2 * 3600
    os.utime(left, (two_hours_ago, two_hours_ago))
    answer = node_facts.collect(FactsRequest(build_locks=True, extensions_dir=str(tmp_path)))
    assert [lock["path"] for lock in answer["build_locks"]] == [str(left), str(building)]
    assert answer["build_locks"][0]["age_s"] >= 2 * 3600 and answer["build_locks"][1]["age_s"] < 60
    problems = node_problems("gpu-03", plan, NodeFacts.parse(answer))
    assert problems == [f"gpu-03: torch's build lock {left} is 2.0 h old: a build of that op was killed there, and "
                        "every DeepSpeed rank loading it would wait on the file for ever (pytorch/pytorch#189245); "
                        "remove it if no build is running on the node"]


def test_a_job_without_deepspeed_does_not_ask_for_build_locks() -> None:
    from launcher.backends.nodechecks import facts_request

    job = load_job(ROOT / "jobs" / "cifar10_convnet.yaml")
    plan = plan_job(job, load_cluster(ROOT / "examples" / "clusters" / "a800.yaml"), "convnet-1", rdzv_port=29500)
    assert not facts_request(plan, 0).build_locks
