"""The job spec: what to train, how, and on how many nodes and processes."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    Field,
    PlainValidator,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from launcher.catalog.recipes import RecipeName, model_problem
from launcher.catalog.strategies import DEFAULT_STRATEGY, LauncherName, PrecisionName, get_strategy
from launcher.spec.base import Strict
from launcher.spec.container import ContainerSpec
from launcher.spec.elastic import ElasticSpec, min_nodes_problem
from launcher.spec.fields import MAX_NODES, MAX_PROCS_PER_NODE, MAX_STEPS, WEEK_S, Arg, EnvName, FiniteFloat, Line, Name
from launcher.spec.notify import NotifySpec
from launcher.spec.tracking import TrackingSpec

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
DEFAULT_RECIPE_STEPS = 100  # a recipe's length when the spec gives no max_steps
PYTHON_NAMES = ("python", "python3")  # an entrypoint program that runs under the cluster's interpreter
UNBUFFERED = "-u"  # the one interpreter option an entrypoint may keep: launch sets PYTHONUNBUFFERED=1 anyway
INTERPRETER_ENV = ("-B: PYTHONDONTWRITEBYTECODE=1, -O: PYTHONOPTIMIZE=1, -W ARG: PYTHONWARNINGS=ARG, "
                   "-X faulthandler: PYTHONFAULTHANDLER=1")


def interpreter_options(entrypoint: list[str]) -> list[str]:
    """The interpreter options before a python entrypoint's script or ``-m MODULE`` (``-u`` included)."""
    if entrypoint[0] not in PYTHON_NAMES:
        return []
    options = []
    for arg in entrypoint[1:]:
        if not arg.startswith("-") or arg == "-m":
            break
        options.append(arg)
    return options


class ModelSpec(Strict):
    size: Name | None = Field(None, description="Recipe model size, e.g. base | large (bert), small (gpt2).")
    seq_len: int | None = Field(None, ge=1, le=1 << 20, description="Sequence length for language models.")
    num_layers: int | None = Field(None, ge=1, le=10_000, description="Override the layer count (tiny test models).")


class BatchSpec(Strict):
    """Give any two of the three; the third is derived (global = micro x accum x world)."""

    global_batch: int | None = Field(None, ge=1, le=1 << 24)
    micro_batch: int | None = Field(None, ge=1, le=1 << 20)
    grad_accum: int | None = Field(None, ge=1, le=1 << 20)

    @model_validator(mode="after")
    def _two_given(self) -> BatchSpec:
        given = [v for v in (self.global_batch, self.micro_batch, self.grad_accum) if v is not None]
        if len(given) < 2 and self.micro_batch is None:
            raise ValueError("give at least two of global_batch, micro_batch, grad_accum (or micro_batch alone)")
        return self


def full_batch(batch: BatchSpec | None, world_size: int) -> tuple[int, int] | None:
    """(global, micro) at ``world_size`` when the batch resolves to whole numbers there, else None."""
    if batch is None:
        return None
    micro, accum, total = batch.micro_batch, batch.grad_accum, batch.global_batch
    if total is None and micro is not None:
        return micro * (accum or 1) * world_size, micro
    if micro is None and total is not None and accum is not None and total % (accum * world_size) == 0:
        return total, total // (accum * world_size)
    return (total, micro) if total is not None and micro is not None else None


