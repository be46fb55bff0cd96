"""`launch check`: is this cluster ready to train? Every node at once, one table, one exit code.

Per node (in parallel): reachable; python, torch, deepspeed and NCCL versions
(read from package metadata, so nothing heavy is imported) with differences
between nodes flagged; driver, GPU count, free memory and processes already
on the GPUs; free disk in the workdir; clock skew; the rendezvous port free
on node 0 and reachable from every other node. Then, unless skipped, a short
all-reduce across the nodes (a real job: gloo on CPUs, NCCL on GPUs) with the
bandwidth measured.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from launcher.spec.cluster import ClusterSpec

# Runs on each node as `python -c FACTS REQUEST_JSON`: standard library only.
FACTS = r"""
import importlib.metadata as md, json, os, shutil, socket, subprocess, sys, time
req = json.loads(sys.argv[1])
def version(*names):
    for name in names:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            pass
    return None
def smi(query):
    try:
        done = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return [line.split(", ") for line in done.stdout.strip().splitlines()] if done.returncode == 0 else None
out = {"hostname": socket.gethostname(), "python": sys.version.split()[0],
       "torch": version("torch"), "deepspeed": version("deepspeed"),
       "nccl": version("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11")}
gpus = smi("--query-gpu=name,driver_version,memory.total,memory.used")
out["gpus"] = [{"name": g[0], "driver": g[1], "total_mb": float(g[2]), "used_mb": float(g[3])} for g in gpus or []]
apps = smi("--query-compute-apps=pid,used_memory")
out["gpu_processes"] = len(apps or [])
workdir = req["workdir"] if req["workdir"] and os.path.isdir(req["workdir"]) else None
out["workdir_ok"] = req["workdir"] is None or workdir is not None
out["disk_free_gb"] = shutil.disk_usage(workdir or os.path.expanduser("~")).free / 1e9
if req["port"]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("0.0.0.0", req["port"]))
        out["port_free"] = True
        if req["listen_s"]:
            sock.listen(64)
            sock.settimeout(req["listen_s"])
            print(json.dumps({"listening": True}), flush=True)
            deadline = time.time() + req["listen_s"]
            accepted = 0
            while time.time() < deadline and accepted < req["expect"]:
                try:
                    sock.accept()[0].close()
                    accepted += 1
                except socket.timeout:
                    break
            out["accepted"] = accepted
    except OSError:
        out["port_free"] = False
    sock.close()
if req["connect"]:
    try:
        socket.create_connection((req["connect"], req["port"]), timeout=5).close()
        out["reached"] = True
    except OSError as exc:
        out["reached"] = str(exc)
