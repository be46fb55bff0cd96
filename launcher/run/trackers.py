"""The trackers a job's ``tracking:`` names: MLflow (``mlflow`` or ``mlflow-skinny``) and W&B (``wandb``), each
imported only when its run opens, in the supervisor (the extras ``launch[mlflow]``, ``launch[wandb]``)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from launcher.errors import LaunchError
from launcher.run.tracking import RunInfo, Step, Tracker
from launcher.spec.tracking import MlflowSpec, TrackingSpec, WandbSpec
from launcher.store.states import JobState

MLFLOW_BATCH = 1000  # metrics a log_batch call takes at most (MLflow's limit)
MLFLOW_PARAMS = 100  # parameters a log_batch call takes at most
#: MLflow's client retries a request for minutes by default: the mirror retries at its next sync instead, so that a
#: tracker that is down is an event within seconds and the job's end is not held up (a user's own setting wins).
MLFLOW_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}


def configured(spec: TrackingSpec, run_dir: Path) -> list[Tracker]:
    out: list[Tracker] = []
    if spec.mlflow is not None:
        out.append(MlflowTracker(spec.mlflow))
    if spec.wandb is not None:
        out.append(WandbTracker(spec.wandb, run_dir))
    return out


def _needs(package: str, extra: str) -> LaunchError:
    return LaunchError(f"tracking needs the {package} package on the submitting machine (pip install 'launch[{extra}]')")


class MlflowTracker:
    """One MLflow run through ``MlflowClient`` (no global state). Re-sending a metric with its step and timestamp
    writes the same row: a retry after a half-taken batch duplicates nothing."""

    name = "mlflow"

    def __init__(self, spec: MlflowSpec) -> None:
        self.spec = spec
        self.run_id: str | None = None
        self._client: Any = None

    def _mlflow(self) -> Any:
        if self._client is None:
            for name, value in MLFLOW_HTTP.items():  # the supervisor's own process
                os.environ.setdefault(name, value)
            try:
                from mlflow.tracking import MlflowClient
            except ImportError:
                raise _needs("mlflow", "mlflow") from None
            self._client = MlflowClient(tracking_uri=self.spec.uri)
        return self._client

    def open(self, run_id: str | None, info: RunInfo) -> str:
        from mlflow.entities import Param

        client = self._mlflow()
        if run_id is not None:
            client.get_run(run_id)  # it still exists
            self.run_id = run_id
            return run_id
        found = client.get_experiment_by_name(self.spec.experiment)
        experiment = found.experiment_id if found else client.create_experiment(self.spec.experiment)
        run = client.create_run(experiment, tags=info.tags, run_name=info.name)
        self.run_id = run.info.run_id
        params = [Param(k, v) for k, v in sorted(info.params.items())]
        for start in range(0, len(params), MLFLOW_PARAMS):
            client.log_batch(self.run_id, params=params[start:start + MLFLOW_PARAMS])
        return self.run_id

    def steps(self, steps: list[Step]) -> None:
        from mlflow.entities import Metric

        metrics = [Metric(name, value, int(step.t * 1000), step.step)
                   for step in steps for name, value in sorted(step.metrics.items())]
        for start in range(0, len(metrics), MLFLOW_BATCH):
            self._mlflow().log_batch(self.run_id, metrics=metrics[start:start + MLFLOW_BATCH])

    def events(self, events: list[tuple[int, dict[str, Any]]]) -> None:
        from mlflow.entities import RunTag

        tags = [RunTag(f"launch.event.{row:06d}", f"{event['kind']}: {event['message']}"[:5000]) for row, event in events]
        self._mlflow().log_batch(self.run_id, tags=tags + [RunTag("launch.last_event", events[-1][1]["kind"])])

    def tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self._mlflow().log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def close(self, summary: dict[str, float], state: JobState) -> None:
        from mlflow.entities import Metric, RunStatus, RunTag

        ended = {JobState.SUCCEEDED: RunStatus.FINISHED, JobState.CANCELLED: RunStatus.KILLED}.get(state, RunStatus.FAILED)
        now = int(time.time() * 1000)
        client = self._mlflow()
        client.log_batch(self.run_id, metrics=[Metric(f"summary.{k}", v, 0, 0) for k, v in sorted(summary.items())],
                         tags=[RunTag("launch.state", str(state))])
        client.set_terminated(self.run_id, status=RunStatus.to_string(ended), end_time=now)


class WandbTracker:
    """One W&B run (``mode: offline`` writes it under the job's run directory, for `wandb sync`). Steps are W&B's
    own step counter as it requires (one way up); the job's step and attempt are logged beside each."""

    name = "wandb"

    def __init__(self, spec: WandbSpec, run_dir: Path) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self.run_id: str | None = None
        self._run: Any = None
        self._notes: list[str] = []

    def open(self, run_id: str | None, info: RunInfo) -> str:
        try:
            import wandb
        except ImportError:
            raise _needs("wandb", "wandb") from None
        self._run = wandb.init(project=self.spec.project, entity=self.spec.entity, mode=self.spec.mode,
                               dir=str(self.run_dir), id=run_id, resume="allow" if run_id else None, name=info.name,
                               config=info.params, tags=[f"{k.removeprefix('launch.')}={v}"[:64]
                                                         for k, v in info.tags.items() if v],
                               settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
                               reinit="create_new")
        self.run_id = self._run.id
        return self._run.id

    def steps(self, steps: list[Step]) -> None:
        for step in steps:
            self._run.log({**step.metrics, "launch/step": step.step, "launch/attempt": step.attempt})

    def events(self, events: list[tuple[int, dict[str, Any]]]) -> None:
        self._notes += [f"{event['kind']}: {event['message']}" for _, event in events]
        self._run.notes = "\n".join(self._notes)[-10_000:]

    def tags(self, tags: dict[str, str]) -> None:
        self._run.summary.update(tags)

    def close(self, summary: dict[str, float], state: JobState) -> None:
        self._run.summary.update({**summary, "launch/state": str(state)})
        self._run.finish(exit_code=0 if state == JobState.SUCCEEDED else 1)
