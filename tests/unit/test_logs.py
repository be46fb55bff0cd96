"""`launch logs` on log files written as the supervisor writes them: filters, tail, merge, colours, follow."""

from __future__ import annotations

import io
import subprocess
import time

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.spec import JobSpec
from launcher.store.db import LAUNCHING, RUNNING, SUCCEEDED, Store
from launcher.views import logs
from tests.helpers import ROOT, cli_env, launch_argv, run_cli
from tests.terminal import run_in_terminal

T0 = 1764547200.0  # 2025-12-01T00:00:00Z


def make_job(home, job_id: str, node_lines: list[list[str]], attempt: int = 0) -> Store:
    """A job in the store whose node N wrote ``node_lines[N]`` (lines as they stand in the file), 2 ranks a node."""
    store = Store(home)
    job = JobSpec(name=job_id.split("-")[0], entrypoint=["python", "t.py"], batch={"micro_batch": 2},
                  resources={"nodes": max(1, len(node_lines)), "nproc_per_node": 2})
    try:
        store.create_job(plan_job(job, cluster_spec(name="local"), job_id, rdzv_port=29500), {})
    except Exception:  # noqa: BLE001 - a second attempt of a job made before
        pass
    for node, lines in enumerate(node_lines):
        path = store.run_dir(job_id) / f"attempt{attempt}-node{node}.log"
        path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        store.set_node(job_id, attempt, node, host=f"h{node}", state="EXITED", exit_code=0, log_path=str(path))
    store.update_job(job_id, attempt=attempt)
    return store


def stamped(t: float, text: str) -> str:
    return f"{t:.3f} {text}"


@pytest.fixture
def two_nodes(home):
    make_job(home, "two-000001", [
        [stamped(T0 + 0, "[0/0] rank 0 ready"), stamped(T0 + 2, "[0/1] step 10 loss 0.5"),
         stamped(T0 + 4, "[0/0] NCCL WARN something")],
        [stamped(T0 + 1, "[1/2] rank 2 ready"), stamped(T0 + 3, "[1/3] step 10 loss 0.4"),
         stamped(T0 + 5, "[1] agent: node 1 done")],
    ])
    return home


def out_lines(result) -> list[str]:
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_all_nodes_merge_in_time_order_without_their_timestamps(two_nodes):
    assert out_lines(run_cli(two_nodes, "logs", "two")) == [
        "[0/0] rank 0 ready", "[1/2] rank 2 ready", "[0/1] step 10 loss 0.5", "[1/3] step 10 loss 0.4",
        "[0/0] NCCL WARN something", "[1] agent: node 1 done",
    ]


def test_timestamps_show_local_iso_time(two_nodes):
    result = run_cli(two_nodes, "logs", "two", "--node", "1", "--timestamps", env=cli_env(two_nodes, TZ="UTC"))
    assert out_lines(result) == [
        "2025-12-01T00:00:01.000 [1/2] rank 2 ready",
        "2025-12-01T00:00:03.000 [1/3] step 10 loss 0.4",
        "2025-12-01T00:00:05.000 [1] agent: node 1 done",
    ]


def test_rank_node_grep_and_tail_filter_then_take_the_last(two_nodes):
    assert out_lines(run_cli(two_nodes, "logs", "two", "--rank", "3")) == ["[1/3] step 10 loss 0.4"]
    assert out_lines(run_cli(two_nodes, "logs", "two", "--node", "0", "--tail", "2")) == [
        "[0/1] step 10 loss 0.5", "[0/0] NCCL WARN something"]
    assert out_lines(run_cli(two_nodes, "logs", "two", "--grep", r"step \d+")) == [
        "[0/1] step 10 loss 0.5", "[1/3] step 10 loss 0.4"]
    assert out_lines(run_cli(two_nodes, "logs", "two", "--grep", "ready|step", "--tail", "1")) == [
        "[1/3] step 10 loss 0.4"]
    assert out_lines(run_cli(two_nodes, "logs", "two", "--tail", "0")) == []


def test_a_node_or_rank_the_job_never_had_or_a_huge_tail_is_said_not_a_silent_exit_0(two_nodes):
    """Issue 39 (Low): --node 99 and --rank -1 printed nothing and exited 0; --tail 99999999999999999999999 an
    OverflowError traceback."""
    for args, said in ((["--node", "99"], "job two-000001 has nodes 0-1; no node 99"),
                       (["--rank", "4"], "job two-000001 has ranks 0-3; no rank 4"),
                       (["--rank", "-1"], "-1 is not in the range x>=0")):
        result = run_cli(two_nodes, "logs", "two", *args)
        assert result.returncode == 2 and said in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
    assert out_lines(run_cli(two_nodes, "logs", "two", "--tail", "99999999999999999999999"))[-1] == "[1] agent: node 1 done"


def test_a_bad_regex_or_time_is_a_clear_usage_error(two_nodes):
    result = run_cli(two_nodes, "logs", "two", "--grep", "step (")
    assert result.returncode == 2
    assert "--grep" in result.stderr and "not a regular expression" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    result = run_cli(two_nodes, "logs", "two", "--since", "yesterday")
    assert result.returncode == 2
    assert "--since" in result.stderr and "30s, 10m, 2h" in result.stderr and "Traceback" not in result.stderr