out["time"] = time.time()
print(json.dumps(out))
"""

SKEW_WARN_S = 2.0
DISK_WARN_GB = 10.0
COMPARED = ("python", "torch", "deepspeed", "nccl")


@dataclass
class NodeFacts:
    """What one node reported, or why it could not."""

    index: int
    host: str
    facts: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    skew_s: float | None = None


@dataclass
class CheckReport:
    nodes: list[NodeFacts]
    problems: list[str]
    warnings: list[str]
    bandwidth_gbps: float | None = None
    bandwidth_job: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def node_hosts(cluster: ClusterSpec) -> list[str]:
    """The hosts `launch check` covers: every node of an SSH cluster, or this machine."""
    return [n.host for n in cluster.nodes] if cluster.backend == "ssh" else ["localhost"]


def gather(cluster: ClusterSpec, port: int, listen_s: float = 8.0) -> list[NodeFacts]:
    """Run the facts script on every node in parallel; node 0 listens on ``port`` for ``listen_s``
    seconds and the others connect (``listen_s=0``: no reachability test)."""
    from concurrent.futures import ThreadPoolExecutor

    from launcher.backends.base import get_backend

    hosts = node_hosts(cluster)
    backend = get_backend(cluster.backend, cluster)
    python = cluster.python or "python3"
    master = cluster.nodes[0].address or cluster.nodes[0].host if cluster.backend == "ssh" else "127.0.0.1"
    try:
        def request(index: int) -> list[str]:
            reach = listen_s > 0 and len(hosts) > 1
            req = {"workdir": cluster.workdir, "port": port if index == 0 or reach else 0,
                   "listen_s": listen_s if reach and index == 0 else 0,
                   "expect": len(hosts) - 1, "connect": master if reach and index else None}
            return [python, "-c", FACTS, json.dumps(req)]

        def one(index: int) -> NodeFacts:
            if index and listen_s > 0:
                time.sleep(0.5)
            sent = time.time()
            code, out, err = backend.run_on_node(index, request(index), timeout=listen_s + 20)
            received = time.time()
            lines = [line for line in out.splitlines() if line.startswith("{") and '"listening"' not in line]
            if code != 0 or not lines:
                return NodeFacts(index, hosts[index], error=(err or out).strip()[-300:] or f"exit {code}")
            facts = json.loads(lines[-1])
            return NodeFacts(index, hosts[index], facts, skew_s=facts["time"] - (sent + received) / 2)

        with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
            return list(pool.map(one, range(len(hosts))))
    finally:
        backend.close()


def assess(nodes: list[NodeFacts], cluster: ClusterSpec) -> tuple[list[str], list[str]]:
    """Problems (the cluster cannot train) and warnings, from the gathered facts."""
    return node_problems(nodes, cluster) + version_differences(nodes), node_warnings(nodes)


def node_problems(nodes: list[NodeFacts], cluster: ClusterSpec) -> list[str]:
    """Per-node problems: unreachable, no torch, no workdir, port busy or unreachable."""
    problems = []
    for n in nodes:
        if n.error:
            problems.append(f"{n.host}: {n.error}")
            continue
        f = n.facts
        if not f["torch"]:
            problems.append(f"{n.host}: torch is not installed for {cluster.python or 'python3'}")
        if not f["workdir_ok"] and not cluster.sync_workdir:
            problems.append(f"{n.host}: workdir '{cluster.workdir}' does not exist")
        if n.index == 0 and f.get("port_free") is False:
            problems.append(f"{n.host}: rendezvous port is in use")
        if n.index and f.get("reached") not in (None, True):
            problems.append(f"{n.host}: cannot reach node 0 on the rendezvous port: {f['reached']}")
    return problems


def version_differences(nodes: list[NodeFacts]) -> list[str]:
    """One problem per package whose version differs between the nodes that answered."""
    reported = [n for n in nodes if not n.error]
    problems = []
    for key in COMPARED:
        if len({n.facts.get(key) for n in reported}) > 1:
            detail = ", ".join(f"{n.host}={n.facts.get(key)}" for n in reported)
            problems.append(f"{key} differs between nodes: {detail}")
    return problems


def node_warnings(nodes: list[NodeFacts]) -> list[str]:
    """Clock skew, low disk, processes already on the GPUs."""
    warnings = []
    for n in nodes:
        if n.error:
            continue
        f = n.facts
        if n.skew_s is not None and abs(n.skew_s) > SKEW_WARN_S:
            warnings.append(f"{n.host}: clock differs from this machine by {n.skew_s:+.1f} s")
        if f["disk_free_gb"] < DISK_WARN_GB:
            warnings.append(f"{n.host}: only {f['disk_free_gb']:.1f} GB free in the workdir")
        if f["gpu_processes"]:
            warnings.append(f"{n.host}: {f['gpu_processes']} process(es) already on the GPUs")
    return warnings


def consistency(cluster: ClusterSpec, port: int) -> CheckReport:
    """The part of the check that submit adds after a passed preflight on multi-node clusters:
    versions compared across nodes, and warnings (preflight covers the rest)."""
    nodes = gather(cluster, port, listen_s=0)
    problems = [f"{n.host}: {n.error}" for n in nodes if n.error] + version_differences(nodes)
    return CheckReport(nodes, problems, node_warnings(nodes))


def run_check(cluster: ClusterSpec, port: int, bandwidth: bool = True) -> CheckReport:
    """The whole check: facts, reachability, and (unless skipped) the all-reduce bandwidth."""
    nodes = gather(cluster, port)
    problems, warnings = assess(nodes, cluster)
    report = CheckReport(nodes, problems, warnings)
    if bandwidth and not problems:
        report.bandwidth_job, report.bandwidth_gbps, failure = allreduce_bandwidth(cluster)
        if failure:
            report.problems.append(f"all-reduce test failed: {failure}")
    return report


def allreduce_bandwidth(cluster: ClusterSpec) -> tuple[str, float | None, str | None]:
    """Run the all-reduce job (one process a node) and read its bus bandwidth from the store."""
    from launcher import orchestrate
    from launcher.spec.job import JobSpec
    from launcher.store import Store

    nodes = len(node_hosts(cluster)) if cluster.backend == "ssh" else 2
    job = JobSpec(
        name="launch-check",
        entrypoint=["python", "-m", "launcher.allreduce_bench"],
        batch={"micro_batch": 1},
        resources={"nodes": nodes, "nproc_per_node": 1},
        metrics={"every": 1},
        watch={"stall_timeout": 120, "grace_period": 2},
    )
    prepared = orchestrate.prepare_job(job, cluster)
    job_id, state = orchestrate.submit(prepared, detach=False, echo=None)
    if state != "SUCCEEDED":
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
        "nodes": [{"index": n.index, "host": n.host, "error": n.error, "skew_s": n.skew_s, **n.facts} for n in report.nodes],
    }


def report_table(report: CheckReport):
    """A rich table: one row per node."""
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for column in ("NODE", "HOST", "PYTHON", "TORCH", "DEEPSPEED", "NCCL", "GPUS", "FREE GPU MEM", "DISK FREE", "SKEW", "PORT"):
        table.add_column(column, no_wrap=True)
    for n in report.nodes:
        if n.error:
            table.add_row(str(n.index), n.host, f"[red]{n.error[:60]}[/]", *["-"] * 8)
            continue
        f = n.facts
        gpus = f["gpus"]
        free = sum(g["total_mb"] - g["used_mb"] for g in gpus) / 1024 if gpus else None
        port = "free" if f.get("port_free") else ("reached" if f.get("reached") is True else "-")
        table.add_row(
            str(n.index), f["hostname"], f["python"], f["torch"] or "[red]missing[/]", f["deepspeed"] or "-",
            f["nccl"] or "-", f"{len(gpus)} x {gpus[0]['name']}" if gpus else "0 (CPU)",
            f"{free:.0f} GiB" if free is not None else "-", f"{f['disk_free_gb']:.0f} GB",
            f"{n.skew_s:+.2f} s" if n.skew_s is not None else "-", port,
        )
    return table
