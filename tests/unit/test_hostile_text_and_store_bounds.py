"""What ranks print reaches terminals neutralised; the store bounds and refuses what it should (issue 24).

Every CLI test asserts the exit code, the message and that no traceback was printed.
"""

from __future__ import annotations

import csv
import io
import os
import sqlite3
import stat

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.cli.main import main
from launcher.metrics.export import write_csv
from launcher.metrics.record import MetricRecord
from launcher.spec import JobSpec
from launcher.store.db import FAILED, LAUNCHING, RUNNING, Store
from launcher.store.records import Batch
from launcher.views.progress import PlainProgress, _log_text
from launcher.views.terminal import safe_text

ESC = "\x1b"
HOSTILE = (f"{ESC}]0;pwned title\x07{ESC}]52;c;ZXZpbA==\x07{ESC}]8;;http://evil.example/\x07click{ESC}]8;;\x07"
           f"{ESC}[2K{ESC}[1A{ESC}[10;1H\rpaint {ESC}[31mred{ESC}[0m \x9b2J end")


def _plan(job_id: str):
    job = JobSpec(name="s", entrypoint=["python", "t.py"], batch={"micro_batch": 2})
    return plan_job(job, cluster_spec(name="local"), job_id, rdzv_port=29500)


def _no_terminal_control(text: str) -> None:
    """Only plain SGR escapes are left: no OSC, no cursor move, no erase, no C1 CSI, no bare CR."""
    for bad in (f"{ESC}]", f"{ESC}[2K", f"{ESC}[1A", f"{ESC}[10;1H", "\x9b", "\r", "\x07"):
        assert bad not in text, repr(bad)


# ---- the one function

def test_safe_text_keeps_plain_colour_and_makes_every_other_control_visible():
    shown = safe_text(HOSTILE)
    _no_terminal_control(shown)
    assert f"{ESC}[31mred{ESC}[0m" in shown
    assert "\\x1b]0;pwned title\\x07" in shown and "\\x1b]52;c;ZXZpbA==" in shown and "\\x0dpaint" in shown
    assert safe_text(f"{ESC}[31mred", colour=False) == "\\x1b[31mred"
    assert safe_text("a\u202eb\u200bc\td") == "a\\u202eb\\u200bc\td"
    assert safe_text("plain text, tabs\tand ünïcode") == "plain text, tabs\tand ünïcode"


# ---- logs, the piped console, the live view, status

@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("LAUNCH_HOME", str(home))
    store = Store(home)
    store.create_job(_plan("s-000024"), {})
    log = tmp_path / "node0.log"
    log.write_bytes(f"1700000000.000 [0/1] {HOSTILE}\n".encode())
    store.set_node("s-000024", 0, 0, host="h0", log_path=str(log))
    store.transition("s-000024", FAILED, reason=f"rank 1 said {ESC}]0;title\x07{ESC}[2J{ESC}[H gone")
    store.add_event("s-000024", "note", f"event {ESC}]8;;http://x/\x07link{ESC}]8;;\x07")
    store.close()
    return home


def test_logs_show_rank_output_neutralised_and_raw_gives_it_as_written(home, capsys):
    main(["logs", "s-000024"])
    out = capsys.readouterr().out
    _no_terminal_control(out)
    assert "[0/1] \\x1b]0;pwned title\\x07" in out and f"{ESC}[31mred{ESC}[0m" in out
    main(["logs", "s-000024", "--raw"])
    assert capsys.readouterr().out == f"[0/1] {HOSTILE}\n"


def test_status_shows_a_stored_reason_and_events_without_control_sequences(home, capsys):
    main(["status", "s-000024"])
    out = capsys.readouterr().out
    assert f"{ESC}]" not in out and f"{ESC}[2J" not in out and f"{ESC}[H" not in out and "\x07" not in out
    assert "rank 1 said \\x1b]0;title\\x07\\x1b[2J\\x1b[H gone" in out
    main(["status"])
    assert f"{ESC}]" not in capsys.readouterr().out


