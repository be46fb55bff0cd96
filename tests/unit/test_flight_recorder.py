"""NCCL's flight recorder in a hang's verdict (issue 23): which ranks did not join which collective.

The dumps are real: four gloo ranks on this machine's CPU write theirs with torch's own writer
(``_dump_fr_trace``, the recorder NCCL dumps on a collective timeout; tests/programs/flight_dump.py),
after rank 3 stayed away from the fourth all_reduce. The node side reads them as plain data, the
supervisor (on the scripted backend) hands them to PyTorch's analysis (fr_trace's builder), and
`launch status` shows its finding. Every expected value is written out by hand.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.node import stacks as node_stacks
from launcher.run import flightrecorder
from launcher.run import supervisor as supervisor_module
from launcher.run.orchestrate import stored_spec
from launcher.run.supervisor import Supervisor
from launcher.spec import JobSpec
from launcher.store.db import Store
from launcher.store.states import JobState
from tests.helpers import ROOT, run_cli
from tests.unit.fakes import FakeBackend, NodeScript, sample

PROGRAM = ROOT / "tests" / "programs" / "flight_dump.py"
CLUSTER = cluster_spec(
    name="two", backend="ssh", python="/usr/bin/python3", workdir="/work",
    nodes=[{"host": f"h{i}", "address": f"10.0.0.{i}", "gpus": 0, "slots": 2} for i in (1, 2)],
)
CALLED_AT = "train_step flight_dump.py:16"  # the line of the all_reduce rank 3 never joined


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four ranks' flight-recorder dumps, written by torch; rank 3 absent from the fourth collective."""
    folder = tmp_path_factory.mktemp("dumps")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = [subprocess.Popen(
        [sys.executable, str(PROGRAM), str(folder)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "4", "RANK": str(rank),
             "TORCH_FR_BUFFER_SIZE": "2000", "FLIGHT_ABSENT_RANK": "3"}) for rank in range(4)]
    for rank in ranks:
        said, _ = rank.communicate(timeout=300)
        assert rank.returncode == 0, said
    assert sorted(p.name for p in folder.iterdir()) == [f"nccl_trace_rank_{r}" for r in range(4)]
    return folder


def _read(folder: Path) -> dict[int, dict]:
    """As the nodes send them back: each dump read by the node side, through JSON."""
    read = {}
    for rank in range(4):
        dump, problem = node_stacks.read_trace(str(folder / f"nccl_trace_rank_{rank}"))
        assert problem is None
        read[rank] = json.loads(json.dumps(dump))
    return read


def test_pytorchs_analysis_names_the_rank_that_did_not_join_the_collective(dumps: Path) -> None:
    found = flightrecorder.analyse(_read(dumps), world_size=4)
    assert found["by"] == "torch.distributed.flight_recorder (fr_trace)" and found["problem"] is None
    assert found["collectives"] == [{"seq": 4, "name": "gloo:all_reduce", "group": "0:default_pg", "missing": [3],
                                     "joined": [0, 1, 2], "state": "scheduled", "where": CALLED_AT, "mismatch": None}]


def test_without_torch_the_last_collectives_are_compared(dumps: Path) -> None:
    [found] = flightrecorder._simple(_read(dumps))
    assert (found["seq"], found["name"], found["missing"], found["joined"], found["where"]) == \
        (4, "gloo:all_reduce", [3], [0, 1, 2], CALLED_AT)


def test_a_dump_that_names_a_class_is_refused_not_run(tmp_path: Path) -> None:
    hostile = tmp_path / "nccl_trace_rank_0"
    hostile.write_bytes(pickle.dumps({"entries": [], "version": "2.10", "run": os.system}))
    dump, problem = node_stacks.read_trace(str(hostile))
    assert dump is None and "refused: the dump names posix.system" in problem


