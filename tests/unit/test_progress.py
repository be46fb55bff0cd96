"""The progress view: figures from metric records, the live view on a terminal, plain lines on a pipe."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.metrics.record import MetricRecord
from launcher.metrics.snapshot import snapshot, summary_line
from launcher.spec import JobSpec
from launcher.store.db import LAUNCHING, RUNNING, Store
from launcher.store.records import Batch
from launcher.views.progress import PlainProgress
from tests.helpers import ROOT, cli_env
from tests.terminal import run_in_terminal

DRIVER = ROOT / "tests" / "programs" / "progress_driver.py"
GIB = 2**30


def record(rank: int, step: int, *, sps: float = 10.0, step_s: float = 0.1, mem: int = GIB, attempt: int = 0, **extra):
    return {"rank": rank, "node": rank // 2, "step": step, "samples_per_sec": sps, "step_time_s": step_s,
            "mem_peak_bytes": mem, "attempt": attempt, **extra}


def test_snapshot_of_two_ranks():
    records = [record(0, 20, sps=70.0, step_s=0.12), record(1, 20, sps=35.0, step_s=0.25),
               record(0, 30, sps=80.0, step_s=0.1, mem=3 * GIB // 2, loss=0.25), record(1, 30, sps=40.0, step_s=0.2)]
    snap = snapshot(records, 60, started_at=1000.0, now=1042.0)
    assert (snap.step, snap.max_steps, snap.ranks) == (30, 60, 2)
    assert snap.samples_per_sec == 120.0, "the sum of the ranks' latest rates"
    assert (snap.slowest_rank, snap.slowest_step_s) == (1, 0.2)
    assert snap.peak_mem_bytes == 3 * GIB // 2 and snap.loss == 0.25
    assert snap.elapsed_s == 42.0
    assert snap.eta_s == pytest.approx(30 * 0.2), "30 steps left at the slowest rank's pace"
    assert summary_line(snap) == ("[progress] step 30/60  50%  elapsed 0:00:42  ETA 0:00:06  120 samples/s  "
                                  "slowest rank 1 (200 ms/step)  peak mem 1.5 GiB  loss 0.25")


def test_the_step_is_the_lowest_of_the_ranks_latest_and_a_restart_starts_over():
    assert snapshot([record(0, 40), record(1, 30)], 60, 0, 1).step == 30
    restarted = [record(0, 50, mem=8 * GIB), record(1, 50), record(0, 10, attempt=1, mem=GIB), record(1, 10, attempt=1)]
    snap = snapshot(restarted, 60, 0, 1)
    assert snap.step == 10 and snap.peak_mem_bytes == GIB, "only the latest attempt counts"
    late = restarted + [record(1, 60, attempt=0)]
    assert snapshot(late, 60, 0, 1).step == 10, "a late record of an older attempt is ignored"


def test_untrusted_values_are_ignored_not_trusted():
    records = [
        {"rank": "0", "step": 10}, {"rank": 0, "step": -5}, {"rank": True, "step": 3}, {"step": 12},
        record(2, 20, sps=float("nan"), step_s=-1.0, mem="huge"),
        record(3, 20, sps=float("inf"), step_s=True, mem=-7, loss="low"),
    ]
    snap = snapshot(records, 100, 0, 1)
    assert snap.ranks == 2 and snap.step == 20
    assert snap.samples_per_sec is None and snap.slowest_rank is None and snap.peak_mem_bytes is None
    assert snap.loss is None and snap.eta_s is None


def test_no_records_yet_and_no_step_limit():
    snap = snapshot([], 60, started_at=10.0, now=15.0)
    assert snap.step is None and snap.eta_s is None
    assert summary_line(snap) == "[progress] step 0/60  elapsed 0:00:05  no metric records yet"
    unlimited = snapshot([record(0, 7)], None, 0, 3725)
    assert unlimited.eta_s is None
    assert summary_line(unlimited).startswith("[progress] step 7  elapsed 1:02:05  10.0 samples/s")
    assert snapshot([record(0, 60)], 60, 0, 1).eta_s == 0.0


def test_plain_stage_lines_one_per_change():
    out = io.StringIO()
    progress = PlainProgress(out, max_steps=10, nnodes=2)
    progress.stage("preflight", 0, "lt-h1", "running")
    progress.stage("preflight", 0, "lt-h1", "running")
    progress.stage("preflight", 1, "lt-h2", "failed", "python3.11 not found")
    progress.stage("queued", None, "", "running", "Priority")
    progress.log("1764536400.123 [0/1] step 10 loss 0.2")
    progress.close()
    assert out.getvalue().splitlines() == [
        "[preflight] node 0 (lt-h1): running",
        "[preflight] node 1 (lt-h2): failed: python3.11 not found",
        "[queued] job: running: Priority",
        "[0/1] step 10 loss 0.2",
    ]
    with pytest.raises(ValueError, match="expected one of"):
        progress.stage("compile", 0, "h", "done")


def test_plain_stage_lines_of_64_nodes_are_counts_by_quarter_and_each_failure():
    out = io.StringIO()
    progress = PlainProgress(out, max_steps=10, nnodes=64)
    for node in range(64):
        progress.stage("preflight", node, f"h{node}", "running")
    for node in range(64):
        failed = node in (7, 40)
        progress.stage("preflight", node, f"h{node}", "failed" if failed else "done", "cannot connect" if failed else "")
    progress.close()
    assert out.getvalue().splitlines() == [
        "[preflight] node 7 (h7): failed: cannot connect",
        "[preflight] 16/64 done, 1 failed, 47 running",
        "[preflight] 32/64 done, 1 failed, 31 running",
        "[preflight] node 40 (h40): failed: cannot connect",
        "[preflight] 48/64 done, 2 failed, 14 running",
        "[preflight] 62/64 done, 2 failed",
    ]


@pytest.fixture
def job_with_records(home):
    """A running job with two ranks at step 30 of 60 (rank 1 the slower)."""
    store = Store(home)
    job = JobSpec(name="p", entrypoint=["python", "t.py"], batch={"micro_batch": 2}, max_steps=60)
    store.create_job(plan_job(job, cluster_spec(name="local"), "p-000001", rdzv_port=29500), {})
    assert store.transition("p-000001", LAUNCHING) and store.transition("p-000001", RUNNING)
    store.add_batch("p-000001", 0, Batch(records=[
        MetricRecord(rank=0, node=0, step=30, samples_per_sec=80.0, step_time_s=0.1, mem_peak_bytes=3 * GIB // 2),
        MetricRecord(rank=1, node=0, step=30, samples_per_sec=40.0, step_time_s=0.2, mem_peak_bytes=GIB),
    ]))
    return home


def test_live_view_on_a_terminal(job_with_records):
    run = run_in_terminal([sys.executable, str(DRIVER), "p-000001"], cli_env(job_with_records), cols=100, rows=200)
    assert run.returncode == 0, run.text[-2000:]  # 3: the view's thread never read the records
    lines = [line for line in run.screen if line]
    assert lines[:3] == [
        "preflight  node 0 (lt-h1) done  node 1 (lt-h2) done",
        "sync       node 0 (lt-h1) done  node 1 (lt-h2) done",
        "start      node 0 (lt-h1) done  node 1 (lt-h2) done",
    ]
    relayed = lines[3:-3]
    assert lines[-3] == "[0/0] [bold red]not markup[/] green \\x1b[2J\\x1b[Hno clear screen", \
        "rank output is shown, never obeyed: its colour kept, its cursor moves as text"
    assert sorted(relayed) == sorted(f"[{r // 2}/{r}] line {i} of rank {r}" for r in range(3) for i in range(40)), \
        "every line relayed by three threads, once, without its timestamp"
    bar, below = lines[-2:]
    assert re.fullmatch(r"step 30/60 [━╸╺ ]+ 50%  elapsed \d+:\d\d:\d\d  ETA 0:00:0[56]", bar), bar
    assert below == "120 samples/s  slowest rank 1 (200 ms/step)  peak mem 1.5 GiB"
    assert sum("step 30/60" in line for line in run.screen) == 1, "the bar is drawn once, not left behind"
    assert b"\x1b[?25h" in run.raw[-200:], "the cursor is shown again"


def test_live_view_fits_a_narrow_terminal(job_with_records):
    run = run_in_terminal([sys.executable, str(DRIVER), "p-000001"], cli_env(job_with_records), cols=50, rows=200)
    assert run.returncode == 0
    bar, below = [line for line in run.screen if line][-2:]
    assert bar.startswith("step 30/60 ") and "ETA" in bar and len(bar) <= 50
    assert below.startswith("120 samples/s") and below.endswith("…")


def test_plain_output_on_a_pipe(job_with_records):
    result = subprocess.run([sys.executable, str(DRIVER), "p-000001"], capture_output=True, text=True,
                            env=cli_env(job_with_records), timeout=60)
    assert result.returncode == 0, result.stderr
    rank_line = "[0/0] [bold red]not markup[/] \x1b[32mgreen\x1b[0m \x1b[2J\x1b[Hno clear screen"
    lines = result.stdout.splitlines()
    shown = "[0/0] [bold red]not markup[/] \x1b[32mgreen\x1b[0m \\x1b[2J\\x1b[Hno clear screen"
    assert shown in lines and rank_line not in lines, "on a pipe too: colour kept, cursor moves as text (a pipe often ends on a terminal)"
    assert not [line for line in lines if "\x1b" in line and line != shown], "no escape codes of its own"
    assert lines[:4] == ["[preflight] node 0 (lt-h1): running", "[preflight] node 1 (lt-h2): running",
                         "[preflight] node 0 (lt-h1): done", "[preflight] node 1 (lt-h2): done"]
    assert len([line for line in lines if " line " in line]) == 120
    summaries = [line for line in lines if line.startswith("[progress] ")]
    assert len(summaries) == 1, "one summary: at the first read, not repeated at the end for the same step"
    assert re.fullmatch(r"\[progress\] step 30/60  50%  elapsed \d+:\d\d:\d\d  ETA 0:00:0[56]  120 samples/s  "
                        r"slowest rank 1 \(200 ms/step\)  peak mem 1.5 GiB", summaries[0])


def test_live_stage_lines_count_many_nodes_and_are_drawn_once(job_with_records, monkeypatch):
    import pyte

    from launcher.views.progress import LiveProgress

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "40")
    out = io.StringIO()
    progress = LiveProgress(out, max_steps=60, nnodes=10)
    for node in range(10):
        progress.stage("setup", node, f"h{node}", "failed" if node == 3 else "done", "disk full" if node == 3 else "")
    progress.stage("start", 0, "h0", "done")
    progress.attach(Store(job_with_records), "p-000001")
    progress.stage("start", 0, "h0", "done")  # unchanged: not drawn again
    progress.stage("start", 0, "h0", "running")  # a restart: drawn live again
    progress.close()
    screen = pyte.Screen(80, 40)
    pyte.Stream(screen).feed(out.getvalue().replace("\n", "\r\n"))  # what a tty makes of a newline
    lines = [line.rstrip() for line in screen.display if line.strip()]
    assert lines[:4] == ["setup      9/10 done, 1 failed", "  node 3 (h3): disk full", "start      1/10 done, 9 waiting",
                         "start      0/10 done, 1 running, 9 waiting"]
    assert lines[4].startswith("step 30/60 ") and len(lines) == 6
