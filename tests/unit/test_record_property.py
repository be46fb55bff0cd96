"""Property: whatever a rank prints, parsing never raises, and every accepted record goes through every reader.

Lines are arbitrary text, marked lines carrying arbitrary JSON (huge integers, NaN and
Infinity tokens, nesting, unicode) and marked record-like objects whose values are
sometimes valid and sometimes not. Accepted records are stored, read back, summarised,
compared, rendered and exported, with strict JSON (no NaN) at every output.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rich.console import Console

from launcher.backends import cluster_spec, plan_job
from launcher.metrics.aggregate import summarize
from launcher.metrics.export import write_csv
from launcher.metrics.record import MARKER, MetricRecord, Rejected, parse_line
from launcher.metrics.summary import JobSummary
from launcher.spec import JobSpec
from launcher.store.db import Store
from launcher.store.records import Batch
from launcher.views import compare, jobstatus
from launcher.views.report import build_report

WORLD = 4

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(2**90), max_value=2**90),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40), st.text(min_size=250, max_size=300),
)
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)
plausible = {
    "rank": st.integers(-1, WORLD), "step": st.integers(-1, 10**16), "node": st.integers(0, 3), "host": st.text(max_size=5),
    "job": st.text(max_size=5), "local_rank": st.integers(0, 8), "t": st.floats(0, 2e9), "steps": st.integers(0, 100),
    "interval_s": st.floats(0, 100), "step_time_s": st.floats(0, 10), "samples": st.integers(0, 10**6),
    "tokens": st.integers(0, 10**9), "samples_per_sec": st.floats(0, 1e6), "tokens_per_sec": st.floats(0, 1e9),
    "loss": st.floats(-1e6, 1e6), "mem_peak_bytes": st.integers(0, 2**40), "warmup": st.booleans(),
    "flops_per_sample": st.floats(1, 1e15), "gpu_name": st.text(max_size=20), "gpu_util": st.floats(0, 1),
}
extra_keys = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True).filter(lambda k: k not in plausible)
record_like = st.fixed_dictionaries(
    {"v": st.sampled_from([1, 1, 1, 1, 2, "1", None]), "rank": plausible["rank"] | json_values,
     "step": plausible["step"] | json_values},
    optional={
        **{name: strategy | json_values for name, strategy in plausible.items() if name not in ("rank", "step")},
        "extra_a": st.floats(allow_nan=True) | st.text(max_size=10) | json_values,
    },
).flatmap(lambda record: st.dictionaries(extra_keys, scalars, max_size=18).map(lambda extra: {**extra, **record}))

valid_record = st.fixed_dictionaries(
    {"v": st.just(1), "rank": st.integers(0, WORLD - 1), "step": st.integers(0, 10**15)},
    optional={name: strategy for name, strategy in plausible.items() if name not in ("rank", "step")},
).flatmap(lambda record: st.dictionaries(
    extra_keys, st.floats(-1e9, 1e9) | st.integers(-(2**63) + 1, 2**63 - 1) | st.text(max_size=30) | st.booleans(),
    max_size=5,
).map(lambda extra: {**extra, **record}))


STREAMS = ["[0]: ", "[1]: ", "[3]: ", "[4]: ", "[12]: ", ""]  # the ranks' streams as they reach the supervisor, and no stream


def _marked(payload: str) -> st.SearchStrategy[str]:
    return (st.sampled_from(STREAMS) | st.text(max_size=10)).map(lambda prefix: prefix + MARKER + payload)


def _on_its_stream(record: dict) -> str:
    return f"[{record['rank']}]: {MARKER}{json.dumps(record)}"


lines = st.one_of(
    st.text(max_size=200),
    st.text(max_size=200).map(lambda t: MARKER + t),
    json_values.map(lambda v: json.dumps(v)).flatmap(_marked),
    record_like.map(lambda r: json.dumps(r)).flatmap(_marked),
    valid_record.map(lambda r: json.dumps(r)).flatmap(_marked),
    valid_record.map(_on_its_stream),
    record_like.map(lambda r: json.dumps(r).replace("1", "NaN", 1)).flatmap(_marked),
    record_like.map(lambda r: json.dumps(r)[:-1] + ', "z": ' + "[" * 300 + "]" * 300 + "}").flatmap(_marked),
)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    store = Store(tmp_path_factory.mktemp("property") / "home")
    yield store
    store.close()


@pytest.fixture(scope="module")
def plan():
    spec = JobSpec(name="prop", entrypoint=["python", "t.py"], batch={"micro_batch": 1}, resources={"nproc_per_node": WORLD})
    return plan_job(spec, cluster_spec(name="local"), "prop-000000", rdzv_port=29500)


def _finite_numbers(record: MetricRecord) -> bool:
    values = [getattr(record, f.name) for f in dataclasses.fields(record) if f.name != "extra"] + list(record.extra.values())
    return all(math.isfinite(v) for v in values if isinstance(v, float))


def _rendered(*renderables) -> str:
    out = io.StringIO()
    console = Console(file=out, width=200)
    for renderable in renderables:
        console.print(renderable)
    return out.getvalue()


_ids = itertools.count(1)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(lines, min_size=1, max_size=6))
def test_any_rank_output_parses_without_error_and_accepted_records_pass_every_reader(store, plan, text_lines):
    results = [parse_line(line, world_size=WORLD, node=1, host="node-1") for line in text_lines]
    assert all(r is None or isinstance(r, (MetricRecord, Rejected)) for r in results)
    assert all("\n" not in r.reason for r in results if isinstance(r, Rejected))
    records = [r for r in results if isinstance(r, MetricRecord)]
    event(f"records accepted: {min(len(records), 3)}{'+' if len(records) > 3 else ''}")
    for line, result in zip(text_lines, results, strict=True):
        if isinstance(result, MetricRecord):
            assert line.startswith(f"[{result.rank}]: {MARKER}"), "a record is a whole line, filed as the rank of its stream"
    for record in records:
        assert _finite_numbers(record) and 0 <= record.rank < WORLD and (record.node, record.host) == (1, "node-1")
        json.dumps(record.to_wire(), allow_nan=False)

    job_id = f"prop-{next(_ids):06d}"
    store.create_job(plan.model_copy(update={"job_id": job_id}), {})
    store.add_batch(job_id, 0, Batch(records=records))
    stored = store.metrics(job_id)
    assert stored == [dataclasses.replace(r, job=job_id) for r in records]

    job = store.job(job_id)
    summary = summarize(stored, store.samples(job_id))
    assert JobSummary.from_stored(json.loads(json.dumps(summary.as_json(), allow_nan=False))) == summary
    figures = compare.job_metrics(job, stored)
    rows = compare.comparison([(job, figures)])
    status = jobstatus.JobStatus(job, summary, nodes=tuple(store.nodes(job_id)))
    obj = jobstatus.job_object(status)
    for data in (figures, rows, obj):
        json.dumps(data, allow_nan=False)
    _rendered(compare.comparison_table(rows), *compare.metrics_renderables(job, figures),
              jobstatus.jobs_table([status]), *jobstatus.job_detail(status))
    out = io.StringIO()
    assert write_csv(stored, out) == len(stored)
    assert "<html" in build_report([(job, stored)])


def test_csv_cells_a_rank_wrote_never_start_a_spreadsheet_formula() -> None:
    line = MARKER + " " + json.dumps({"v": 1, "rank": 0, "step": 1, "samples": 8, "loss": -0.5,
                                      "gpu_name": "=HYPERLINK(\"http://x\",\"y\")", "note": "@SUM(A1)", "delta": -3})
    record = parse_line(line, world_size=1, node=0, host="h", rank=0)
    assert isinstance(record, MetricRecord)
    out = io.StringIO()
    write_csv([record], out)
    [row] = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert row["gpu_name"] == "'=HYPERLINK(\"http://x\",\"y\")" and row["note"] == "'@SUM(A1)"
    assert row["loss"] == "-0.5" and row["delta"] == "-3", "numbers stay numbers"