def test_since_takes_a_duration_or_an_iso_time(home):
    now = time.time()
    make_job(home, "since-000001", [[stamped(now - 7200, "[0/0] two hours ago"), stamped(now - 60, "[0/0] a minute ago")],
                                    [stamped(now - 30, "[1/1] half a minute ago")]])
    assert out_lines(run_cli(home, "logs", "since", "--since", "10m")) == ["[0/0] a minute ago", "[1/1] half a minute ago"]
    assert out_lines(run_cli(home, "logs", "since", "--since", "45s")) == ["[1/1] half a minute ago"]
    assert out_lines(run_cli(home, "logs", "since", "--since", "3h", "--tail", "2")) == [
        "[0/0] a minute ago", "[1/1] half a minute ago"]
    make_job(home, "iso-000001", [[stamped(T0 - 1, "[0/0] before"), stamped(T0 + 1, "[0/0] after")]])
    result = run_cli(home, "logs", "iso", "--since", "2025-12-01T00:00:00", env=cli_env(home, TZ="UTC"))
    assert out_lines(result) == ["[0/0] after"]


def test_older_logs_without_timestamps_are_shown_as_they_are_in_node_order(home):
    make_job(home, "old-000001", [["[0/0] first of node 0", "[0/1] 1617.000 is not a timestamp here"],
                                  ["[1/2] first of node 1"]])
    assert out_lines(run_cli(home, "logs", "old")) == [
        "[0/0] first of node 0", "[0/1] 1617.000 is not a timestamp here", "[1/2] first of node 1"]
    assert out_lines(run_cli(home, "logs", "old", "--timestamps", "--rank", "2")) == ["[1/2] first of node 1"]


def test_tail_reads_back_across_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "READ_BLOCK", 7)
    complete = "".join(stamped(T0 + i, f"[0/{i % 3}] line {i} " + "x" * (i % 11)) + "\n" for i in range(200))
    path = tmp_path / "node.log"
    path.write_text(complete + "partial, no newline yet")
    with open(path, "rb") as handle:
        end = logs._complete_end(handle, path.stat().st_size)
        assert end == len(complete)
        kept = logs._tail_of(handle, end, logs.LogQuery(rank=1, tail=5))
    assert [line.text for line in kept] == [
        "[0/1] line 187 ", "[0/1] line 190 xxx", "[0/1] line 193 xxxxxx", "[0/1] line 196 xxxxxxxxx", "[0/1] line 199 x"]


def test_prefixes_are_coloured_per_rank_on_a_terminal_only(two_nodes):
    env = {k: v for k, v in cli_env(two_nodes).items() if k != "NO_COLOR"}
    run = run_in_terminal(launch_argv("logs", "two"), env, cols=80, rows=20)
    assert run.returncode == 0
    assert "[0/1] step 10 loss 0.5" in run.screen
    colour_of = {}
    for rank in (0, 1, 2, 3):
        at = run.raw.index(f"[0/{rank}]".encode() if rank < 2 else f"[1/{rank}]".encode())
        colour_of[rank] = run.raw[run.raw.rindex(b"\x1b[", 0, at):at]
    assert len(set(colour_of.values())) == 4, colour_of
    assert b"\x1b[" not in run_cli(two_nodes, "logs", "two").stdout.encode(), "no colour on a pipe"
    no_color = run_in_terminal(launch_argv("logs", "two"), cli_env(two_nodes, NO_COLOR="1"), cols=80, rows=20)
    assert no_color.returncode == 0 and b"\x1b[" not in no_color.raw


def test_follow_prints_new_matching_lines_until_the_job_ends(home):
    store = make_job(home, "fol-000001", [[stamped(T0, "[0/0] old step 1"), stamped(T0 + 1, "[0/0] old noise")]])
    assert store.transition("fol-000001", LAUNCHING) and store.transition("fol-000001", RUNNING)
    proc = subprocess.Popen(launch_argv("logs", "fol", "--follow", "--grep", "step", "--tail", "1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(home), cwd=ROOT)
    assert proc.stdout.readline() == "[0/0] old step 1\n"  # the follower has read the file as it was
    log = store.run_dir("fol-000001") / "attempt0-node0.log"
    with open(log, "a", encoding="utf-8") as handle:
        handle.write(stamped(T0 + 2, "[0/0] new noise") + "\n" + stamped(T0 + 3, "[0/1] new step 2") + "\n")
    store.transition("fol-000001", SUCCEEDED)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert out.splitlines() == ["[0/1] new step 2"]


def test_follow_picks_up_a_restarts_new_attempt(home):
    store = make_job(home, "rst-000001", [[stamped(T0, "[0/0] attempt 0 line")]])
    assert store.transition("rst-000001", LAUNCHING) and store.transition("rst-000001", RUNNING)
    out: list[str] = []
    reader = logs.LogReader(store, "rst", logs.LogQuery())
    out += [line.text for line in reader.existing()]
    make_job(home, "rst-000001", [[stamped(T0 + 10, "[0/0] attempt 1 line")]], attempt=1)
    out += [line.text for line in reader.new()]
    assert out == ["[0/0] attempt 0 line", "[0/0] attempt 1 line"]


def test_print_logs_writes_through_out(two_nodes):
    buffer = io.StringIO()
    logs.print_logs(Store(two_nodes), "two", logs.LogQuery(rank=2), out=lambda s: buffer.write(s + "\n"))
    assert buffer.getvalue() == "[1/2] rank 2 ready\n"
