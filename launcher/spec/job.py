"""The job spec: what to train, how, and on how many nodes and processes."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from launcher.recipes import RECIPES
from launcher.spec.base import Strict
from launcher.spec.container import ContainerSpec
from launcher.strategies import DEFAULT_STRATEGY, LAUNCHERS, PRECISIONS, get_strategy

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ModelSpec(Strict):
    size: str | None = Field(None, description="Recipe model size, e.g. base | large (bert), small (gpt2).")
    seq_len: int | None = Field(None, ge=1, description="Sequence length for language models.")
    num_layers: int | None = Field(None, ge=1, description="Override the layer count (tiny test models).")


class BatchSpec(Strict):
    """Give any two of the three; the third is derived (global = micro x accum x world)."""

    global_batch: int | None = Field(None, ge=1)
    micro_batch: int | None = Field(None, ge=1)
    grad_accum: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _two_given(self) -> "BatchSpec":
        given = [v for v in (self.global_batch, self.micro_batch, self.grad_accum) if v is not None]
        if len(given) < 2 and self.micro_batch is None:
            raise ValueError("give at least two of global_batch, micro_batch, grad_accum (or micro_batch alone)")
        return self


class ResourcesSpec(Strict):
    nodes: int = Field(1, ge=1, description="Number of nodes (one torchrun agent each).")
    nproc_per_node: int = Field(1, ge=1, description="Processes per node: GPUs, or CPU slots without GPUs.")


class DataSpec(Strict):
    path: str | None = Field(None, description="Real data to read; synthetic data when absent.")


class CheckpointSpec(Strict):
    dir: str | None = None
    every_steps: int = Field(0, ge=0, description="0: only at the end.")


class DeepSpeedSpec(Strict):
    config: str | None = Field(None, description="A DeepSpeed JSON config merged over the generated one.")
    gradient_clipping: float = Field(1.0, ge=0)
    no_local_rank: bool = Field(
        False, description="Do not pass --local_rank=N to the ranks (the deepspeed command passes it by default).",
    )


class WatchSpec(Strict):
    stall_timeout: float = Field(300.0, gt=0, description="Seconds without progress before a job is called stalled.")
    grace_period: float = Field(5.0, ge=0, description="Seconds between TERM and KILL on teardown.")


class MetricsSpec(Strict):
    every: int = Field(10, ge=1, description="Report every N optimizer steps.")


class JobSpec(Strict):
    """A training job. Exactly one of ``recipe`` and ``entrypoint``."""

    name: str
    recipe: Literal[RECIPES] | None = None
    entrypoint: list[str] | None = Field(None, min_length=1)
    model: ModelSpec = ModelSpec()
    launcher: Literal[LAUNCHERS] = "torchrun"
    strategy: str = DEFAULT_STRATEGY
    compile_mode: str | None = None
    precision: Literal[PRECISIONS] = "fp32"
    batch: BatchSpec | None = Field(
        None, description="Batch arithmetic; required for recipes. For an entrypoint, its values reach the program "
        "as LAUNCH_GLOBAL_BATCH, LAUNCH_MICRO_BATCH and LAUNCH_GRAD_ACCUM.",
    )
    resources: ResourcesSpec = ResourcesSpec()
    max_steps: int = Field(100, ge=1)
    seed: int = 0
    lr: float | None = Field(None, gt=0)
    data: DataSpec = DataSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    restarts: int = Field(0, ge=0, description="Relaunch the whole job this many times after a failure, resuming.")
    restart_on: Literal["transient", "any"] = Field(
        "transient", description="Which failures a restart follows: 'transient' (a lost node, a network or NCCL error, "
        "a signal from outside, a hang after progress) or 'any' (also the OOM killer and errors raised before the first step).",
    )
    leave_out_failed_nodes: bool = Field(
        False, description="On a restart, replace a node that failed first in two attempts with a spare node (ssh).",
    )
    deepspeed: DeepSpeedSpec = DeepSpeedSpec()
    watch: WatchSpec = WatchSpec()
    metrics: MetricsSpec = MetricsSpec()
    container: ContainerSpec | None = Field(
        None, description="Run every node's command in a container of one image (docs/CONTAINERS.md); "
        "the cluster's container section is the default, the job's keys win.",
    )
    env: dict[str, str] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be lowercase letters, digits, '-', '_' or '.', starting with a letter or digit")
        return v

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, v: str) -> str:
        return get_strategy(v).name

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not _ENV_NAME.match(k)]
        if bad:
            raise ValueError(f"not valid environment variable names: {', '.join(bad)}")
        return v

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, v: list[str]) -> list[str]:
        bad = [k for k in v if not _ENV_NAME.match(k)]
        if bad:
            raise ValueError(f"not valid environment variable names: {', '.join(bad)}")
        return v

    @model_validator(mode="after")
    def _leave_out(self) -> "JobSpec":
        if self.leave_out_failed_nodes and self.restarts < 2:
            raise ValueError(
                "leave_out_failed_nodes needs restarts: 2 or more (a node is left out after failing in two attempts, "
                f"then the job restarts without it); restarts is {self.restarts}"
            )
        return self

    @model_validator(mode="after")
    def _program(self) -> "JobSpec":
        if (self.recipe is None) == (self.entrypoint is None):
            raise ValueError("give exactly one of 'recipe' (a built-in recipe) or 'entrypoint' (your program's argv)")
        if self.recipe is not None and self.batch is None:
            raise ValueError("a recipe needs 'batch': any two of global_batch, micro_batch, grad_accum (or micro_batch alone)")
        if self.entrypoint is not None and self.strategy != DEFAULT_STRATEGY:
            raise ValueError("'strategy' applies to built-in recipes; your entrypoint chooses its own")
        problem = get_strategy(self.strategy).launcher_problem(self.launcher) if self.recipe is not None else None
        if problem:
            raise ValueError(problem)
        return self

    @property
    def uses_deepspeed(self) -> bool:
        return self.launcher == "deepspeed" or get_strategy(self.strategy).uses_deepspeed

