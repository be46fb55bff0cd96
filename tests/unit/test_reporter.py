"""The in-rank reporter: one marked record every N steps, nothing in between."""

from __future__ import annotations

import io

from launcher.metrics.reporter import MARKER, Reporter, parse_record


def test_records_every_n_steps_with_interval_figures(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LAUNCH_NODE", "1")
    monkeypatch.setenv("LAUNCH_JOB_ID", "j-1")
    out = io.StringIO()
    reporter = Reporter(every=4, flops_per_sample=1e6, stream=out)
    for step in range(10):
        reporter.step(samples=8, tokens=8 * 128, loss=1.0 / (step + 1))
        if step == 2:
            assert out.getvalue() == "", "no output before a reporting step"
    reporter.close(loss=0.1)
    records = [parse_record(line) for line in out.getvalue().splitlines()]
    assert all(line.startswith(MARKER) for line in out.getvalue().splitlines())
    assert [r["step"] for r in records] == [4, 8, 10]
    assert [r["steps"] for r in records] == [4, 4, 2]
    assert [r["warmup"] for r in records] == [True, False, False]
    first = records[0]
    assert first["rank"] == 3 and first["node"] == 1 and first["job"] == "j-1"
    assert first["samples"] == 32 and first["tokens"] == 32 * 128 and first["loss"] == 0.25
    assert first["samples_per_sec"] > 0 and first["step_time_s"] > 0 and first["mem_peak_bytes"] > 0
    assert first["flops_per_sample"] == 1e6


def test_resume_counts_from_the_checkpoint_step():
    out = io.StringIO()
    reporter = Reporter(every=2, stream=out)
    reporter.resume_at(6)
    reporter.step(samples=1)
    reporter.step(samples=1)
    assert parse_record(out.getvalue())["step"] == 8


def test_metrics_off_writes_nothing(monkeypatch):
    monkeypatch.setenv("LAUNCH_METRICS", "0")
    out = io.StringIO()
    reporter = Reporter(every=1, stream=out)
    reporter.step(samples=1)
    reporter.close()
    assert out.getvalue() == ""


def test_ordinary_lines_are_not_records():
    assert parse_record("step 10 loss 0.5") is None
    assert parse_record(MARKER + "{not json") is None
    assert parse_record(MARKER + '{"v": 99}') is None
    assert parse_record("rank 2 partial line" + MARKER + '{"v": 1, "step": 3}') == {"v": 1, "step": 3}
