"""Host memory a recipe job needs on one machine, and the smaller job that would fit.

CPU ranks keep everything in host memory: each holds its model states and activations as the
strategy's per-device estimate says (``launcher.plan.memory``), the fully built fp32 model before a
strategy wraps or partitions it, and the interpreter with torch (and deepspeed) loaded. GPU ranks
keep only the interpreter on the host, plus ZeRO's offloaded states (DeepSpeed's host estimate)
under ``zero3_offload``. Pure arithmetic: no torch import.
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.catalog.strategies import get_strategy
from launcher.errors import PlanError

GIB = 2**30
RANK_BASE_BYTES = 600 * 2**20  # one rank's interpreter, torch and its libraries, measured on CPU (gloo)
DEEPSPEED_RANK_BYTES = 900 * 2**20  # the same with deepspeed imported and its engine built

MIN_SEQ_LEN = 32


@dataclass(frozen=True)
class HostMemory:
    ranks: int
    per_rank_bytes: int
    shared_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.ranks * self.per_rank_bytes + self.shared_bytes

    def describe(self) -> str:
        text = f"{self.ranks} rank(s) x {self.per_rank_bytes / GIB:.2f} GiB"
        return text + (f" + {self.shared_bytes / GIB:.1f} GiB offloaded states" if self.shared_bytes else "")


def host_memory(job, plan) -> HostMemory | None:
    """The job's host memory on this machine; None for a user's program (its model is unknown)."""
    if job.recipe is None or plan.batch is None:
        return None
    from launcher.catalog.recipes import recipe_info
    from launcher.plan.memory import estimate

    info = recipe_info(job.recipe, job.model.size, job.model.seq_len, job.model.num_layers)
    est = estimate(info, job.strategy, job.precision, plan.batch.micro_batch, plan.nnodes, plan.nproc_per_node, 1e9)
    base = DEEPSPEED_RANK_BYTES if job.uses_deepspeed else RANK_BASE_BYTES
    ranks = plan.nnodes * plan.nproc_per_node
    if not any(node.gpus for node in plan.nodes):  # CPU ranks: everything lives in host memory
        return HostMemory(ranks, base + est.total_bytes + 4 * info.params, 0)
    offloaded = est.cpu_bytes_per_node * plan.nnodes if get_strategy(job.strategy).offload else 0
    return HostMemory(ranks, base, offloaded)


def suggestion(job, cluster, plan, slots: int | None, budget: float | None) -> str | None:
    """``--set`` overrides of a smaller job that fits ``slots`` processes and ``budget`` bytes, or None."""
    from launcher.backends import plan_job

    sets: dict[str, object] = {}
    if slots is not None and plan.nnodes * plan.nproc_per_node > slots:
        sets["resources.nodes"] = 1
        sets["resources.nproc_per_node"] = max(1, min(plan.nproc_per_node, slots))
    candidate = job
    for _ in range(40):
        candidate = _apply(job, sets)
        try:
            fresh = plan_job(candidate, cluster, plan.job_id, rdzv_port=plan.rendezvous.port, ds_config=None, check_fit=False)
        except PlanError:
            return None
        need = host_memory(candidate, fresh)
        if need is None or budget is None or need.total_bytes <= budget:
            return " ".join(f"--set {key}={value}" for key, value in sets.items()) or None
        if not _shrink(candidate, sets):
            return None
    return None


def _apply(job, sets: dict[str, object]):
    resources = job.resources.model_copy(update={k.split(".")[1]: v for k, v in sets.items() if k.startswith("resources.")})
    model = job.model.model_copy(update={k.split(".")[1]: v for k, v in sets.items() if k.startswith("model.")})
    return job.model_copy(update={"resources": resources, "model": model})


def _shrink(job, sets: dict[str, object]) -> bool:
    """Make the model smaller one step (layers, then sequence length); False when nothing is left to shrink."""
    from launcher.catalog.recipes import recipe_info

    if job.recipe not in ("bert", "gpt2"):
        return False
    info = recipe_info(job.recipe, job.model.size, job.model.seq_len, job.model.num_layers)
    if info.num_layers and info.num_layers > 1:
        sets["model.num_layers"] = max(1, info.num_layers // 2)
        return True
    if info.seq_len and info.seq_len > MIN_SEQ_LEN:
        sets["model.seq_len"] = max(MIN_SEQ_LEN, info.seq_len // 2)
        return True
    return False
