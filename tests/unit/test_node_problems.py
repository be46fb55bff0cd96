"""What a node's facts say is wrong with it for a plan (the rules every backend's preflight applies)."""

from __future__ import annotations

from pathlib import Path

from launcher.backends import plan_job
from launcher.backends.facts import NodeFacts
from launcher.backends.nodechecks import node_problems
from launcher.spec.load import load_cluster, load_job

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
