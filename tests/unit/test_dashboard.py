"""`launch dashboard`'s server through Starlette's TestClient: the token, escaping, masked secrets, and log
streams that resume after a cut at the last line seen (no line lost or doubled)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the dashboard extra (launch[dashboard]) is part of launch[dev]")
from starlette.testclient import TestClient  # noqa: E402

from launcher.backends import cluster_spec, plan_job  # noqa: E402
from launcher.dashboard import stream  # noqa: E402
from launcher.dashboard.app import create_app, is_loopback  # noqa: E402
from launcher.spec import JobSpec  # noqa: E402
from launcher.store.db import LAUNCHING, RUNNING, SUCCEEDED, Store  # noqa: E402
from launcher.views.logs import LogQuery  # noqa: E402

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def make_job(home: Path, job_id: str = "dash-00000001", env: dict[str, str] | None = None,
             lines: tuple[list[str], ...] = ([], [])) -> Store:
    store = Store(home)
    spec = JobSpec(name="dash", entrypoint=["python", "t.py"], env=env or {}, batch={"micro_batch": 2})
    store.create_job(plan_job(spec, cluster_spec(name="local"), job_id, rdzv_port=29500), {})
    for node, text in enumerate(lines):
        path = store.run_dir(job_id) / f"attempt0-node{node}.log"
        path.write_text("".join(f"{line}\n" for line in text), encoding="utf-8")
        store.set_node(job_id, 0, node, host=f"h{node}", state="RUNNING", log_path=str(path))
    return store


def run(store: Store, job_id: str = "dash-00000001") -> None:
    assert store.transition(job_id, LAUNCHING) and store.transition(job_id, RUNNING)


def events(body: str) -> list[dict]:
    """The SSE events of a response body: {"id", "event", "data"} each."""
    out = []
    for block in body.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        out.append({"id": fields.get("id"), "event": fields.get("event"), "data": json.loads(fields["data"])})
    return out


def test_loopback_binds_need_no_token_and_others_do():
    assert all(map(is_loopback, ["127.0.0.1", "localhost", "::1", "127.0.0.2"]))
    assert not any(map(is_loopback, ["0.0.0.0", "10.1.2.3", "::", "gpu-head"]))


def test_a_request_without_the_token_is_refused(home):
    make_job(home)
    client = TestClient(create_app(Store(home, read_only=True), token="s3cret-token"))
    for path in ["/", "/jobs/dash-00000001", "/api/jobs", "/api/jobs/dash-00000001/logs", "/static/dashboard.js"]:
        assert client.get(path).status_code == 403, path
        assert client.get(path, params={"token": "wrong"}).status_code == 403, path
    assert client.get("/api/jobs", params={"token": "s3cret-token"}).json()[0]["id"] == "dash-00000001"
    assert client.get("/api/jobs", headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
    page = client.get("/", params={"token": "s3cret-token"}).text
    assert 'data-token="s3cret-token"' in page and "/static/dashboard.js?token=s3cret-token" in page


def test_the_job_page_escapes_what_a_job_said_and_masks_secrets(home):
    store = make_job(home, env={"MY_PASSWORD": "hunter2-value", "EVIL": HOSTILE})
    run(store)
    store.update_job("dash-00000001", reason=HOSTILE, first_failure={"rank": 0, "line": HOSTILE})
    store.add_event("dash-00000001", "node_lost", HOSTILE)
    page = TestClient(create_app(Store(home, read_only=True))).get("/jobs/dash-00000001")
    assert page.status_code == 200
    assert "<script>alert" not in page.text and "<img src=x" not in page.text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page.text
    assert "hunter2-value" not in page.text and "MY_PASSWORD</td><td>****" in page.text
    assert "innerHTML" not in (Path(stream.__file__).parent / "static" / "dashboard.js").read_text()


def test_the_jobs_list_and_compare_show_the_store(home):
    make_job(home, "dash-00000001")
    make_job(home, "dash-00000002")
    client = TestClient(create_app(Store(home, read_only=True)))
    assert [j["id"] for j in client.get("/api/jobs").json()] == ["dash-00000002", "dash-00000001"]
    compare = client.get("/compare", params={"jobs": "dash-00000001,dash-00000002"})
    assert compare.status_code == 200 and compare.text.count("<tr><td>dash") == 2
    assert client.get("/jobs/nope").status_code == 404


def test_a_read_only_store_never_writes(home):
    make_job(home)
    reader = Store(home, read_only=True)
    with pytest.raises(Exception, match="readonly|read-only"):
        reader.update_job("dash-00000001", reason="x")


def test_a_finished_job_streams_its_lines_once_and_resumes_after_the_last_id(home):
    store = make_job(home, lines=([f"[0/0] step {i}" for i in range(3)], [f"[1/1] step {i}" for i in range(2)]))
    run(store)
    assert store.transition("dash-00000001", SUCCEEDED)
    client = TestClient(create_app(Store(home, read_only=True)))
    first = events(client.get("/api/jobs/dash-00000001/logs").text)
    assert first[0]["event"] == "lines" and sorted(first[0]["data"]) == sorted(
        [f"[0/0] step {i}" for i in range(3)] + [f"[1/1] step {i}" for i in range(2)])
    assert first[-1] == {"id": None, "event": "end", "data": {"state": "SUCCEEDED"}}
    again = events(client.get("/api/jobs/dash-00000001/logs", headers={"Last-Event-ID": first[0]["id"]}).text)
    assert [e["event"] for e in again] == ["end"]  # nothing sent twice
    rank = events(client.get("/api/jobs/dash-00000001/logs", params={"rank": "1", "pattern": "step [1-9]"}).text)
    assert rank[0]["data"] == ["[1/1] step 1"]


def test_a_live_stream_cut_anywhere_resumes_with_no_line_lost_or_doubled(home):
    """The job writes lines (the last one half-written each time) while the stream is read; the stream is cut after
    each event and resumed from that event's id: the lines seen, in order, are the complete lines written."""
    store = make_job(home, lines=(["[0/0] step 0"], []))
    run(store)
    log = store.run_dir("dash-00000001") / "attempt0-node0.log"
    writes = iter(range(1, 7))

    async def job_writes(_s: float) -> None:
        step = next(writes, None)
        if step is None:
            store.transition("dash-00000001", SUCCEEDED)
            return
        with log.open("a", encoding="utf-8") as out:  # completes the half line written before, leaves one
            out.write(("" if step == 1 else f" {step - 1}\n") + f"[0/0] step {step}\n[0/0] half")

    async def read_all() -> list[str]:
        reader, seen, last_id = Store(home, read_only=True), [], None
        while True:
            agen = stream.log_events(reader, "dash-00000001", LogQuery(), last_id, poll_s=0, sleep=job_writes)
            got = await agen.__anext__()
            await agen.aclose()  # the connection is cut after each event
            event = events(got)[0]
            if event["event"] == "end":
                return seen
            seen.extend(event["data"])
            last_id = event["id"]

    seen = asyncio.run(read_all())
    complete = log.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(complete) == 12 and seen == complete


