"""The local backend's shortcuts on the way from `launch submit` to the job's start (issue 20's first step):
the facts probe answered in process under the CLI's own interpreter, and agents started while preflight runs."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from launcher.backends import get_backend
from launcher.backends.nodechecks import facts_request
from launcher.errors import NodeStartError
from launcher.node import proctree
from launcher.run.orchestrate import load_cluster_spec, prepare_job
from launcher.spec.job import JobSpec

VARYING = ("time", "mem_available_bytes", "disk_free_gb")  # what moves between two probes a moment apart


def _prepared(tmp_path: Path):
    job = JobSpec.model_validate({"name": "ahead", "entrypoint": [sys.executable, "-c", "pass"],
                                  "resources": {"nodes": 2, "nproc_per_node": 1}})
    cluster = load_cluster_spec(None).model_copy(update={"workdir": str(tmp_path)})
    return prepare_job(job, cluster, check_fit=False)


def test_the_facts_answered_in_process_are_those_a_probe_process_gives(tmp_path: Path) -> None:
    prepared = _prepared(tmp_path)
    backend = get_backend(prepared.cluster)
    request = dataclasses.replace(facts_request(prepared.plan, 0), modules=("torch", "no_such_module_here"))
    here, error = backend._facts_answer(prepared.plan, request)
    probed, probe_error = backend.node_command(prepared.plan, 0, "facts", request)
    assert error is None and probe_error is None, probe_error
    assert here is not None and probed is not None
    assert here["missing"] == ["no_such_module_here"]
    assert {k: v for k, v in here.items() if k not in VARYING} == {k: v for k, v in probed.items() if k not in VARYING}


def test_an_agent_started_ahead_and_never_asked_exits_having_started_nothing(tmp_path: Path) -> None:
    prepared = _prepared(tmp_path)
    backend = get_backend(prepared.cluster)
    backend.warm(prepared.plan)
    agents = [proc for _, proc in backend._warm.values()]
    assert len(agents) == 2 and all(agent.poll() is None for agent in agents)
    assert sorted(proctree.job_pids(prepared.plan.job_id)) == sorted(agent.pid for agent in agents)  # tagged as the job's
    backend.close()
    assert [agent.returncode for agent in agents] == [0, 0]  # read the end of stdin and left, no TERM needed
    assert proctree.job_pids(prepared.plan.job_id) == []


def test_an_agent_started_ahead_serves_only_the_node_it_was_started_for(tmp_path: Path) -> None:
    prepared = _prepared(tmp_path)
    plan = prepared.plan
    backend = get_backend(prepared.cluster)
    backend.warm(plan)
    ahead = {index: proc for index, (_, proc) in backend._warm.items()}
    (tmp_path / "elsewhere").mkdir()
    fresh = None
    try:
        assert backend._agent_process(plan, plan.nodes[0]) is ahead[0]
        moved = plan.nodes[1].model_copy(update={"cwd": str(tmp_path / "elsewhere")})
        fresh = backend._agent_process(plan, moved)  # started in another directory: the one ahead is let go
        assert fresh is not ahead[1] and ahead[1].wait(5) == 0
    finally:
        for proc in (ahead[0], fresh):
            if proc is not None:
                proc.stdin.close()
                proc.wait(10)
        backend.close()


def test_an_agent_in_a_workdir_that_is_gone_names_the_workdir_not_the_interpreter(tmp_path: Path) -> None:
    prepared = _prepared(tmp_path)
    gone = prepared.plan.nodes[0].model_copy(update={"cwd": str(tmp_path / "removed")})
    with pytest.raises(NodeStartError, match=r"workdir .*removed is not a directory"):
        get_backend(prepared.cluster)._spawn_agent(prepared.plan, gone)


STAND_IN = """\
import sys, time
from launcher.node.protocol import FrameKind, encode_frame
sys.stdin.readline()  # the request
sys.stdin.readline()  # the secrets
if sys.argv[1] == "leases":
    print(encode_frame(FrameKind.LEASED, {"kind": "slot", "devices": [0], "host": "here"}).decode(), flush=True)
    sys.stdin.readline()  # go
print("|hanging here", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("hangs", ["leases", "start"])
def test_a_hung_agent_fails_the_start_with_a_clear_message_and_is_ended(tmp_path: Path, monkeypatch, hangs: str) -> None:
    """A stand-in agent that never takes its leases, or takes them and never starts its command: the start fails
    within the bound, naming what the agent did not do, and leaves no agent running."""
    import subprocess

    from launcher.backends.base import StartContext
    from launcher.backends.local import backend as local

    prepared = _prepared(tmp_path)
    backend = get_backend(prepared.cluster)
    started: list[subprocess.Popen] = []

    def stand_in(plan, node):
        proc = subprocess.Popen([sys.executable, "-c", STAND_IN, "leases" if hangs == "start" else "none"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        started.append(proc)
        return proc

    monkeypatch.setattr(local, "START_TIMEOUT_S", 2.0)
    monkeypatch.setattr(local.LocalNode.wait_leased, "__defaults__", (2.0,))
    monkeypatch.setattr(local.LocalNode.wait_started, "__defaults__", (2.0,))
    monkeypatch.setattr(backend, "_agent_process", stand_in)
    context = StartContext(run_dir=tmp_path, secrets={}, grace=0.5)
    with pytest.raises(NodeStartError) as caught:
        backend._start_agents(prepared.plan, context)
    said = str(caught.value)
    what = "start its command" if hangs == "start" else "take its leases"
    assert f"localhost: the node agent did not {what} within 2 s" in said and "hanging here" in said
    assert started and all(proc.wait(10) is not None for proc in started), "every stand-in agent was ended"
