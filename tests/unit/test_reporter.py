"""The in-rank reporter: one marked record every N steps, nothing in between, each a valid MetricRecord."""

from __future__ import annotations

import io
import json
import math

import pytest

from launcher.metrics.record import MARKER, MetricRecord, parse_line
from launcher.metrics.reporter import Reporter

# The keys of a version 1 record as the Reporter has always written them (the wire format).
V1_KEYS = {
    "v", "job", "node", "rank", "local_rank", "host", "step", "t", "steps", "interval_s", "step_time_s", "samples",
    "tokens", "samples_per_sec", "tokens_per_sec", "loss", "mem_peak_bytes", "warmup", "flops_per_sample", "gpu_name",
    "gpu_util",
}


def _lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


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
    assert all(line.startswith(MARKER) for line in _lines(out))
    wire = [json.loads(line[len(MARKER):]) for line in _lines(out)]
    assert all(set(record) == V1_KEYS for record in wire), "version 1 keeps today's keys exactly"
    first = wire[0]
    assert first["v"] == 1 and first["rank"] == 3 and first["node"] == 1 and first["job"] == "j-1"
    records = [parse_line(line, world_size=4, node=1, host="h1", rank=3) for line in _lines(out)]
    assert all(isinstance(r, MetricRecord) for r in records), records
    assert [r.step for r in records] == [4, 8, 10]
    assert [r.steps for r in records] == [4, 4, 2]
    assert [r.warmup for r in records] == [True, False, False]
    assert records[0].samples == 32 and records[0].tokens == 32 * 128 and records[0].loss == 0.25
    assert records[0].samples_per_sec > 0 and records[0].step_time_s > 0 and records[0].mem_peak_bytes > 0
    assert records[0].flops_per_sample == 1e6


def test_resume_counts_from_the_checkpoint_step():
    out = io.StringIO()
    reporter = Reporter(every=2, stream=out)
    reporter.resume_at(6)
    reporter.step(samples=1)
    reporter.step(samples=1)
    assert parse_line(out.getvalue(), world_size=1, node=0, host="h", rank=0).step == 8


def test_metrics_off_writes_nothing(monkeypatch):
    monkeypatch.setenv("LAUNCH_METRICS", "0")
    out = io.StringIO()
    reporter = Reporter(every=1, stream=out)
    reporter.step(samples=1)
    reporter.close()
    assert out.getvalue() == ""


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), -float("inf")])
def test_a_diverged_loss_is_written_as_unknown_not_as_invalid_json(loss):
    out = io.StringIO()
    reporter = Reporter(every=1, stream=out)
    reporter.step(samples=4, loss=loss)
    line = out.getvalue().strip()
    assert "NaN" not in line and "Infinity" not in line
    record = parse_line(line, world_size=1, node=0, host="h", rank=0)
    assert isinstance(record, MetricRecord) and record.loss is None and record.samples == 4


def test_extra_keys_travel_with_the_record_and_bad_ones_fail_in_the_program():
    out = io.StringIO()
    reporter = Reporter(every=1, stream=out, extra={"allreduce_busbw_gbps": 12.5, "allreduce_mb": 16})
    reporter.step(samples=0)
    record = parse_line(out.getvalue(), world_size=1, node=0, host="h", rank=0)
    assert record.extra == {"allreduce_busbw_gbps": 12.5, "allreduce_mb": 16}
    with pytest.raises(ValueError, match="'nested': a program-added value must be"):
        Reporter(extra={"nested": {"a": 1}})
    with pytest.raises(ValueError, match="record fields"):
        Reporter(extra={"loss": 1.0})
    with pytest.raises(ValueError, match="flops_per_sample"):
        Reporter(flops_per_sample=math.inf)
