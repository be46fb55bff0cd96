"""The job's ``tracking:`` section: the experiment trackers the supervisor mirrors the job into (MLflow, W&B).

The supervisor, not the ranks, writes to them: nodes need neither the tracker's package nor access to it.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from launcher.spec.base import Strict
from launcher.spec.fields import Line, NonEmptyLine


class MlflowSpec(Strict):
    uri: NonEmptyLine = Field(description="The tracking server (http://host:5000) or store (file:, sqlite:) URI.")
    experiment: NonEmptyLine = Field("launch", description="The experiment's name (made when missing).")

    @field_validator("uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        if urlsplit(v).scheme not in ("http", "https", "file", "sqlite", "postgresql", "mysql", "databricks"):
            raise ValueError(f"{v!r} is not a tracking URI (http://host:5000, file:///path, sqlite:///file.db)")
        return v


class WandbSpec(Strict):
    project: NonEmptyLine = Field(description="The W&B project.")
    entity: Line | None = Field(None, description="The team or user (default: the logged-in user's).")
    mode: Literal["online", "offline"] = Field(
        "online", description="offline: the run is written under the job's run directory (`wandb sync` uploads it).")


class TrackingSpec(Strict):
    mlflow: MlflowSpec | None = Field(None, description="Mirror the job into one MLflow run (pip install 'launch[mlflow]').")
    wandb: WandbSpec | None = Field(None, description="Mirror the job into one W&B run (pip install 'launch[wandb]').")
    per_rank: bool = Field(False, description="Also each rank's figures per step (rank_N/samples_per_sec, ...).")