def _hung_job(dumps: Path, home: Path) -> str:
    """A 4-rank job (2 nodes) the supervisor calls hung, whose nodes send the dumps back; its id."""
    read = _read(dumps)
    spec = JobSpec(name="fr", entrypoint=["python", "train.py"], resources={"nodes": 2, "nproc_per_node": 2},
                   max_steps=4, watch={"stall_timeout": 0.5})
    plan = plan_job(spec, CLUSTER, "fr-00000001", rdzv_port=29500)
    store = Store(home)
    store.create_job(plan, stored_spec(spec, CLUSTER, run_check=True))
    stack = 'Thread 9 (idle): "MainThread"\n    all_reduce (torch/distributed/distributed_c10d.py:2050)\n' \
            "    train_step (train.py:17)\n    <module> (train.py:30)\n"
    answers = {node: {"ranks": [{"rank": r, "local_rank": r % 2, "pid": 100 + r, "stack": stack} for r in (2 * node, 2 * node + 1)],
                      "nccl_traces": [f"/run/fr/nccl_trace_rank_{r}" for r in (2 * node, 2 * node + 1)],
                      "flight": {str(r): read[r] for r in (2 * node, 2 * node + 1)}, "kernel": []} for node in (0, 1)}
    scripts = [NodeScript([sample(time.time(), *({"rank": r, "pid": 100 + r, "pids": [100 + r], "cpu_s": 1.0, "rss_bytes": 1,
                                                  "rss_peak_bytes": 1} for r in (2 * node, 2 * node + 1)))], code=None)
               for node in (0, 1)]
    state = Supervisor(store, plan, FakeBackend(CLUSTER, [scripts], stacks=answers), grace=0.1,
                       stall_timeout=0.5).run()
    assert state == JobState.FAILED
    store.close()
    return plan.job_id


def test_a_hung_jobs_verdict_folds_in_the_flight_recorder(dumps: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor_module, "POLL_S", 0.01)
    job_id = _hung_job(dumps, tmp_path)
    screen = run_cli(tmp_path, "status", job_id).stdout.splitlines()
    assert "flight recorder: torch.distributed.flight_recorder (fr_trace), dumps of 4 rank(s):" in screen
    assert f"  gloo:all_reduce #4 in group 0:default_pg: rank 3 did not join (3 of 4 did), called at {CALLED_AT}" \
        in screen
    verdict = json.loads(run_cli(tmp_path, "status", job_id, "--json").stdout)["verdict"]
    assert verdict["flight_recorder"]["collectives"][0]["missing"] == [3]


CHECK = """
import sys
from launcher.cli.main import main
try:
    main({argv!r})
except SystemExit:
    pass
print("HEAVY:" + ",".join(sorted(m for m in ("torch", "deepspeed", "ray") if m in sys.modules)))
"""


def test_status_of_a_job_with_a_flight_recorder_verdict_does_not_import_torch(dumps: Path, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The analysis ran in the supervisor; `launch status` only reads its result."""
    monkeypatch.setattr(supervisor_module, "POLL_S", 0.01)
    _hung_job(dumps, tmp_path)
    for argv in (["status", "fr-00000001"], ["status", "fr-00000001", "--json"]):
        result = subprocess.run([sys.executable, "-c", CHECK.format(argv=argv)], capture_output=True, text=True,
                                env={"LAUNCH_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, check=True, cwd=ROOT)
        assert "fr-00000001" in result.stdout and result.stdout.strip().endswith("HEAVY:"), result.stdout


def test_the_node_side_sends_a_ranks_stack_with_its_nodes_dumps(dumps: Path, tmp_path: Path) -> None:
    """`stacks` on a node: a live tagged rank's stack (py-spy, beside this interpreter) and the dumps in the run
    directory, read back as plain data."""
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)  # the ranks' LAUNCH_RUN_DIR, where the plan points NCCL's dumps
    (run_dir / "ranks" / "nccl_trace_rank_3").write_bytes((dumps / "nccl_trace_rank_3").read_bytes())
    (run_dir / "ranks" / "nccl_trace_rank_9").write_bytes(b"not a pickle")
    job_id = f"unit-stacks-{os.getpid()}"
    rank = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE,
                            env={**os.environ, "LAUNCH_JOB_ID": job_id, "LAUNCH_NODE": "0", "RANK": "5",
                                 "LOCAL_RANK": "1"})
    try:
        answer = node_stacks.collect(job_id, str(run_dir), node=0)
    finally:
        rank.communicate(b"")
    [entry] = answer["ranks"]
    assert (entry["rank"], entry["local_rank"], entry["pid"]) == (5, 1, rank.pid)
    assert entry["stack"] is not None or entry["error"], "a stack, or why there is none"
    assert sorted(answer["flight"]) == ["3"] and answer["flight"]["3"]["entries"][-1]["collective_seq_id"] == 3
    assert answer["flight_problems"] == ["nccl_trace_rank_9: not readable as a flight-recorder dump: "
                                         "invalid load key, 'n'."]
    assert isinstance(answer["kernel"], list)