def _procs_per_node(value: object) -> int | str:
    """A process count or ``auto``, refused in one message (a union would report each of its members)."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_PROCS_PER_NODE):
        return value
    raise ValueError(f"a number of processes from 1 to {MAX_PROCS_PER_NODE}, or 'auto' (one per GPU or slot of "
                     f"each node)")


ProcsPerNode = Annotated[
    int | Literal["auto"], PlainValidator(_procs_per_node),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1, "maximum": MAX_PROCS_PER_NODE}, {"const": "auto"}]}),
]


class ResourcesSpec(Strict):
    nodes: int = Field(1, ge=1, le=MAX_NODES, description="Number of nodes (one torchrun agent each).")
    nproc_per_node: ProcsPerNode = Field(
        1, description="Processes per node: GPUs, or CPU slots without GPUs; 'auto': one per GPU (or slot) of each "
        "node, so nodes with different GPU counts run one job (ranks numbered node after node).",
    )
    allow_shared_gpus: bool = Field(
        False, description="Start on GPUs that processes launch did not start are using (nvidia-smi's compute apps); "
        "by default such a GPU counts as busy (docs/LEASES.md).",
    )


def _not_an_option(value: str) -> str:
    """A path the ranks get as an argument: one starting with '-' would read as an option there."""
    if value.startswith("-"):
        raise ValueError(f"{value[:60]!r} starts with '-', which the program would read as an option; "
                         f"write ./{value[:60]} for a relative path")
    return value


PathArg = Annotated[Line, AfterValidator(_not_an_option)]


class DataSpec(Strict):
    path: PathArg | None = Field(None, description="Real data to read; synthetic data when absent.")


class CheckpointSpec(Strict):
    dir: PathArg | None = Field(None, description="Where a recipe saves and resumes its checkpoints; none: no checkpoints.")
    every_steps: int = Field(0, ge=0, le=MAX_STEPS, description="Save every N optimizer steps (needs dir); 0: only at "
                             "the end.")
    resume: bool = Field(False, description="Continue the run another job left in dir (its newest checkpoint); by "
                         "default a job resumes only its own checkpoints and refuses another job's.")

    @field_validator("every_steps")
    @classmethod
    def _needs_dir(cls, v: int, info: ValidationInfo) -> int:
        """A checkpoint interval with nowhere to write is refused here, not by every rank after the start."""
        if v and "dir" in info.data and info.data["dir"] is None:  # a dir that failed its own check is not in data
            raise ValueError(f"every_steps: {v} saves checkpoints, but checkpoint.dir is not set: give dir (a "
                             "directory every node can write), or every_steps: 0")
        return v


class DeepSpeedSpec(Strict):
    config: Line | None = Field(None, description="A DeepSpeed JSON config merged over the generated one.")
    gradient_clipping: FiniteFloat = Field(1.0, ge=0, le=1e6)
    no_local_rank: bool = Field(
        False, description="Do not pass --local_rank=N to the ranks (the deepspeed command passes it by default).",
    )


# The agents look for a supervisor's contact every second and a supervisor touches them every second: a shorter
# unattended_timeout (1e-300 validated once) would end a supervised job at the first late touch.
MIN_UNATTENDED_S = 5.0


class WatchSpec(Strict):
    stall_timeout: FiniteFloat = Field(
        300.0, gt=0, le=WEEK_S, description="Seconds without progress before a job is called stalled (at most a week).",
    )
    grace_period: FiniteFloat = Field(5.0, ge=0, le=3600, description="Seconds between TERM and KILL on teardown.")
    unattended_timeout: FiniteFloat | None = Field(
        1800.0, ge=MIN_UNATTENDED_S, le=WEEK_S,
        description="Seconds the node agents keep the job running with no supervisor in contact (its machine "
        "crashed, its network is down), then end it on every node; null: run to the end unattended.",
    )


class MetricsSpec(Strict):
    every: int = Field(10, ge=1, le=1_000_000, description="Report every N optimizer steps.")
    auto: bool = Field(
        True, description="Observe an entrypoint's training steps from inside its ranks (optimizer steps, DataLoader "
        "batches, loss, memory) with no change to the program; false: only what the program reports itself.",
    )


class JobSpec(Strict):
    """A training job. Exactly one of ``recipe`` and ``entrypoint``."""

    name: str
    recipe: RecipeName | None = None
    entrypoint: list[Arg] | None = Field(None, min_length=1, max_length=10_000)
    model: ModelSpec = ModelSpec()
    launcher: LauncherName = "torchrun"
    strategy: str = DEFAULT_STRATEGY
    compile_mode: Name | None = None
    precision: PrecisionName = "fp32"
    batch: BatchSpec | None = Field(
        None, description="Batch arithmetic; required for recipes. For an entrypoint, its values reach the program "
        "as LAUNCH_GLOBAL_BATCH, LAUNCH_MICRO_BATCH and LAUNCH_GRAD_ACCUM.",
    )
    resources: ResourcesSpec = ResourcesSpec()
    max_steps: int | None = Field(
        None, ge=1, le=MAX_STEPS, description=f"Optimizer steps: a recipe's length (default {DEFAULT_RECIPE_STEPS}); "
        "for an entrypoint, the total it is expected to reach (progress and ETA); none: no total shown.",
    )
    seed: int = Field(0, ge=0, le=2**32 - 1)
    lr: FiniteFloat | None = Field(None, gt=0, le=100)
    data: DataSpec = DataSpec()
    checkpoint: CheckpointSpec = CheckpointSpec()
    restarts: int = Field(0, ge=0, le=100, description="Relaunch the whole job this many times after a failure, resuming.")
    queue: Literal["fail", "wait"] = Field(
        "fail", description="When another job holds the GPUs or slots (docs/LEASES.md): 'fail' exits 3 naming the holder; "
        "'wait' queues the job (QUEUED) until they are free, in submission order (as `launch submit --wait`).",
    )
    restart_on: Literal["transient", "any"] = Field(
        "transient", description="Which failures a restart follows: 'transient' (a lost node, a network or NCCL error, "
        "a signal from outside, a hang after progress) or 'any' (also the OOM killer and errors raised before the first step).",
    )
    leave_out_failed_nodes: bool = Field(
        False, description="On a restart, replace a node that failed first in two attempts with a spare node (ssh).",
    )
    elastic: ElasticSpec | None = Field(
        None, description="Go on with fewer nodes when one is lost (docs/RELIABILITY.md): re-planned on the nodes left, "
        "grad_accum recomputed so the global batch stays exact, resumed from the last checkpoint; needs restarts: 1 or more.",
    )
    deepspeed: DeepSpeedSpec = DeepSpeedSpec()
    watch: WatchSpec = WatchSpec()
    metrics: MetricsSpec = MetricsSpec()
    container: ContainerSpec | None = Field(
        None, description="Run every node's command in a container of one image (docs/CONTAINERS.md); "
        "the cluster's container section is the default, the job's keys win.",
    )
    env: dict[EnvName, Arg] = Field(
        default_factory=dict, description="Environment of every rank; LAUNCH_* (but LAUNCH_METRICS*) are launch's own.",
    )
    secrets: list[EnvName] = Field(
        default_factory=list, description="Names of variables whose values come from the submitter's environment.",
    )
    notify: NotifySpec | None = Field(
        None, description="Commands and webhooks told when the job succeeds, fails, is cancelled, restarts or is left "
        "unattended (docs/NOTIFY.md); a notifier that fails is an event of the job, never its failure.",
    )
    tracking: TrackingSpec | None = Field(
        None, description="Experiment trackers the supervisor mirrors the job into, one run each (MLflow, W&B; "
        "docs/TRACKING.md); a tracker that fails is an event of the job and a retry, never its failure.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.fullmatch(v):  # fullmatch: '$' alone lets a trailing newline through
            raise ValueError("must be lowercase letters, digits, '-', '_' or '.', starting with a letter or digit")
        return v

    @field_validator("model")
    @classmethod
    def _model(cls, v: ModelSpec, info: ValidationInfo) -> ModelSpec:
        """A recipe's size and sequence length are ones it can build (else planning would fail later)."""
        problem = model_problem(info.data.get("recipe"), v.size, v.seq_len, v.num_layers)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, v: str) -> str:
        return get_strategy(v).name

    @field_validator("entrypoint")
    @classmethod
    def _entrypoint(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        if not v[0] or v[0].startswith("-"):
            raise ValueError(f"the first item is the program to run; {v[0]!r} is not a program name or path")
        refused = [option for option in interpreter_options(v) if option != UNBUFFERED]
        if refused:
            raise ValueError(
                f"{refused[0]!r} is an option of the interpreter, but torchrun and DeepSpeed's launcher start "
                f"{v[0]} themselves and take only a script or -m MODULE after it: drop it, or set its variable "
                f"in env: ({INTERPRETER_ENV}; -u is fine: output is unbuffered already)")
        return v


    @field_validator("elastic")
    @classmethod
    def _elastic(cls, v: ElasticSpec | None, info: ValidationInfo) -> ElasticSpec | None:
        """At least one smaller node count keeps the global batch exact, and a restart is allowed."""
        resources, restarts = info.data.get("resources"), info.data.get("restarts")
        if v is None or resources is None or restarts is None:
            return v
        if restarts < 1:
            raise ValueError("an elastic job restarts on fewer nodes: set restarts: 1 or more (each node loss takes one)")
        if info.data.get("leave_out_failed_nodes"):
            raise ValueError("give elastic or leave_out_failed_nodes, not both: an elastic job already leaves a lost "
                             "node out and moves to a spare host while the cluster lists one")
        if resources.nproc_per_node == "auto":  # each node's processes are known once planned: the planner checks
            problem = min_nodes_problem(v, [1] * resources.nodes, None)
        else:
            problem = min_nodes_problem(v, [resources.nproc_per_node] * resources.nodes,
                                        full_batch(info.data.get("batch"), resources.nodes * resources.nproc_per_node))
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("notify")
    @classmethod
    def _notify(cls, v: NotifySpec | None, info: ValidationInfo) -> NotifySpec | None:
        """A webhook's ``${NAME}`` names a secret of the job, so its value comes from the submitter's environment."""
        unlisted = sorted(v.secrets_named() - set(info.data.get("secrets") or ())) if v else []
        if unlisted:
            raise ValueError(f"webhooks name {', '.join('${' + n + '}' for n in unlisted)}, which secrets: does not list; "
                             "add them there (their values come from your environment and are masked everywhere)")
        return v

    @model_validator(mode="after")
    def _leave_out(self) -> JobSpec:
        if self.leave_out_failed_nodes and self.restarts < 2:
            raise ValueError(
                "leave_out_failed_nodes needs restarts: 2 or more (a node is left out after failing in two attempts, "
                f"then the job restarts without it); restarts is {self.restarts}"
            )
        return self

    @model_validator(mode="after")
    def _program(self) -> JobSpec:
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
    def total_steps(self) -> int | None:
        """The steps the job is expected to take: a recipe's (default ``DEFAULT_RECIPE_STEPS``), an entrypoint's
        ``max_steps`` when given; None: an entrypoint that did not say (no total is invented)."""
        if self.recipe is not None and self.max_steps is None:
            return DEFAULT_RECIPE_STEPS
        return self.max_steps

    @property
    def uses_deepspeed(self) -> bool:
        return self.launcher == "deepspeed" or get_strategy(self.strategy).uses_deepspeed

