"""A job outlives its supervisor (issue 20): real torchrun ranks on the local backend. A detached supervisor
SIGKILLed mid-run is replaced by its keeper; once keeper and supervisor are both killed (the machine's crash),
`launch attach` follows the job to its end from the node journals."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.node import proctree, rundir
from launcher.store.db import Store
from tests.helpers import ROOT, cli_env, launch_argv, output_texts, run_cli, status_json, wait_for, wait_for_state, write_yaml

pytestmark = pytest.mark.slow

STEP_LINES = ROOT / "tests" / "programs" / "step_lines.py"
STEPS = 150
HEARD = "import os, sys; open(sys.argv[1], 'a').write(os.environ['LAUNCH_JOB_EVENT'] + '\\n')"


def _job(path: Path, heard: Path) -> Path:
    return write_yaml(path, {
        "notify": {"on": ["unattended"], "commands": [[sys.executable, "-c", HEARD, str(heard)]]},
        "name": "attach", "entrypoint": ["python", str(STEP_LINES)], "batch": {"micro_batch": 8},
        "resources": {"nodes": 1, "nproc_per_node": 2}, "max_steps": STEPS,
        "env": {"STEPS": str(STEPS), "STEP_S": "0.15"},
    })


def _step_lines(journal: Path) -> int:
    """How many 'step K of rank R' lines node 0's journal holds (0 before it exists)."""
    try:
        return sum(1 for text in output_texts(journal.read_bytes().splitlines()) if text.startswith("[") and "]: step " in text)
    except FileNotFoundError:
        return 0


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and proctree._stat(pid) is not None and proctree._stat(pid)[1] != "Z"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _new_supervisor(home: Path, job_id: str, old: int) -> dict | None:
    supervisor = status_json(home, job_id)["supervisor"]
    return supervisor if supervisor and supervisor["state"] == "attached" and supervisor["pid"] != old else None


