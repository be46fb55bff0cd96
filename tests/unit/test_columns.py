"""One place declares the metric figures: a column registered there shows up in every output.

The records go the real way (Reporter -> marked line -> parse_line -> store), the
outputs are the real commands (run in-process, so that the test's registration holds).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json

import pytest

from launcher.backends import cluster_spec, plan_job
from launcher.cli.main import main
from launcher.metrics import columns
from launcher.metrics.aggregate import summarize
from launcher.metrics.columns import Column, maximum, number
from launcher.metrics.record import MetricRecord, parse_line
from launcher.metrics.reporter import Reporter
from launcher.metrics.summary import JobSummary, RankSummary
from launcher.spec import JobSpec
from launcher.store.db import LAUNCHING, RUNNING, SUCCEEDED, Store
from launcher.store.records import Batch

TEST_COLUMN = Column("test_metric", job=maximum("test_metric"), rank=maximum("test_metric"), header="TEST METRIC",
                     cell=number(".2f"))


def test_every_built_in_figure_is_a_column_and_a_typed_field():
    fields = {f.name for f in dataclasses.fields(JobSummary)} - {"steps", "records", "per_rank", "more"}
    assert {c.name for c in columns.COLUMNS} == fields
    rank_fields = {f.name for f in dataclasses.fields(RankSummary)} - {"rank", "node", "host", "steps", "more"}
    assert {c.name for c in columns.rank_columns()} == rank_fields


def _run(capsys, *argv: str) -> str:
    main(list(argv))
    return capsys.readouterr().out


@pytest.fixture
def job_with_test_metric(home, monkeypatch):
    """A RUNNING job whose two ranks report ``test_metric`` (2.5 and 3.5) through the Reporter."""
    monkeypatch.setattr(columns, "COLUMNS", (*columns.COLUMNS, TEST_COLUMN))
    spec = JobSpec(name="cols", entrypoint=["python", "t.py"], batch={"micro_batch": 2}, resources={"nproc_per_node": 2})
    plan = plan_job(spec, cluster_spec(name="local"), "cols-0001", rdzv_port=29500)
    store = Store()
    store.create_job(plan, {})
    store.transition(plan.job_id, LAUNCHING)
    store.transition(plan.job_id, RUNNING)
    for rank, value in ((0, 2.5), (1, 3.5)):
        monkeypatch.setenv("RANK", str(rank))
        out = io.StringIO()
        reporter = Reporter(every=1, stream=out, extra={"test_metric": value})
        for _ in range(3):
            reporter.step(samples=4)
        records = [parse_line(line, world_size=2, node=0, host="localhost", rank=rank) for line in out.getvalue().splitlines()]
        assert all(isinstance(r, MetricRecord) for r in records)
        store.add_batch(plan.job_id, 0, Batch(records=records))
    return store, plan.job_id


def test_a_registered_column_shows_up_in_every_output(job_with_test_metric, capsys, tmp_path):
    store, job_id = job_with_test_metric

    detail = json.loads(_run(capsys, "status", job_id, "--json"))
    assert detail["metrics"]["test_metric"] == 3.5
    assert [r["test_metric"] for r in detail["metrics"]["per_rank"]] == [2.5, 3.5]
    listed = json.loads(_run(capsys, "status", "--json"))
    assert listed[0]["metrics"]["test_metric"] == 3.5

    figures = json.loads(_run(capsys, "metrics", job_id, "--json"))
    assert figures["test_metric"] == 3.5 and figures["per_rank"][0]["test_metric"] == 2.5
    assert "test_metric" in _run(capsys, "metrics", job_id) and "3.50" in _run(capsys, "metrics", job_id)

    rows = list(csv.DictReader(io.StringIO(_run(capsys, "metrics", job_id, "--csv"))))
    assert {r["test_metric"] for r in rows} == {"2.5", "3.5"}

    [row] = json.loads(_run(capsys, "compare", job_id, "--json"))
    assert row["test_metric"] == 3.5
    table = _run(capsys, "compare", job_id)
    assert "TEST METRIC" in table and "3.50" in table

    _run(capsys, "report", job_id, "--out", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert "<th class=\"\">TEST METRIC</th>" in page and "<td class=\"\">3.50</td>" in page

    summary = summarize(store.metrics(job_id), store.samples(job_id))
    assert store.transition(job_id, SUCCEEDED, summary=summary)
    stored = json.loads(_run(capsys, "status", job_id, "--json"))
    assert stored["metrics"]["test_metric"] == 3.5, "read back from the stored summary"


def test_without_the_registration_the_key_is_only_a_raw_extra(job_with_test_metric, capsys, monkeypatch):
    _, job_id = job_with_test_metric
    monkeypatch.setattr(columns, "COLUMNS", tuple(c for c in columns.COLUMNS if c is not TEST_COLUMN))
    assert "test_metric" not in json.loads(_run(capsys, "status", job_id, "--json"))["metrics"]
    assert "test_metric" in _run(capsys, "metrics", job_id, "--csv").splitlines()[0]


def test_records_without_their_interval_show_samples_per_second_as_unknown_not_8e9(home, capsys):
    """Issue 39 (Low): records with ``samples 8, step_time_s 0.1`` and no ``interval_s`` were divided by 1e-9 s."""
    spec = JobSpec(name="rate", entrypoint=["python", "t.py"], batch={"micro_batch": 8}, resources={"nproc_per_node": 1})
    plan = plan_job(spec, cluster_spec(name="local"), "rate-0001", rdzv_port=29500)
    store = Store()
    store.create_job(plan, {})
    store.transition(plan.job_id, LAUNCHING)
    store.transition(plan.job_id, RUNNING)
    lines = [f'@@launch {{"v": 1, "rank": 0, "step": {step}, "samples": 8, "step_time_s": 0.1}}' for step in (1, 2, 3)]
    records = [parse_line(line, world_size=1, node=0, host="localhost", rank=0) for line in lines]
    assert all(isinstance(r, MetricRecord) for r in records), records
    store.add_batch(plan.job_id, 0, Batch(records=records))
    figures = json.loads(_run(capsys, "metrics", plan.job_id, "--json"))
    assert figures["per_rank"][0]["samples_per_sec"] is None
    assert (figures["samples_per_sec"] or 0) < 1000