def test_the_piped_console_and_the_live_view_neutralise_relayed_lines():
    stream = io.StringIO()
    plain = PlainProgress(stream, max_steps=None, nnodes=1)
    plain.log(f"[0/1] {HOSTILE}")
    plain.close()
    _no_terminal_control(stream.getvalue())
    text = _log_text(f"[0/1] {HOSTILE}")
    assert not any(span.style and getattr(span.style, "link", None) for span in text.spans), "no hyperlink"
    assert "\\x1b]8;;http://evil.example/" in text.plain
    _no_terminal_control(text.plain)


@pytest.mark.parametrize("since", ["99999999999999999999d", "9" * 400 + "s", "200000d"])
def test_logs_since_a_huge_duration_is_a_clear_error(home, since, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["logs", "s-000024", "--since", since])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--since" in err and "a duration back of at most" in err
    assert "Traceback" not in err and "OverflowError" not in err


# ---- the store

def _status(home, capsys, monkeypatch):
    monkeypatch.setenv("LAUNCH_HOME", str(home))
    with pytest.raises(SystemExit) as exit_info:
        main(["status"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return exit_info.value.code, err


def test_a_store_with_a_negative_schema_version_is_refused_clearly(tmp_path, capsys, monkeypatch):
    (tmp_path / "home").mkdir()
    db = sqlite3.connect(tmp_path / "home" / "jobs.db")
    db.execute("PRAGMA user_version = -3")
    db.commit()
    db.close()
    code, err = _status(tmp_path / "home", capsys, monkeypatch)
    assert code == 1 and "has schema version -3, which no launch writes" in err and "jobs.db.broken" in err


def test_a_store_whose_tables_lack_columns_is_refused_clearly(tmp_path, capsys, monkeypatch):
    (tmp_path / "home").mkdir()
    db = sqlite3.connect(tmp_path / "home" / "jobs.db")
    db.execute("CREATE TABLE jobs (id TEXT PRIMARY KEY, name TEXT, created_at REAL)")
    db.execute("INSERT INTO jobs VALUES ('a-1', 'a', 1.0)")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    code, err = _status(tmp_path / "home", capsys, monkeypatch)
    assert code == 1 and "lacks jobs.attempt, jobs.backend" in err and "another program's file or a damaged one" in err


def test_a_symlinked_launch_home_is_used_but_its_target_not_chmod_ed(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    (tmp_path / "link").symlink_to(shared)
    Store(tmp_path / "link").close()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert (shared / "jobs.db").exists()


def test_launch_home_of_an_unknown_user_is_a_clear_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LAUNCH_HOME", "~no-such-user-24/launch")
    with pytest.raises(SystemExit) as exit_info:
        main(["status"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "LAUNCH_HOME: '~no-such-user-24/launch': there is no user 'no-such-user-24'" in err
    assert "Traceback" not in err


def test_metric_records_are_capped_per_job_with_one_event(tmp_path):
    store = Store(tmp_path / "home")
    store.max_metric_records = 5
    store.create_job(_plan("s-000025"), {})
    records = [MetricRecord(rank=0, node=0, step=step, samples=8) for step in range(1, 9)]
    store.add_batch("s-000025", 0, Batch(records=records[:3]))
    store.add_batch("s-000025", 0, Batch(records=records[3:]))
    store.add_batch("s-000025", 0, Batch(records=records[:2]))
    assert [r.step for r in store.metrics("s-000025")] == [1, 2, 3, 4, 5]
    capped = [e for e in store.events("s-000025") if e["kind"] == "metrics_capped"]
    assert len(capped) == 1 and "5 metric records kept" in capped[0]["message"]
    again = Store(tmp_path / "home")  # a new supervisor (attach) counts what is stored
    again.max_metric_records = 5
    again.add_batch("s-000025", 0, Batch(records=records[:1]))
    assert len(again.metrics("s-000025")) == 5
    assert len([e for e in again.events("s-000025") if e["kind"] == "metrics_capped"]) == 1


def test_a_node_left_starting_by_a_failed_start_is_closed_when_the_attempt_ends(tmp_path):
    store = Store(tmp_path / "home")
    store.create_job(_plan("s-000026"), {})
    store.transition("s-000026", LAUNCHING, attempt=0)
    store.set_node("s-000026", 0, 0, state="STARTING")
    store.set_node("s-000026", 0, 1, state="STARTING")
    store.transition("s-000026", RUNNING)
    store.transition("s-000026", LAUNCHING, attempt=1)  # a restart: attempt 0 is over
    store.set_node("s-000026", 1, 0, state="STARTING")
    assert [(n.attempt, n.state) for n in store.nodes("s-000026")] == [(0, "NOT_STARTED"), (0, "NOT_STARTED"),
                                                                              (1, "STARTING")]
    store.transition("s-000026", FAILED, reason="could not start")
    assert {n.state for n in store.nodes("s-000026")} == {"NOT_STARTED"}
    assert all(n.ended_at is not None for n in store.nodes("s-000026"))


# ---- metrics export and report --out

def test_a_bare_cr_or_leading_space_does_not_hide_a_formula_in_csv():
    out = io.StringIO()
    record = MetricRecord(rank=0, node=0, step=1, samples=8, extra={"a": "x\r=HYPERLINK(\"http://e\")", "b": " =1+1",
                                                                     "c": "\r@SUM(A1)"})
    write_csv([record], out)
    row = next(csv.DictReader(io.StringIO(out.getvalue())))
    assert row["a"] == 'x\\r=HYPERLINK("http://e")' and row["b"] == "' =1+1" and row["c"] == "\\r@SUM(A1)"
    assert "\r" not in out.getvalue()


def test_report_out_through_a_symlink_is_refused(home, tmp_path, capsys):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (tmp_path / "r.html").symlink_to(victim)
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "s-000024", "--out", str(tmp_path / "r.html")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and "is a symbolic link; give the file itself" in err and "Traceback" not in err
    assert victim.read_text() == "keep me"


def test_report_out_of_an_unknown_user_is_a_clear_error(home, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["report", "s-000024", "--out", "~no-such-user-24/r.html"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "there is no user 'no-such-user-24'" in err and "Traceback" not in err


def test_report_out_to_a_regular_file_is_written(home, tmp_path, capsys):
    target = tmp_path / "r.html"
    target.write_text("x" * 100_000)
    main(["report", "s-000024", "--out", str(target)])
    assert target.read_text().startswith("<!DOCTYPE html>") or "<html" in target.read_text()[:200]


def test_a_node_log_is_capped_with_one_marker_line_and_one_event(tmp_path):
    from launcher.store.logcap import CappedLog

    store = Store(tmp_path / "home")
    store.create_job(_plan("s-000027"), {})
    path = tmp_path / "attempt0-node1.log"
    with CappedLog(path, 1, lambda *event: store.add_event("s-000027", *event), max_bytes=100) as log:
        for index in range(50):
            log.write(f"1700000000.000 [1/0] line {index:02d}\n")  # 30 bytes a line
    kept = path.read_text().splitlines()
    assert kept[:3] == [f"1700000000.000 [1/0] line {i:02d}" for i in range(3)] and len(kept) == 4
    assert kept[3].endswith("[1] launch: node 1: its log reached 100 bytes, the most launch keeps for a node; "
                            "later lines are not kept")
    assert [e["kind"] for e in store.events("s-000027")] == ["log_capped"]
    with CappedLog(path, 1, lambda *event: store.add_event("s-000027", *event), max_bytes=100) as log:  # a resumed relay finds it full
        assert log.write("more\n") == 0
    assert len(path.read_text().splitlines()) == 4