def _report(store: Store, job_id: str = "dash-00000001", ranks: int = 2) -> None:
    from launcher.metrics.record import MetricRecord
    from launcher.store.records import Batch

    records = [MetricRecord(node=0, rank=rank, step=step, steps=2, interval_s=0.5, step_time_s=0.25, samples=16,
                            samples_per_sec=32.0, loss=1.0 / step, mem_peak_bytes=100 * 2**20)
               for step in (2, 4) for rank in range(ranks)]
    store.add_batch(job_id, 0, Batch(records=records))


def key(metric: str, /, **labels: str) -> str:
    """``name{a="1",b="2"}``, the labels sorted."""
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def metric_values(text: str) -> dict[str, float]:
    """``key(name, **labels)`` -> value of a Prometheus text exposition, as Prometheus' own parser reads it."""
    from prometheus_client.parser import text_string_to_metric_families

    return {key(sample.name, **sample.labels): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_metrics_exports_each_job_with_bounded_labels_and_ranks_only_when_asked(home):
    store = make_job(home)
    run(store)
    _report(store)
    client = TestClient(create_app(Store(home, read_only=True), user="ana"))
    scraped = client.get("/metrics")
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain; version=")
    values = metric_values(scraped.text)
    job = {"job_id": "dash-00000001", "user": "ana"}
    assert values[key("launch_job_samples_per_second", **job)] == 64.0  # two ranks at 32 a second
    assert values[key("launch_job_state", **job, state="RUNNING")] == 1
    assert values[key("launch_job_state", **job, state="FAILED")] == 0
    assert values[key("launch_job_step_time_seconds", **job, quantile="0.5")] == 0.25
    assert values[key("launch_job_peak_memory_bytes", **job)] == 100 * 2**20
    assert values[key("launch_job_step", **job)] == 4
    assert values[key("launch_job_info", **job, name="dash", cluster="local", backend="local", strategy="")] == 1
    assert not any(name.startswith("launch_rank_") for name in values)  # no per-rank series unless asked
    ranks = metric_values(client.get("/metrics", params={"ranks": "1"}).text)
    assert ranks[key("launch_rank_samples_per_second", **job, rank="1", node="0")] == 32.0


def test_a_job_shows_who_submitted_it_and_one_stored_before_that_was_recorded_the_stores_owner(home):
    store = make_job(home)  # stored without a user, as before launch recorded it
    spec = JobSpec(name="bos", entrypoint=["python", "t.py"])
    store.create_job(plan_job(spec, cluster_spec(name="local"), "dash-00000002", rdzv_port=29500), {}, user="bo")
    client = TestClient(create_app(Store(home, read_only=True), user="ana"))
    assert {j["id"]: j["user"] for j in client.get("/api/jobs").json()} == {"dash-00000001": "ana", "dash-00000002": "bo"}
    values = metric_values(client.get("/metrics").text)
    assert values[key("launch_job_state", job_id="dash-00000002", user="bo", state="PENDING")] == 1
    assert values[key("launch_job_state", job_id="dash-00000001", user="ana", state="PENDING")] == 1
    assert "<th>user</th>" in client.get("/").text


def test_metrics_counts_the_devices_each_job_of_each_user_holds():
    from prometheus_client import generate_latest
    from prometheus_client.core import CollectorRegistry

    from launcher.dashboard.exporter import lease_metrics
    from launcher.run.queue import NodeQueue

    holder = {"job": "job-a", "user": "ana", "from": "head", "since": 1.0}
    nodes = [NodeQueue(0, "n1", "gpu", [{"index": 0, "holder": holder}, {"index": 1, "holder": holder},
                                         {"index": 2, "holder": None}, {"index": 3, "holder": None,
                                                                        "foreign": [{"pid": 7}]}]),
             NodeQueue(1, "n2", "gpu", error="ssh: connection refused")]

    class Leases:
        def collect(self):
            return lease_metrics(nodes)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Leases())
    values = metric_values(generate_latest(registry).decode())
    assert values[key("launch_node_devices_held", node="n1", kind="gpu", job_id="job-a", user="ana")] == 2
    assert values[key("launch_node_devices", node="n1", kind="gpu")] == 4
    assert values[key("launch_node_devices_free", node="n1", kind="gpu")] == 1  # one used by a process not launch's
    assert values[key("launch_node_up", node="n2", kind="gpu")] == 0


