"""`launch check`: is this cluster ready to train? Every node at once, one table, one exit code.

Per node (in parallel, through ``launcher.run.checks``): reachable; python, torch, deepspeed and NCCL
versions (read from package metadata, so nothing heavy is imported) with differences between
nodes flagged; driver, GPU count, free memory and processes already on the GPUs; free disk in
the workdir; clock skew; the rendezvous port free on node 0 and reachable from every other node.
Then, unless skipped, a short all-reduce across the nodes (a real job submitted like any other:
gloo on CPUs, NCCL on GPUs) with the bandwidth measured.
"""

from __future__ import annotations

from typing import Any

from launcher.backends import get_backend
from launcher.run.checks import CheckReport, assess, gather
from launcher.run.status import CHECK_JOB_NAME
from launcher.spec.cluster import ClusterSpec
from launcher.store.states import JobState
from launcher.views.nccl import fallback_warnings


def run_check(cluster: ClusterSpec, port: int, bandwidth: bool = True) -> CheckReport:
    """The whole check: facts, reachability, and (unless skipped) the all-reduce bandwidth."""
    backend = get_backend(cluster)
    try:
        nodes = gather(backend, cluster, port)
    finally:
        backend.close()
    problems, warnings = assess(nodes, cluster)
    report = CheckReport(nodes, problems, warnings)
    if bandwidth and not problems:
        report.bandwidth_job, report.bandwidth_gbps, failure = allreduce_bandwidth(cluster, backend.planning.bandwidth_nodes())
        if failure:
            report.problems.append(f"all-reduce test failed: {failure}")
        report.warnings += transport_warnings(report.bandwidth_job)
    return report


def transport_warnings(job_id: str) -> list[str]:
    """The all-reduce job's nodes planned for InfiniBand whose NCCL chose sockets (``launcher.views.nccl``)."""
    from launcher.store.db import Store

    store = Store()
    return [f"all-reduce test: {text}" for text in fallback_warnings(store.job(job_id).plan, store.events(job_id))]


def allreduce_bandwidth(cluster: ClusterSpec, nodes: int) -> tuple[str, float | None, str | None]:
    """Run the all-reduce job (one process on each of ``nodes`` nodes) and read its bus bandwidth from the store."""
    from launcher.run import orchestrate
    from launcher.spec.job import JobSpec
    from launcher.store.db import Store

    job = JobSpec(
        name=CHECK_JOB_NAME,
        entrypoint=["python", "-m", "launcher.recipes.allreduce_bench"],
        resources={"nodes": nodes, "nproc_per_node": 1},
        metrics={"every": 1},
        watch={"stall_timeout": 120, "grace_period": 2},
    )
    prepared = orchestrate.prepare_job(job, cluster)
    job_id, state = orchestrate.submit(prepared, detach=False, echo=None)
    if state != JobState.SUCCEEDED:
        return job_id, None, f"job {job_id} ended {state} (launch status {job_id})"
    values = [v for v in (r.number("allreduce_busbw_gbps") for r in Store().metrics(job_id)) if v is not None]
    return job_id, (max(values) if values else None), None


def report_json(report: CheckReport) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "problems": report.problems,
        "warnings": report.warnings,
        "bandwidth_gbps": report.bandwidth_gbps,
        "bandwidth_job": report.bandwidth_job,
        "nodes": [{"index": n.index, "host": n.host, "error": n.error, "skew_s": n.skew_s,
                   "skew_uncertainty_s": n.skew.uncertainty if n.skew is not None else None,
                   **({} if n.error else n.facts.as_json())} for n in report.nodes],
    }


def report_table(report: CheckReport):
    """A rich table: one row per node. What a node said is shown as plain text, never as markup."""
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, header_style="bold")
    for column in ("NODE", "HOST", "PYTHON", "TORCH", "DEEPSPEED", "NCCL", "GPUS", "FREE GPU MEM", "DISK FREE", "SKEW", "PORT"):
        table.add_column(column, no_wrap=True)
    for n in report.nodes:
        if n.error:
            table.add_row(str(n.index), Text(n.host), Text(n.error[:60], style="red"), *["-"] * 8)
            continue
        f = n.facts
        gpus = f.gpus
        free = sum(g.total_mb - g.used_mb for g in gpus) / 1024 if gpus else None
        port = "free" if f.port_free else ("reached" if f.reached is True else "-")
        table.add_row(
            str(n.index), Text(f.hostname or n.host), Text(f.python or "-"),
            Text(f.torch) if f.torch else Text("missing", style="red"), Text(f.deepspeed or "-"),
            Text(f.nccl or "-"), Text(f"{len(gpus)} x {gpus[0].name or '?'}") if gpus else "0 (CPU)",
            f"{free:.0f} GiB" if free is not None else "-",
            f"{f.disk_free_gb:.0f} GB" if f.disk_free_gb is not None else "-",
            f"{n.skew.seconds:+.2f} ±{n.skew.uncertainty:.2f} s" if n.skew is not None else "-", port,
        )
    return table
