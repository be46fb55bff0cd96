"""1,000 ranks, one screen (issue 23): a hung job of 125 nodes x 8 ranks, simulated.

The real supervisor runs on the scripted in-memory backend (tests/unit/fakes.py): every node's agent
reports its 8 ranks alive and then goes silent, so the supervisor calls the job hung, takes every
rank's stack (answers in py-spy's own `dump` format, as `launch.node.stacks` sends them back, with a
kernel-log Xid line on one node) and tears it down. Then the real `launch status` renders the verdict.
No process of the job exists: 1,000 ranks' events and stacks, not 1,000 processes. Every expected
value below is written out by hand.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.run import supervisor as supervisor_module
from launcher.run.orchestrate import stored_spec
from launcher.run.supervisor import Supervisor
from launcher.spec import JobSpec
from launcher.store.db import Store
from launcher.store.rows import JobRow
from launcher.store.states import JobState
from launcher.views.stackclasses import classify, main_path
from launcher.views.stacks import RankStack, StackReport
from launcher.views.verdict import verdict_lines
from tests.helpers import run_cli
from tests.unit.fakes import FakeBackend, NodeScript, output, sample

NODES, PER_NODE = 125, 8
HOSTS = [f"gpu{i:03d}" for i in range(1, NODES + 1)]
CLUSTER = cluster_spec(
    name="big", backend="ssh", python="/usr/bin/python3", workdir="/work",
    nodes=[{"host": host, "address": f"10.1.{i // 200}.{i % 200 + 1}", "gpus": PER_NODE, "slots": PER_NODE}
           for i, host in enumerate(HOSTS)],
)

# py-spy 0.4 `dump` text, as taken from a real gloo rank waiting in all_reduce (frames innermost first)
WAITING = """Process {pid}: /usr/bin/python3 -u train.py --config big.yaml
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} (idle): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2050)
    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)
    train_step (train.py:212)
    main (train.py:300)
    <module> (train.py:320)
Thread {thread} (idle): "Thread-2 (_pin_memory_loop)"
    {where}
    _pin_memory_loop (torch/utils/data/_utils/pin_memory.py:59)
    run (threading.py:982)
    _bootstrap_inner (threading.py:1045)
    _bootstrap (threading.py:1002)
"""
# the rank that never reached the collective: still in its backward pass
ELSEWHERE = """Process {pid}: /usr/bin/python3 -u train.py --config big.yaml
Python v3.11.7 (/usr/bin/python3.11)

Thread {pid} (active+gil): "MainThread"
    backward (torch/autograd/__init__.py:266)
    backward (torch/_tensor.py:581)
    train_step (train.py:208)
    main (train.py:300)
    <module> (train.py:320)
