"""The trackers' mirror (``tracking:``) with a recording tracker: steps sent once every rank reported them, a failing
tracker filed as the job's event and sent the same again, a second supervisor resuming the run with nothing sent
twice, and no secret among the parameters. The real MLflow server and W&B files: tests/integration/test_mlflow_wandb.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launcher.backends import cluster_spec, plan_job
from launcher.metrics.record import MetricRecord
from launcher.run.tracking import Cursor, Mirror, RunInfo, Step, make_mirror, ready_steps, run_info
from launcher.spec import JobSpec
from launcher.spec.tracking import TrackingSpec
from launcher.store.db import Store
from launcher.store.records import Batch
from launcher.store.states import JobState


def rec(rank: int, step: int) -> MetricRecord:
    return MetricRecord(rank=rank, step=step, t=1000.0 + step, samples_per_sec=10.0, step_time_s=0.1 * (rank + 1),
                        loss=1.0 + rank)


def test_a_step_waits_for_every_rank_and_its_figures_combine_them():
    rows = [(1, rec(0, 1)), (2, rec(1, 1)), (3, rec(0, 2))]
    steps, through = ready_steps(rows, Cursor(), ranks=2, final=False, per_rank=True)
    assert [s.step for s in steps] == [1] and through == 2  # step 2 waits for rank 1: read again from row 3
    figures = steps[0].metrics
    assert figures["samples_per_sec"] == 20.0 and figures["step_time_s"] == 0.2 and figures["loss"] == 1.5
    assert figures["rank_1/step_time_s"] == 0.2
    steps, through = ready_steps(rows, Cursor(), ranks=2, final=True, per_rank=False)
    assert [s.step for s in steps] == [1, 2] and through == 3 and "rank_0/loss" not in steps[0].metrics
    # a rank that never reports stops counting once four steps are waiting
    lone = [(i, rec(0, i)) for i in range(1, 6)]
    assert [s.step for s in ready_steps(lone, Cursor(), ranks=2, final=False, per_rank=False)[0]] == [1, 2, 3, 4, 5]
    assert ready_steps(lone[:2], Cursor(), ranks=2, final=False, per_rank=False)[0] == []


def test_the_parameters_hold_no_secret():
    spec = JobSpec(name="t", entrypoint=["python", "t.py"], env={"HF_TOKEN": "hf_abcdefgh123", "MODE": "fast",
                                                                   "URL": "http://x/?k=sekrit-value-1"},
                   secrets=["WANDB_API_KEY"])
    plan = plan_job(spec, cluster_spec(name="local"), "t-00000001", rdzv_port=29500)
    info = run_info("t", "t-00000001", spec.model_dump(mode="json", exclude_none=True), plan,
                    {"WANDB_API_KEY": "sekrit-value-1"})
    assert info.params["spec.env.MODE"] == "fast" and info.params["spec.env.HF_TOKEN"] == "****"
    assert "sekrit-value-1" not in str(info.params) and info.params["plan.world_size"] == "1"
    assert info.tags["launch.job_id"] == "t-00000001" and info.tags["launch.cluster"] == "local"


class Recording:
    """A tracker that keeps what it took, and fails while ``failing`` says so."""

    name = "rec"

    def __init__(self, runs: dict[str, dict[str, Any]]) -> None:
        self.runs, self.run_id, self.failing = runs, None, 0

    def _check(self) -> None:
        if self.failing:
            self.failing -= 1
            raise ConnectionError("tracker unreachable")

    def open(self, run_id: str | None, info: RunInfo) -> str:
        self._check()
        self.run_id = run_id or f"run{len(self.runs)}"
        self.runs.setdefault(self.run_id, {"params": info.params, "steps": [], "events": [], "closed": None})
        return self.run_id

    def steps(self, steps: list[Step]) -> None:
        self._check()
        self.runs[self.run_id]["steps"] += [(s.attempt, s.step, s.metrics["samples_per_sec"]) for s in steps]

    def events(self, events: list[tuple[int, dict[str, Any]]]) -> None:
        self.runs[self.run_id]["events"] += [e["kind"] for _, e in events]

    def tags(self, tags: dict[str, str]) -> None:
        pass

    def close(self, summary: dict[str, float], state: JobState) -> None:
        self._check()
        self.runs[self.run_id]["closed"] = str(state)


def test_a_failing_tracker_is_an_event_and_a_retry_and_an_attach_resumes_the_run(home: Path):
    store = Store(home)
    spec = JobSpec(name="t", entrypoint=["python", "t.py"], resources={"nodes": 1, "nproc_per_node": 2})
    plan = plan_job(spec, cluster_spec(name="local"), "t-00000001", rdzv_port=29500)
    store.create_job(plan, {})
    runs: dict[str, dict[str, Any]] = {}
    first = Recording(runs)

    def mirror(tracker: Recording) -> Mirror:
        return make_mirror(store, TrackingSpec(), spec.model_dump(mode="json"), plan, {}, lambda _s, _d: [tracker])

    one = mirror(first)
    one.start()
    one.stop()  # syncs by hand below
    store.add_batch("t-00000001", 0, Batch(records=[rec(0, 1), rec(1, 1), rec(0, 2)]))
    first.failing = 1
    assert not one._sync(first, final=False)
    assert [e["kind"] for e in store.events("t-00000001")] == ["tracking_failed"]
    assert "rec: ConnectionError: tracker unreachable" in store.events("t-00000001")[0]["message"]
    assert one._sync(first, final=False) and runs["run0"]["steps"] == [(0, 1, 20.0)]
    store.add_batch("t-00000001", 0, Batch(records=[rec(1, 2), rec(0, 3)]))
    assert one._sync(first, final=False) and runs["run0"]["steps"] == [(0, 1, 20.0), (0, 2, 20.0)]

    # the supervisor is gone; `launch attach` starts another, which resumes run0 from the cursor
    second = Recording(runs)
    two = mirror(second)
    two.start()
    two.stop()
    store.add_batch("t-00000001", 0, Batch(records=[rec(1, 3)]))
    store.add_batch("t-00000001", 1, Batch(records=[rec(0, 1), rec(1, 1)]))
    store.add_event("t-00000001", "restarting", "attempt 1")
    two.close(JobState.SUCCEEDED)
    assert list(runs) == ["run0"] and second.run_id == "run0"
    assert runs["run0"]["steps"] == [(0, 1, 20.0), (0, 2, 20.0), (0, 3, 20.0), (1, 1, 20.0)]
    assert runs["run0"]["events"] == ["restarting"] and runs["run0"]["closed"] == "SUCCEEDED"
    two.close(JobState.SUCCEEDED)  # a closed run is left alone
    assert len(runs["run0"]["steps"]) == 4
