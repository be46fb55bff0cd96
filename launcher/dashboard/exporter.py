"""``GET /metrics``: the store's jobs and the cluster's leases in Prometheus' text format (``prometheus-client``).

Every series of a job carries ``job_id`` (``job`` is Prometheus' own: the scrape's) and ``user`` (who submitted it, as
the store recorded it; the store's owner for a job stored before launch recorded that); its name, cluster, backend and
strategy are on ``launch_job_info`` alone. Label sets are bounded: the newest ``JOBS`` jobs, the states this launch
knows, and per rank only when a scrape asks for it (``?ranks=1``). With a cluster file, each node's GPUs or slots: how
many there are, and how many each job of each user holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from launcher.backends import leasing
from launcher.dashboard.data import submitter
from launcher.metrics.record import RankUsage
from launcher.run import status
from launcher.run.queue import NodeQueue
from launcher.store.db import Store
from launcher.store.states import JobState
from launcher.views.jobstatus import JobStatus

#: The newest jobs exported: a store keeps every job it ran; Prometheus needs only those of now.
JOBS = 50
#: The text format Prometheus scrapes (0.0.4).
CONTENT_TYPE = CONTENT_TYPE_LATEST
MIB = 2**20


@dataclass(frozen=True)
class Scrape:
    """What one scrape reads: the store, its owner, per-rank series or not, and the cluster's leases (None: no
    cluster file)."""

    store: Store
    user: str
    per_rank: bool = False
    leases: list[NodeQueue] | None = None


def exposition(scrape: Scrape) -> bytes:
    """The text a scrape returns."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(scrape))
    return generate_latest(registry)


class _Collector(Collector):
    def __init__(self, scrape: Scrape) -> None:
        self.scrape = scrape

    def collect(self) -> Iterator[Metric]:
        yield from job_metrics(self.scrape.store, self.scrape.user, self.scrape.per_rank)
        if self.scrape.leases is not None:
            yield from lease_metrics(self.scrape.leases)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def job_metrics(store: Store, owner: str, per_rank: bool) -> Iterator[Metric]:
    """The figures of the newest ``JOBS`` jobs (their latest attempt), as `launch status` shows them; ``owner``: the
    store's, the user of a job stored before launch recorded who submitted it."""
    key = ["job_id", "user"]
    info = _gauge("launch_job_info", "A job of the store: its name, cluster, backend and strategy (always 1).",
                  key + ["name", "cluster", "backend", "strategy"])
    state = _gauge("launch_job_state", "1 for the job's state, 0 for the others.", key + ["state"])
    figures = {
        "step": _gauge("launch_job_step", "Optimizer steps done in the latest attempt.", key),
        "max_steps": _gauge("launch_job_max_steps", "The steps the job runs to, where known.", key),
        "attempt": _gauge("launch_job_attempt", "The job's attempt (0 first; restarts count up).", key),
        "ranks": _gauge("launch_job_ranks", "The job's world size.", key),
        "samples": _gauge("launch_job_samples_per_second", "Samples a second, all ranks together.", key),
        "tokens": _gauge("launch_job_tokens_per_second", "Tokens a second, all ranks together.", key),
        "step_time": _gauge("launch_job_step_time_seconds", "Step time over the ranks' steps (quantile 0.5, 0.95).",
                            key + ["quantile"]),
        "memory": _gauge("launch_job_peak_memory_bytes", "The largest peak memory of a rank (GPU memory on GPU nodes, "
                         "else the process tree's RSS).", key),
        "gpu": _gauge("launch_job_gpu_utilization_ratio", "Mean GPU utilisation of the ranks (0 to 1).", key),
        "loss": _gauge("launch_job_loss", "The latest loss reported.", key),
        "started": _gauge("launch_job_start_time_seconds", "When the job started (Unix time).", key),
    }
    rank_key = key + ["rank", "node"]
    ranks = {
        "samples": _gauge("launch_rank_samples_per_second", "A rank's samples a second (?ranks=1).", rank_key),
        "step_time": _gauge("launch_rank_step_time_seconds", "A rank's median step time (?ranks=1).", rank_key),
        "memory": _gauge("launch_rank_peak_memory_bytes", "A rank's peak memory (?ranks=1).", rank_key),
        "gpu": _gauge("launch_rank_gpu_utilization_ratio", "A rank's mean GPU utilisation (?ranks=1).", rank_key),
    }
    for shown in status.listed(store, JOBS):
        job, summary = shown.job, shown.summary
        labels = [job.id, submitter(job, owner)]
        info.add_metric(labels + [job.name or "", job.cluster or "", job.backend or "", job.strategy or ""], 1)
        for each in JobState:
            state.add_metric(labels + [each.value], 1 if job.state == each else 0)
        values = {"step": summary.steps, "max_steps": job.max_steps, "attempt": job.attempt or 0,
                  "ranks": job.world_size, "samples": summary.samples_per_sec, "tokens": summary.tokens_per_sec,
                  "memory": None if summary.peak_mem_mb is None else summary.peak_mem_mb * MIB,
                  "gpu": summary.gpu_util, "loss": summary.loss, "started": job.started_at}
        for name, value in values.items():
            if value is not None:
                figures[name].add_metric(labels, value)
        for quantile, ms in (("0.5", summary.step_time_ms_p50), ("0.95", summary.step_time_ms_p95)):
            if ms is not None:
                figures["step_time"].add_metric(labels + [quantile], ms / 1000)
        if per_rank:
            _rank_series(store, shown, labels, ranks)
    yield info
    yield state
    yield from figures.values()
    if per_rank:
        yield from ranks.values()