"""
ODD_RANK, ODD_NODE = 512, 64


def _stack(rank: int) -> str:
    pid = 40000 + rank
    # the pin-memory threads differ from rank to rank: classes are by the main thread only
    where = "get (queue.py:180)" if rank % 3 else "wait (threading.py:331)"
    text = ELSEWHERE if rank == ODD_RANK else WAITING
    return text.format(pid=pid, thread=pid + 7, where=where)


def _kernel_time(moment: datetime) -> str:
    """A time as `dmesg --time-format iso` writes it."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + ",104538+00:00"


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor_module, "SETTLE_S", 0.2)
    monkeypatch.setattr(supervisor_module, "REPORT_WAIT_S", 0.5)
    monkeypatch.setattr(supervisor_module, "POLL_S", 0.01)


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The store (LAUNCH_HOME) and id of the 1,000-rank job the supervisor called hung."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(supervisor_module, "SETTLE_S", 0.2)
        patch.setattr(supervisor_module, "REPORT_WAIT_S", 0.5)
        patch.setattr(supervisor_module, "POLL_S", 0.01)
        spec = JobSpec(name="big", entrypoint=["python", "train.py"], resources={"nodes": NODES, "nproc_per_node": PER_NODE},
                       max_steps=100, watch={"stall_timeout": 0.5})
        plan = plan_job(spec, CLUSTER, "big-00000001", rdzv_port=29500)
        store = Store(home)
        store.create_job(plan, stored_spec(spec, CLUSTER, run_check=True))
        now = datetime.now(UTC)
        answers = {}
        for node in range(NODES):
            ranks = range(node * PER_NODE, (node + 1) * PER_NODE)
            answer: dict = {"ranks": [{"rank": r, "local_rank": r - node * PER_NODE, "pid": 40000 + r, "stack": _stack(r),
                                       "error": None} for r in ranks], "nccl_traces": [], "kernel": []}
            if node == ODD_NODE:
                answer["kernel"] = [f"{_kernel_time(now)} NVRM: Xid (PCI:0000:3b:00): 79, pid=40512, name=python, "
                                    "GPU has fallen off the bus."]
            if node == 3:  # a line from long before the job: not its evidence
                answer["kernel"] = ["2024-01-05T10:00:00,000000+00:00 NVRM: Xid (PCI:0000:1a:00): 13, Graphics Exception"]
            answers[node] = answer
        scripts = []
        for node in range(NODES):
            ranks = range(node * PER_NODE, (node + 1) * PER_NODE)
            alive = sample(time.time(), *({"rank": r, "pid": 40000 + r, "pids": [40000 + r], "cpu_s": 12.5,
                                          "rss_bytes": 1, "rss_peak_bytes": 1, "gpu_util": 0.0} for r in ranks))
            said = output(f"[{ranks[0]}]: epoch 3 iteration 41 loss 2.3170" if node != ODD_NODE
                          else f"[{ODD_RANK}]: warning: loss scale reduced to 1024")
            scripts.append(NodeScript([alive, said], code=None))
        backend = FakeBackend(CLUSTER, [scripts], stacks=answers)
        state = Supervisor(store, plan, backend, grace=0.1, stall_timeout=spec.watch.stall_timeout).run()
        assert state == JobState.FAILED
        assert all(node.terminated for node in backend.started[0])
        store.close()
    return home, plan.job_id


def _verdict(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("verdict:"))
    return lines[start:]


def test_a_thousand_ranks_verdict_fits_one_screen_and_names_the_odd_rank_and_its_node(hung) -> None:
    home, job_id = hung
    shown = run_cli(home, "status", job_id)
    assert shown.returncode == 0, shown.stderr
    screen = _verdict(shown.stdout)
    print("\n".join(screen))  # the screen shown in docs/RELIABILITY.md
    assert len(screen) <= 40
    assert screen[0].startswith("verdict: hung before the first step (attempt 0; stacks of 1000 rank(s) taken")
    assert "  ranks 0-511,513-999: all_reduce <- train_step train.py:212" in screen
    assert "  rank 512 (node 64 gpu065, gpu0): backward <- train_step train.py:208" in screen
    assert "stand apart: rank 512 of 1000, on node 64 (gpu065)" in screen
    [row] = [line for line in screen if line.startswith("  64 gpu065")]
    assert "512-519" in row and "idle" in row and "Xid (PCI:0000:3b:00): 79" in row
    [others] = [line for line in screen if line.startswith("  others (124)")]
    assert "idle" in others and others.endswith("nothing"), "the old Xid on node 3 predates the job"
    assert "    node 64 last output: [64/512] warning: loss scale reduced to 1024" in screen
    assert any(line.startswith("action: stacks taken, then every process of attempt 0 ended on its 125 node(s)")
               and "job FAILED, not restarted" in line for line in screen)


def test_status_json_has_every_class_and_keeps_its_fields(hung) -> None:
    home, job_id = hung
    obj = json.loads(run_cli(home, "status", job_id, "--json").stdout)
    assert obj["state"] == "FAILED"
    assert "rank 512 on node 64 (gpu065) stands apart: its stack differs from the other 999" in obj["reason"]
    assert len(obj["stacks"]) == 1000 and obj["stacks"][512]["rank"] == 512, "the existing field, as it was"
    verdict = obj["verdict"]
    assert [(c["ranks"], c["count"], c["label"]) for c in verdict["classes"]] == [
        ("0-511,513-999", 999, "all_reduce <- train_step train.py:212"),
        ("512", 1, "backward <- train_step train.py:208"),
    ]
    assert verdict["classes"][1]["frames"][0] == ["<module>", "train.py", 320], "outermost first"
    assert verdict["apart"] == [512]
    [suspect] = verdict["suspects"]
    assert (suspect["node"], suspect["host"], suspect["apart"]) == (64, "gpu065", [512])
    assert suspect["ranks"] == [512, 513, 514, 515, 516, 517, 518, 519]
    assert "GPU has fallen off the bus" in suspect["kernel"][0]


