"""Turn plans into what users read (the dry run's text and JSON, memory fits); the console and JSON text every
command prints through. A job as `launch status` shows it is ``jobstatus``.

Every command imports this module (for ``console``), so it imports rich and the store only inside the
functions that use them: `launch --help` stays light.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from launcher.plan.fit import MemoryFit

_SECRETISH = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY)", re.I)
MASK = "****"
UNPROBED_TEXT = "auto"  # how a value that a probe on the node gives at launch reads until then

PROGRAMS_PRECISION = "the program's precision"  # an entrypoint whose spec named none: launch does not know it


def json_text(value: Any) -> str:
    """Indented strict JSON for `--json` output: never a bare NaN or Infinity (unknown figures are null)."""
    import json

    from launcher.store.db import json_safe

    return json.dumps(json_safe(value), indent=2, allow_nan=False)


def console():
    """The rich console for command output; piped output (logs, CI) is wide enough that tables are never cut."""
    import sys

    from rich.console import Console

    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 250)


def masked_env(env: dict[str, str], secrets: tuple[str, ...] = ()) -> dict[str, str]:
    """Env for display: secret names and secret-looking names show ``****``."""
    return {k: MASK if k in secrets or _SECRETISH.search(k) else v for k, v in env.items()}


def shown_env(node: dict[str, Any]) -> dict[str, str]:
    """A node's env (of a plan's JSON data) as users read it: a value its probe gives at launch (``unprobed``)
    reads ``auto``, in its place among the others."""
    env, unprobed = node["env"], node.get("unprobed") or ()
    sources = node.get("env_sources")
    order = [*sources, *env] if isinstance(sources, dict) else list(env)
    return {k: UNPROBED_TEXT if k in unprobed else env[k] for k in dict.fromkeys(order) if k in env or k in unprobed}


def plan_json(plan: Any) -> dict[str, Any]:
    """The plan as JSON data, with secrets shown only by name and values still to be probed as ``auto``."""
    data = plan.model_dump(mode="json")
    for node in data["nodes"]:
        node["env"] = masked_env(shown_env(node), plan.secrets)
        del node["unprobed"]
        for name in plan.secrets:
            node["env"][name] = MASK
            node["env_sources"][name] = "secret: the submitter's environment"
    if data["batch"] is not None:
        data["batch"]["formula"] = "global_batch = micro_batch x grad_accum x world_size"
    return data


def batch_text(global_batch: object, micro_batch: object = None, grad_accum: object = None,
               world_size: object = None) -> str:
    """``global 64 = micro 16 x accumulation 2 x world 2``; a job with no ``batch:`` (a user's program that
    batches its own data, global None) says so instead."""
    if global_batch is None:
        return "(not given: the program batches its own data)"
    return f"global {global_batch} = micro {micro_batch} x accumulation {grad_accum} x world {world_size}"


def steps_text(steps: object, total: object) -> str:
    """``40/100`` when the job has an expected total, else ``40`` (an entrypoint without max_steps: none invented)."""
    return f"{steps}/{total}" if total is not None else f"{steps}"


def plan_text(plan: Any, notes: Sequence[str] = ()) -> str:
    """A readable dry-run of the plan; ``notes`` are lines about the job beyond its plan (where the cluster came
    from, its notifiers), shown under its warnings."""
    b = plan.batch
    batch = batch_text(b.global_batch, b.micro_batch, b.grad_accum, b.world_size) if b is not None else batch_text(None)
    lines = [
        f"job {plan.job_id}  (dry run: nothing was contacted or started)",
        f"  cluster     {plan.cluster_name} (backend {plan.backend})",
        f"  launcher    {plan.launcher}   strategy {plan.strategy or '(entrypoint)'}   precision {plan.precision or PROGRAMS_PRECISION}"
        f"   process group {plan.dist_backend}",
        f"  world       {world_text(plan)}",
        f"  batch       {batch}",
        f"  steps       {plan.max_steps if plan.max_steps is not None else '(the program decides: no max_steps)'}",
        *([f"  elastic     min_nodes {plan.elastic.min_nodes}: {plan.elastic.describe()}"] if plan.elastic else []),
        *(f"  warning     {text}" for text in plan.warnings),
        *notes,
        f"  rendezvous  {plan.rendezvous.backend} id={plan.rendezvous.id} endpoint={plan.rendezvous.endpoint}",
    ]
    if plan.memory:
        lines.append("  memory      " + memory_line(plan.memory))
    data = plan_json(plan)
    for node in data["nodes"]:
        first, last = node["first_rank"], node["first_rank"] + node["nproc"] - 1
        ranks = f"ranks {first}-{last}" if last > first else f"rank {first}"
        lines.append(f"  node {node['index']}  {node['host']} ({node['address']})  {node['nproc']} proc  "
                     f"{ranks}  cwd {node['cwd']}")
        if plan.leases:
            lines.append("    lease " + lease_line(node["nproc"], node["gpus"]))
        for name, (filename, _) in node["files"].items():
            lines.append(f"    file  {filename} in the node's run directory  # {name} holds its path")
        lines.append(f"    argv  {shlex.join(node['argv'])}")
        for option in node.get("run_options") or ():
            when = " (probed at launch)" if option["pending"] else ""
            lines.append(f"    adds  {shlex.join(option['args'])}{when}  # {option['why']}")
        width = max((len(k) + len(v) for k, v in node["env"].items()), default=0) + 1
        for key, value in node["env"].items():
            lines.append(f"    env   {f'{key}={value}':<{width}}  # {node['env_sources'][key]}")
    if plan.ds_config is not None:
        import json

        lines.append("  deepspeed config (generated):")
        lines.extend("    " + line for line in json.dumps(plan.ds_config, indent=2, sort_keys=True).splitlines())
    return "\n".join(lines)


def lease_line(nproc: int, gpus: int) -> str:
    """What a node's agent leases before its ranks start (docs/LEASES.md)."""
    if not gpus:
        return f"{nproc} CPU slot(s) of the node's, the lowest free when it starts (docs/LEASES.md)"
    part = f"{nproc} of the node's {gpus} GPUs, the lowest free" if nproc < gpus else f"all {gpus} GPUs"
    return f"{part} when it starts, set as CUDA_VISIBLE_DEVICES (docs/LEASES.md)"