def _rank_series(store: Store, shown: JobStatus, labels: list[str], out: dict[str, GaugeMetricFamily]) -> None:
    attempt = shown.job.attempt or 0
    usage: dict[int, RankUsage] = {u.rank: u for u in store.samples(shown.job.id) if u.attempt == attempt}
    for rank in shown.summary.per_rank:
        where = labels + [str(rank.rank), "" if rank.node is None else str(rank.node)]
        if rank.samples_per_sec is not None:
            out["samples"].add_metric(where, rank.samples_per_sec)
        if rank.step_time_ms_p50 is not None:
            out["step_time"].add_metric(where, rank.step_time_ms_p50 / 1000)
        if rank.peak_mem_mb is not None:
            out["memory"].add_metric(where, rank.peak_mem_mb * MIB)
        sampled = usage.get(rank.rank)
        if sampled is not None and sampled.gpu_util_mean is not None:
            out["gpu"].add_metric(where, sampled.gpu_util_mean)


def lease_metrics(nodes: list[NodeQueue]) -> Iterator[Metric]:
    """Each node's GPUs or slots, and how many each job of each user holds (what `launch queue` shows)."""
    up = _gauge("launch_node_up", "1 where the node's leases could be read, else 0.", ["node", "kind"])
    capacity = _gauge("launch_node_devices", "The node's GPUs (kind gpu) or CPU slots (kind slot).", ["node", "kind"])
    free = _gauge("launch_node_devices_free", "The node's GPUs or slots no one holds.", ["node", "kind"])
    held = _gauge("launch_node_devices_held", "The node's GPUs or slots a job of a user holds.",
                  ["node", "kind", "job_id", "user"])
    for node in nodes:
        where = [node.host, node.kind]
        up.add_metric(where, 0 if node.error else 1)
        if node.error:
            continue
        capacity.add_metric(where, len(node.devices))
        holders: dict[tuple[str, str], int] = {}
        unheld = 0
        for device in node.devices:
            holder = device.get("holder")
            if isinstance(holder, dict):
                who = (leasing.clean(holder.get("job") or "-"), leasing.clean(holder.get("user") or "?"))
                holders[who] = holders.get(who, 0) + 1
            elif not device.get("foreign"):
                unheld += 1
        free.add_metric(where, unheld)
        for (job, user), count in sorted(holders.items()):
            held.add_metric(where + [job, user], count)
    yield from (up, capacity, free, held)