def test_a_job_without_stacks_has_no_verdict_in_json(tmp_path: Path) -> None:
    spec = JobSpec(name="small", entrypoint=["python", "t.py"], resources={"nodes": 1, "nproc_per_node": 1})
    plan = plan_job(spec, CLUSTER, "small-00000001", rdzv_port=29500)
    store = Store(tmp_path)
    store.create_job(plan, stored_spec(spec, CLUSTER, run_check=True))
    store.close()
    assert json.loads(run_cli(tmp_path, "status", plan.job_id, "--json").stdout)["verdict"] is None


def _path(*frames: str):
    """A main thread, given outermost first as ``function file:line``."""
    lines = [f"    {f.split(' ')[0]} ({f.split(' ')[1]})" for f in reversed(frames)]
    return main_path('Thread 1 (idle): "MainThread"\n' + "\n".join(lines))


def test_classes_are_a_prefix_tree_named_where_they_branch() -> None:
    common = ("<module> run.py:9", "main run.py:5")
    paths = {r: _path(*common, "step run.py:30", "all_gather torch/distributed/distributed_c10d.py:3000")
             for r in (0, 1, 2, 3, 6, 7)}
    paths[4] = _path(*common, "step run.py:31", "barrier torch/distributed/distributed_c10d.py:4000")
    paths[5] = _path(*common, "save run.py:44", "write torch/serialization.py:600")
    classes = classify(paths, {8: "py-spy is not installed on this node", 9: "py-spy is not installed on this node"})
    assert [(c.spans, c.label) for c in classes] == [
        ("0-3,6-7", "all_gather <- step run.py:30"),
        ("8-9", "(no stack: py-spy is not installed on this node)"),
        ("4", "barrier <- step run.py:31"),
        ("5", "write <- save run.py:44"),
    ]


def test_one_class_is_named_by_the_programs_own_frame_not_the_libraries() -> None:
    paths = {r: _path("<module> train.py:320", "train_step train.py:212", "wrapper torch/distributed/c10d_logger.py:83",
                      "all_reduce torch/distributed/distributed_c10d.py:2050") for r in range(16)}
    [only] = classify(paths)
    assert (only.spans, only.label) == ("0-15", "all_reduce <- train_step train.py:212")


def test_classes_that_would_read_alike_show_more_of_their_path() -> None:
    paths = {0: _path("<module> a.py:1", "f a.py:2", "g one/x.py:3", "wait threading.py:320"),
             1: _path("<module> a.py:1", "f a.py:2", "g two/x.py:3", "wait threading.py:320"),
             2: _path("<module> a.py:1", "f a.py:2", "g two/x.py:3", "wait threading.py:320")}
    assert [(c.spans, c.label) for c in classify(paths)] == [
        ("1-2", "wait threading.py:320 <- g two/x.py:3"),
        ("0", "wait threading.py:320 <- g one/x.py:3"),
    ]