def world_text(plan: Any) -> str:
    """``2 node(s) x 2 process(es) = 4 ranks``, or each node's count where they differ (``2+1``)."""
    procs = [node.nproc for node in plan.nodes]
    each = str(procs[0]) if len(set(procs)) == 1 else "+".join(map(str, procs))
    return f"{plan.nnodes} node(s) x {each} process(es) = {plan.world_size} ranks"


def memory_line(fit: MemoryFit) -> str:
    """One line: the chosen strategy's per-GPU estimate and whether it fits."""
    line = (
        f"{fit.params / 1e6:.1f}M params; {fit.strategy} needs ~{fit.total_gib:.2f} GiB a GPU "
        f"(model states {fit.model_states_gib:.2f} + activations {fit.activations_gib:.2f})"
    )
    if fit.fits is None:
        return line + "; GPU size unknown (CPU ranks, or gpu.memory_gb unset): not checked"
    verdict = "fits" if fit.fits else "does NOT fit"
    return line + f"; {verdict} in {fit.usable_gib:.1f} usable GiB; recommended: {fit.recommended}"


def fit_table(rows: list[Any], chosen: str, gpu_gb: float | None):
    """A rich table: each strategy's per-GPU estimate and whether it fits."""
    from rich.table import Table

    gib = 2**30
    table = Table(box=None, header_style="bold")
    for column in ("STRATEGY", "MODEL STATES", "ACTIVATIONS", "TOTAL / GPU", "HOST / NODE", "FITS"):
        table.add_column(column, no_wrap=True)
    for r in rows:
        fits = "-" if not gpu_gb else ("[green]yes[/]" if r.fits else "[red]no[/]")
        name = f"[bold]{r.strategy}[/] *" if r.strategy == chosen else r.strategy
        table.add_row(
            name, f"{r.model_states_bytes / gib:.2f} GiB", f"{r.activation_bytes / gib:.2f} GiB",
            f"{r.total_bytes / gib:.2f} GiB", f"{r.cpu_bytes_per_node / gib:.1f} GiB", fits,
        )
    return table