def test_metrics_only_serves_metrics_alone_and_behind_the_token(home):
    make_job(home)
    client = TestClient(create_app(Store(home, read_only=True), token="t0ken", metrics_only=True))
    assert client.get("/metrics").status_code == 403
    assert client.get("/metrics", headers={"Authorization": "Bearer t0ken"}).status_code == 200
    assert client.get("/", params={"token": "t0ken"}).status_code == 404


def test_the_plots_of_a_job_of_many_ranks_are_its_ranks_min_mean_and_max(home):
    from launcher.dashboard import data
    from launcher.metrics.record import MetricRecord
    from launcher.store.records import Batch

    store = make_job(home)
    run(store)
    _report(store, ranks=2)
    assert set(data.series(Store(home, read_only=True), "dash-00000001")["ranks"]) == {"0", "1"}
    store.add_batch("dash-00000001", 0, Batch(records=[
        MetricRecord(rank=rank, step=6, samples_per_sec=float(rank), step_time_s=0.1) for rank in range(data.RANKS_PLOTTED + 1)]))
    ranks = data.series(Store(home, read_only=True), "dash-00000001")["ranks"]
    assert set(ranks) == {"min", "mean", "max"} and ranks["max"]["step"] == [2, 4, 6]
    assert ranks["min"]["samples_per_sec"][-1] == 0.0 and ranks["max"]["samples_per_sec"][-1] == data.RANKS_PLOTTED
    assert ranks["mean"]["samples_per_sec"][0] == 32.0


def test_the_plots_read_records_stored_before_their_figures_had_columns_from_their_json(home):
    from launcher.dashboard import data
    from launcher.metrics.record import MetricRecord
    from launcher.store.records import Batch

    store = make_job(home)
    run(store)
    store.add_batch("dash-00000001", 0, Batch(records=[
        MetricRecord(rank=0, step=1, samples_per_sec=9.0, warmup=True),  # a warm-up step is not plotted
        MetricRecord(rank=0, step=2, samples_per_sec=8.0, step_time_s=0.5, loss=float("nan"), mem_peak_bytes=2**20)]))
    for record in ('{"v":1,"rank":1,"step":2,"samples_per_sec":6.0,"step_time_s":0.25,"loss":0.5}',  # schema 6's rows
                   '{"v":1,"rank":1,"step":1,"samples_per_sec":7.0,"warmup":true}', "not json"):
        store._execute("INSERT INTO metrics (job_id, attempt, node, rank, step, record) VALUES ('dash-00000001', 0, 0, 1, 0, ?)",
                       (record,))
    assert store.metric_points("dash-00000001", 0, data.SERIES) == [(0, 2, [8.0, 0.5, None, 2.0**20]), (1, 0, [6.0, 0.25, 0.5, None])]
    spread = dict(store.metric_spread("dash-00000001", 0, data.SERIES))
    assert spread[2] == [8.0, 8.0, 8.0, 0.5, 0.5, 0.5, None, None, None, 2.0**20, 2.0**20, 2.0**20]
    assert spread[0][:3] == [6.0, 6.0, 6.0] and set(spread) == {0, 2}