def test_many_classes_and_suspect_nodes_are_cut_to_one_screen_with_counts() -> None:
    """1,024 ranks on 128 nodes: ranks 0-29 each somewhere of their own, nodes 100-109 did not answer, three
    nodes with kernel lines; the verdict is cut to one screen and says what it left out."""
    report = StackReport(taken_at=1000.0, attempt=1, world_size=1024, hosts=[f"n{i}" for i in range(128)], gpus=[8] * 128)
    for rank in range(1024):
        node = rank // 8
        if 100 <= node < 110:
            continue
        text = WAITING.format(pid=rank, thread=rank + 7, where="get (queue.py:180)")
        if rank < 30:
            text = text.replace("    all_reduce (torch/distributed/distributed_c10d.py:2050)\n"
                                "    _exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83)\n",
                                f"    data_wait (loader.py:{50 + rank})\n")
        report.ranks.append(RankStack(node, rank, f"n{node}", rank, text, local_rank=rank % 8))
    report.unreached = {n: f"ssh: connect to host n{n} port 22: Connection timed out" for n in range(100, 110)}
    report.nodes = {n: {"kernel": [f"2026-12-02T04:00:0{n % 10},000000+00:00 NVRM: Xid (PCI:0000:3b:00): 48"]
                        if n in (5, 77, 90) else [], "last_output": [990.0, f"[{n}/{8 * n}] step 9"]} for n in range(128)}
    report.activity = {r: {"node": r // 8, "idle_s": 300.0, "step": 9} for r in range(1024)}
    row = JobRow("big-2", "big", JobState.RUNNING, reason="stalled at step 9 on node 3/rank 24: no rank reported progress")
    events = [{"t": 1001.0, "kind": "restarting", "message": "attempt 1 failed"}]
    screen = verdict_lines(report, row, events)
    assert len(screen) <= 40
    assert screen[0].startswith("verdict: stalled at step 9 on node 3/rank 24 (attempt 1; stacks of 944 of 1024 rank(s)"), "80 ranks on 10 unreached nodes"
    assert screen[1].startswith("stacks: 32 class(es)")
    assert screen[2:11] == [
        "  ranks 30-799,880-1023: all_reduce <- train_step train.py:212",
        "  ranks 800-879: (no stack: its node did not answer (stacks not taken))",
        "  rank 0 (node 0 n0, gpu0): data_wait loader.py:50",
        "  rank 1 (node 0 n0, gpu1): data_wait loader.py:51",
        "  rank 2 (node 0 n0, gpu2): data_wait loader.py:52",
        "  rank 3 (node 0 n0, gpu3): data_wait loader.py:53",
        "  rank 4 (node 0 n0, gpu4): data_wait loader.py:54",
        "  rank 5 (node 0 n0, gpu5): data_wait loader.py:55",
        "  ... 24 more class(es) of 24 rank(s) (status --json: verdict.classes)",
    ]
    assert screen[11] == "stand apart: ranks 0-29,800-879 of 1024, on nodes 0 (n0), 1 (n1), 2 (n2), 3 (n3), ... 10 more"
    assert screen[12] == "suspect nodes, side by side with the 111 other node(s):"
    assert [line[:19] for line in screen[14:18]] == ["  0 n0             ", "  1 n1             ", "  2 n2             ",
                                                      "  100 n100         "]
    assert "unreachable" in screen[17] and screen[18].startswith("  others (111)")
    assert screen[19] == "  ... 13 more suspect node(s) (status --json: verdict.suspects)"
    assert "    node 100 did not answer: ssh: connect to host n100 port 22: Connection timed out" in screen
    assert screen[-2].endswith("; restarted as attempt 2")


def test_a_stalled_jobs_busy_rank_is_set_beside_its_idle_neighbours() -> None:
    """Stalled: rank 21 still gains CPU time (0-1 s ago) while the 15 others have been idle 290-300 s."""
    report = StackReport(taken_at=5000.0, attempt=0, world_size=16, hosts=["a", "b"], gpus=[0, 0])
    for rank in range(16):
        text = WAITING.format(pid=rank, thread=rank + 7, where="get (queue.py:180)")
        if rank == 13:
            text = ELSEWHERE.format(pid=rank)
        report.ranks.append(RankStack(rank // 8, rank, "ab"[rank // 8], rank, text, local_rank=rank % 8))
    report.activity = {r: {"node": r // 8, "idle_s": 300.0 - r % 8, "step": 9} for r in range(16)}
    report.activity[13]["idle_s"] = 0.4
    row = JobRow("s-1", "s", JobState.FAILED, reason="stalled at step 9 on node 1/rank 13: no rank reported progress")
    screen = verdict_lines(report, row, [])
    assert "  rank 13 (node 1 b, local rank 5): backward <- train_step train.py:208" in screen
    assert "    node 1 CPU/GPU: rank 13 active 0 s ago, the node's other 7 idle 293-300 s" in screen
    [row_b] = [line for line in screen if line.startswith("  1 b ")]
    [others] = [line for line in screen if line.startswith("  others (1)")]
    assert "idle 0-300 s" in row_b and "idle 293-300 s" in others