def test_a_job_outlives_its_killed_supervisor_and_attach_follows_it_to_the_end(tmp_path, home):
    heard = tmp_path / "heard.txt"
    job_id = run_cli(home, "submit", str(_job(tmp_path / "job.yaml", heard)), "--detach").stdout.strip()
    try:
        assert wait_for_state(home, job_id, ("RUNNING",))["state"] == "RUNNING"
        assert wait_for(lambda: status_json(home, job_id)["metrics"]["steps"] >= 3, timeout=180)
        supervisor = status_json(home, job_id)["supervisor"]
        assert supervisor["state"] == "attached" and supervisor["host"] and isinstance(supervisor["pid"], int)

        refused = run_cli(home, "attach", job_id)
        assert refused.returncode == 1
        assert f"process {supervisor['pid']} on {supervisor['host']}" in refused.stderr, refused.stderr

        keeper = _parent(supervisor["pid"])
        assert b"launcher.run.detached" in Path(f"/proc/{keeper}/cmdline").read_bytes()
        os.kill(supervisor["pid"], signal.SIGKILL)  # the supervisor alone: its keeper starts one that re-attaches
        again = wait_for(lambda: _new_supervisor(home, job_id, supervisor["pid"]), timeout=60)
        restarted = [e["message"] for e in status_json(home, job_id)["events"] if e["kind"] == "supervisor_restarted"]
        assert len(restarted) == 1 and f"(PID {supervisor['pid']}) was killed by SIGKILL" in restarted[0], restarted
        assert heard.read_text() == "unattended\n"
        assert wait_for(lambda: status_json(home, job_id)["metrics"]["steps"] >= 6, timeout=120)

        os.kill(keeper, signal.SIGKILL)  # keeper and supervisor both: the submitting machine crashed
        os.kill(again["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        assert wait_for(lambda: not _alive(again["pid"]) and not _alive(keeper), timeout=10)
        ranks = proctree.job_pids(job_id)
        assert ranks, "the job's processes ended with their supervisor"

        lost = status_json(home, job_id)
        assert lost["state"] == "RUNNING" and lost["supervisor"]["state"] == "lost"
        wide = cli_env(home, COLUMNS="300")
        [row] = [line for line in run_cli(home, "status", env=wide).stdout.splitlines() if job_id in line]
        assert "RUNNING unattended " in row, row  # the list's STATE column stays short; `status JOB` says what to do
        asked = rf"RUNNING, unattended since \d\d:\d\d \(no supervisor\); its agents still run the job on every node: " \
                rf"launch attach {job_id}"  # `status JOB` asks the nodes
        assert re.search(asked, run_cli(home, "status", job_id, env=wide).stdout)
        follow = run_cli(home, "logs", job_id, "--follow", timeout=30)
        assert follow.returncode == 1 and f"launch attach {job_id}" in follow.stderr
        journal = Path(rundir.run_root()) / job_id / "node0.journal"
        steps_at_kill = _step_lines(journal)
        assert wait_for(lambda: _step_lines(journal) >= steps_at_kill + 3, timeout=120), \
            "the ranks stopped training without a supervisor"  # unattended, their lines go to the journal only
        assert all(_alive(pid) for pid in ranks)

        began = time.monotonic()
        proc = subprocess.Popen(launch_argv("attach", job_id), env=cli_env(home), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT)
        assert proc.stdout is not None
        first = proc.stdout.readline()
        caught_up = time.monotonic() - began
        out, err = proc.communicate(timeout=180)
        took = time.monotonic() - began
        assert proc.returncode == 0, err + out[-2000:]
        assert f"job {job_id}: SUCCEEDED" in err and first
        # attach's output is a pipe: the relayed lines and a [progress] summary at the end, as the README says
        assert re.search(rf"^\[progress\] step {STEPS}/{STEPS}  100% ", first + out, re.M), (first + out)[-2000:]
        print(f"attach: first relayed line after {caught_up:.2f} s, the end after {took:.1f} s "
              f"({time.monotonic() - killed_at:.1f} s after the kill)")
    finally:
        run_cli(home, "cancel", job_id)

    done = status_json(home, job_id)
    assert done["state"] == "SUCCEEDED" and done["supervisor"] is None
    logs = run_cli(home, "logs", job_id, "--rank", "0").stdout
    steps = [int(m) for m in re.findall(r"step (\d+) of rank 0", logs)]
    assert steps == list(range(STEPS)), f"rank 0's step lines, each once and in order: {steps}"
    assert done["metrics"]["steps"] == STEPS
    by_rank: dict[int, list[int]] = {}
    for record in Store(home).metrics(job_id):
        by_rank.setdefault(record.rank, []).append(record.step)
    assert sorted(by_rank) == [0, 1]
    assert all(sorted(steps) == by_rank[0] == sorted(set(by_rank[0])) and len(steps) == STEPS
               for steps in by_rank.values()), by_rank
    assert proctree.job_pids(job_id) == []
    assert not (Path(rundir.run_root()) / job_id).exists(), "the store filed it all after its attach: the journals went"


LOCK = ("import sqlite3, sys, time; db = sqlite3.connect(sys.argv[1], isolation_level=None); "
        "db.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(float(sys.argv[2])); db.execute('COMMIT')")


def test_a_store_locked_for_25_s_holds_records_back_and_judges_nothing(tmp_path, home):
    """Issue 39: another process holds the store's write lock for 25 s (`BEGIN EXCLUSIVE`, as a backup or a sqlite3
    shell does) while a detached job trains, with stall_timeout 15 s: the job SUCCEEDS in attempt 0 with every
    step's record once (they waited and were filed once the lock was released), and the supervisor says so. Before,
    the loop waited on the store for as long, then judged the ranks idle for as long: hung."""
    steps, locked_s = 140, 25.0
    job = write_yaml(tmp_path / "job.yaml", {
        "name": "locked", "entrypoint": ["python", str(STEP_LINES)], "batch": {"micro_batch": 8},
        "resources": {"nodes": 1, "nproc_per_node": 2}, "max_steps": steps, "watch": {"stall_timeout": 15},
        "env": {"STEPS": str(steps), "STEP_S": "0.25"},
    })
    job_id = run_cli(home, "submit", str(job), "--detach").stdout.strip()

    def training() -> dict | None:
        shown = status_json(home, job_id)
        return shown if shown["metrics"]["steps"] >= 3 or shown["state"] not in ("PENDING", "LAUNCHING", "RUNNING") else None

    started = wait_for(training, timeout=180)
    assert started is not None and started["state"] == "RUNNING", started and started["reason"]
    journal = Path(rundir.run_root()) / job_id / "node0.journal"
    holder = subprocess.Popen([sys.executable, "-c", LOCK, str(home / "jobs.db"), str(locked_s)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    at_lock = _step_lines(journal)
    assert holder.wait(timeout=locked_s + 30) == 0
    trained = _step_lines(journal) - at_lock
    assert trained >= 2 * 0.5 * locked_s / 0.25, f"{trained} step lines while the store was locked"
    done = wait_for_state(home, job_id, ("SUCCEEDED", "FAILED", "CANCELLED"), timeout=180)
    assert (done["state"], done["attempt"]) == ("SUCCEEDED", 0), done["reason"]
    kinds = {e["kind"]: e["message"] for e in done["events"]}
    assert "hung" not in kinds and "stalled" not in kinds and "records_lost" not in kinds, kinds
    assert re.match(r"the job store was locked by another process for 2\d s: \d+ record\(s\) waited and are filed",
                    kinds["store_locked"]), kinds["store_locked"]
    by_rank: dict[int, list[int]] = {}
    for record in Store(home).metrics(job_id):
        by_rank.setdefault(record.rank, []).append(record.step)
    assert {rank: sorted(got) for rank, got in by_rank.items()} == {0: list(range(1, steps + 1)),
                                                                   1: list(range(1, steps + 1))}
    print(f"store locked {locked_s:.0f} s: {trained} step lines meanwhile; {kinds['store_locked']}")


TAKEN_STEPS, GATE_STEP = 50, 30


def _rank0_steps(home: Path, job_id: str) -> list[int]:
    return [int(m) for m in re.findall(r"step (\d+) of rank 0", run_cli(home, "logs", job_id, "--rank", "0").stdout)]


def _each_step_once(home: Path, job_id: str, steps: int) -> None:
    """Every rank-0 step line once and in order in `launch logs`; every step's record of each rank once."""
    assert _rank0_steps(home, job_id) == list(range(steps))
    by_rank: dict[int, list[int]] = {}
    for record in Store(home).metrics(job_id):
        by_rank.setdefault(record.rank, []).append(record.step)
    assert sorted(by_rank) == [0, 1] and all(sorted(got) == list(range(1, steps + 1)) for got in by_rank.values()), by_rank


def test_takeover_fences_a_live_supervisor_and_another_store_reads_the_job_back_from_its_nodes(tmp_path, home):
    """`launch attach --takeover` while the detached supervisor lives: the old one stops, saying why, its keeper
    restarts nothing. A fresh LAUNCH_HOME with --cluster is refused while the new supervisor follows; with
    --takeover it takes the job (issue 34): store 1's supervisor stops, store 1's plain attach is refused naming store
    2's supervisor, and store 1's status says "taken over", never "unattended". Store 2 follows the job to its end,
    with its whole history, and keeps the nodes' run directories for store 1 (issue 39), whose plain attach then reads
    the end back and removes them: a third store finds the job nowhere."""
    gate, other, third = tmp_path / "gate", tmp_path / "other-home", tmp_path / "third-home"
    spec = write_yaml(tmp_path / "job.yaml", {
        "name": "takeover", "entrypoint": ["python", str(STEP_LINES)], "batch": {"micro_batch": 8},
        "resources": {"nodes": 2, "nproc_per_node": 1}, "max_steps": TAKEN_STEPS,
        "env": {"STEPS": str(TAKEN_STEPS), "STEP_S": "0.1", "GATE_FILE": str(gate), "GATE_STEP": str(GATE_STEP)},
    })
    job_id = run_cli(home, "submit", str(spec), "--detach").stdout.strip()
    try:
        assert wait_for(lambda: status_json(home, job_id)["metrics"]["steps"] >= 3, timeout=180)
        old = status_json(home, job_id)["supervisor"]
        assert old["state"] == "attached" and old["generation"] == 0
        keeper = _parent(old["pid"])
        began = time.monotonic()
        proc = subprocess.Popen(launch_argv("attach", job_id, "--takeover"), env=cli_env(home),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        new = wait_for(lambda: _new_supervisor(home, job_id, old["pid"]) or proc.poll() is not None, timeout=180)
        if not isinstance(new, dict):
            proc.terminate()
            pytest.fail(f"no new supervisor ({new}): {proc.communicate(timeout=60)[1][-3000:]}")
        assert new["pid"] == proc.pid and new["generation"] == 1, new
        took = time.monotonic() - began
        assert wait_for(lambda: not _alive(old["pid"]) and not _alive(keeper), timeout=60)
        said = (home / "runs" / job_id / "supervisor.log").read_text()
        assert (f"job {job_id}: taken over by a newer supervisor (generation 1, process {proc.pid} on "
                in said and "this one stops here" in said), said[-2000:]

        refused = run_cli(other, "attach", job_id, "--cluster", "cluster.yaml")
        assert refused.returncode == 1 and "is followed by a supervisor elsewhere (generation 1" in refused.stderr, \
            refused.stderr
        unknown = run_cli(other, "attach", "takeover-00000000", "--cluster", "cluster.yaml")
        assert unknown.returncode == 1 and "its nodes do not know it either" in unknown.stderr, unknown.stderr
        assert Store(other).job_ids() == []
        print(f"takeover: the new supervisor in charge {took:.1f} s after `launch attach --takeover` started")

        taker = subprocess.Popen(launch_argv("attach", job_id, "--cluster", "cluster.yaml", "--takeover"),
                                 env=cli_env(other), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        assert proc.wait(timeout=120) == 5, "store 1's supervisor stops once store 2 takes the job"
        assert f"taken over by a newer supervisor (generation 2, process {taker.pid} on " in proc.stderr.read()
        refused = run_cli(home, "attach", job_id)
        assert refused.returncode == 1 and (f"is followed by another supervisor (generation 2, process {taker.pid} on "
                                            in refused.stderr and "was in contact" in refused.stderr), refused.stderr
        shown = status_json(home, job_id)["supervisor"]
        assert shown["state"] == "taken_over" and shown["taken_over_by"]["generation"] == 2, shown
        assert shown["taken_over_by"]["pid"] == taker.pid, shown
        listed = run_cli(home, "status", env=cli_env(home, COLUMNS="300")).stdout
        assert "RUNNING taken over " in listed and "unattended" not in listed, listed
        detail = run_cli(home, "status", job_id, env=cli_env(home, COLUMNS="300")).stdout
        assert f"RUNNING, taken over by generation 2 (process {taker.pid} on " in detail, detail

        gate.touch()
        out, err = taker.communicate(timeout=180)
        assert taker.returncode == 0 and f"job {job_id}: SUCCEEDED" in err, err + out[-2000:]
        run_dir = Path(rundir.run_root()) / job_id  # issue 39: store 1 has not filed the end: kept for its attach
        assert (run_dir / "node0.journal").exists() and (run_dir / "node1.journal").exists()
        back = wait_for(lambda: (lambda done: done if done.returncode == 0 or "followed by" not in done.stderr else None)(
            run_cli(home, "attach", job_id)), timeout=30)  # the nodes' contact with store 2 ages past 3 s
        assert back is not None and back.returncode == 0 and f"job {job_id}: SUCCEEDED" in back.stderr, back
        assert not run_dir.exists(), "both stores that followed the job filed it: its run directory went"
    finally:
        gate.touch()
        run_cli(home, "cancel", job_id)

    done = status_json(home, job_id)
    assert done["state"] == "SUCCEEDED" and done["supervisor"] is None
    kinds = [event["kind"] for event in done["events"]]
    assert kinds.count("takeover") == 1 and kinds.count("succeeded") == 1, kinds
    assert not {"supervisor_restarted", "supervisor_lost", "cancelled", "failed", "restarting"} & set(kinds), kinds
    _each_step_once(home, job_id, TAKEN_STEPS)
    again = status_json(other, job_id)
    assert again["state"] == "SUCCEEDED" and "imported" in [event["kind"] for event in again["events"]]
    _each_step_once(other, job_id, TAKEN_STEPS)

    gone = run_cli(third, "attach", job_id, "--cluster", "cluster.yaml")  # filed by every store that followed it
    assert gone.returncode == 1 and "its nodes do not know it either" in gone.stderr, gone.stderr
    assert proctree.job_pids(job_id) == []


HUNG_STEPS, HUNG_GATE = 40, 12


def test_a_closed_terminal_never_ends_a_foreground_job_and_attach_takes_it_back(tmp_path, home):
    """Issue 34: `launch submit` in the foreground on a terminal (the pty its controlling terminal, as in a terminal
    window or an SSH session). Ctrl-C asks, "n" goes on; the terminal closes (SIGHUP): the supervisor goes on in the
    background and `launch status` says so with `launch attach JOB`; a plain `launch attach` takes the job back to a
    terminal and follows it to SUCCEEDED in attempt 0, every step once."""
    from tests.terminal import ControllingTerminal

    gate = tmp_path / "gate"
    spec = write_yaml(tmp_path / "job.yaml", {
        "name": "hangup", "entrypoint": ["python", str(STEP_LINES)], "batch": {"micro_batch": 8},
        "resources": {"nodes": 1, "nproc_per_node": 2}, "max_steps": HUNG_STEPS,
        "env": {"STEPS": str(HUNG_STEPS), "STEP_S": "0.1", "GATE_FILE": str(gate), "GATE_STEP": str(HUNG_GATE)},
    })
    term = ControllingTerminal(launch_argv("submit", str(spec)), cli_env(home))
    job_id = None
    try:
        job_id = wait_for(lambda: (re.findall(r"job (hangup-[0-9a-f]{8}):", term.text) or [None])[0], timeout=120)
        assert job_id, term.text[-3000:]
        assert wait_for(lambda: status_json(home, job_id)["metrics"]["steps"] >= 3, timeout=180), term.text[-3000:]
        term.type(b"\x03")
        assert wait_for(lambda: "cancel the job? [y/N]" in term.text, timeout=30), term.text[-3000:]
        term.type(b"n\r")
        assert wait_for(lambda: "the job goes on" in term.text, timeout=30), term.text[-3000:]
        term.hang_up()
        closed = wait_for(lambda: [e for e in status_json(home, job_id)["events"] if e["kind"] == "terminal_closed"],
                          timeout=30)
        assert closed and term.proc.poll() is None, "the supervisor went on after its terminal closed"
        shown = run_cli(home, "status", job_id, env=cli_env(home, COLUMNS="300")).stdout
        assert re.search(rf"RUNNING, in the background since \d\d:\d\d \(its terminal closed\): launch attach {job_id}",
                         shown), shown
        assert "RUNNING background " in run_cli(home, "status", env=cli_env(home, COLUMNS="300")).stdout

        attach = subprocess.Popen(launch_argv("attach", job_id), env=cli_env(home), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=ROOT)
        assert term.proc.wait(timeout=90) == 5, "the background supervisor gave the job to the attach"
        said = (home / "runs" / job_id / "supervisor.log").read_text()
        assert f"job {job_id}: taken over by a newer supervisor (generation 1, process {attach.pid}" in said, said
        gate.touch()
        out, err = attach.communicate(timeout=180)
        assert attach.returncode == 0 and f"job {job_id}: SUCCEEDED" in err, err + out[-2000:]
    finally:
        gate.touch()
        if term.proc.poll() is None and job_id is None:
            term.proc.kill()
        if job_id:
            run_cli(home, "cancel", job_id)
    done = status_json(home, job_id)
    assert done["state"] == "SUCCEEDED" and done["attempt"] == 0
    kinds = [event["kind"] for event in done["events"]]
    assert kinds.count("terminal_closed") == 1 and kinds.count("takeover") == 1, kinds
    assert not {"cancelled", "cancel_requested", "restarting", "supervisor_lost"} & set(kinds), kinds
    _each_step_once(home, job_id, HUNG_STEPS)


KEPT_STEPS, KEPT_GATE = 40, 20


def test_logs_follow_and_status_watch_wait_through_a_keepers_restart(tmp_path, home):
    """Issue 34: a detached job's supervisor SIGKILLed; its keeper starts another. `launch logs --follow` and
    `launch status --watch` (both on pipes) say `supervisor restarting, 1 of 3` and go on to the job's end: every
    rank-0 line once, exit 0."""
    gate = tmp_path / "gate"
    spec = write_yaml(tmp_path / "job.yaml", {
        "name": "kept", "entrypoint": ["python", str(STEP_LINES)], "batch": {"micro_batch": 8},
        "resources": {"nodes": 1, "nproc_per_node": 2}, "max_steps": KEPT_STEPS,
        "env": {"STEPS": str(KEPT_STEPS), "STEP_S": "0.1", "GATE_FILE": str(gate), "GATE_STEP": str(KEPT_GATE)},
    })
    job_id = run_cli(home, "submit", str(spec), "--detach").stdout.strip()
    watchers = []
    try:
        assert wait_for(lambda: status_json(home, job_id)["metrics"]["steps"] >= 3, timeout=180)
        for args in (("logs", job_id, "--follow", "--rank", "0"), ("status", job_id, "--watch")):
            watchers.append(subprocess.Popen(launch_argv(*args), env=cli_env(home), stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=ROOT))
        firsts = [proc.stdout.readline() for proc in watchers]  # both follow the job now
        supervisor = status_json(home, job_id)["supervisor"]
        os.kill(supervisor["pid"], signal.SIGKILL)
        assert wait_for(lambda: _new_supervisor(home, job_id, supervisor["pid"]), timeout=60)
        assert all(proc.poll() is None for proc in watchers), "a watcher gave up while the keeper restarted"
        gate.touch()
        (out, err), (wout, werr) = ((first + proc.stdout.read(), proc.stderr.read()) for first, proc in zip(firsts, watchers))
        assert [proc.wait(timeout=60) for proc in watchers] == [0, 0], err + werr
    finally:
        gate.touch()
        run_cli(home, "cancel", job_id)
        for proc in watchers:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    follow, watch = watchers
    assert follow.returncode == 0 and f"job {job_id}: supervisor restarting, 1 of 3" in err, err
    assert [int(m) for m in re.findall(r"step (\d+) of rank 0", out)] == list(range(KEPT_STEPS)), out[-2000:]
    assert watch.returncode == 0 and f"job {job_id}: supervisor restarting, 1 of 3" in werr, werr
    assert f"job {job_id}: SUCCEEDED" in werr, werr
    assert status_json(home, job_id)["state"] == "SUCCEEDED"
