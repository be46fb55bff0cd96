"""A job's run directories on its nodes removed once filed (``collect``), and `launch clean`: this user's run
directories on a cluster's nodes, those no agent runs in, removed.

Each node agent keeps its job's run directory (journal, record, pid and contact files, the ranks' directory) while
a job store that followed the job there has not filed it: a supervisor that comes back, or `launch attach` of
another store, reads from it what it has not filed. The supervisor that files the job's end asks every node to
remove it (``collect``); the node does once every store that followed the job there has filed it. Those never
collected (a store that never came back, an unreachable node) are removed by every new agent of the same user on
that node once untouched for 7 days (``launcher.node.follow.RETENTION_S``; at most once an hour a node,
``SWEEP_EVERY_S``), or now by `launch clean`
(docs/JOURNALS.md "Run directories").
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from launcher.backends import get_backend
from launcher.node.protocol import CleanRequest
from launcher.plan.planner import Plan
from launcher.spec.cluster import ClusterSpec

if TYPE_CHECKING:
    from launcher.backends.base import Backend


@dataclass(frozen=True)
class NodeClean:
    """What one node answered: the job ids whose run directories went, those kept and why, or why not asked."""

    index: int
    host: str
    removed: tuple[str, ...] = ()
    kept: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def clean(cluster: ClusterSpec, older_than_s: float, job_id: str | None = None, dry_run: bool = False) -> list[NodeClean]:
    """Ask every node of ``cluster`` at once; one answer a node, in node order."""
    backend = get_backend(cluster)
    request = CleanRequest(job_id, older_than_s, dry_run)

    hosts = backend.planning.check_hosts()  # the cluster's hosts, once each (the local cluster: this machine)

    def one(index: int) -> NodeClean:
        host = hosts[index]
        answer, error = backend.clean(index, request)
        if answer is None:
            return NodeClean(index, host, error=(error or "no answer")[:300])
        if answer.get("error"):
            return NodeClean(index, host, error=str(answer["error"])[:300])
        removed, kept = answer.get("removed"), answer.get("kept")
        return NodeClean(index, host, tuple(str(name) for name in removed) if isinstance(removed, list) else (),
                         {str(name): str(why)[:300] for name, why in kept.items()} if isinstance(kept, dict) else {})

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts)))) as pool:
            return list(pool.map(one, range(len(hosts))))
    finally:
        backend.close()


def collect(backend: Backend, plan: Plan, store: str) -> list[str]:
    """The job store ``store`` has filed ``plan``'s job to its end: ask each host of ``plan`` (once a host) to remove
    the job's run directory there (``launcher.node.follow.collect``); what each host kept, and why, one line each."""
    first: dict[str, int] = {}
    for node in plan.nodes:
        first.setdefault(node.host, node.index)
    request = CleanRequest(plan.job_id, filed_by=store)

    def one(host: str, index: int) -> str | None:
        answer, error = backend.collect(plan, index, request)
        kept = answer.get("kept") if answer is not None else None
        if answer is None or not isinstance(kept, dict):
            return f"{host}: not asked ({(error or 'an unreadable answer')[:300]})"
        why = kept.get(plan.job_id)
        return f"{host}: {str(why)[:300]}" if why is not None else None

    with ThreadPoolExecutor(max_workers=max(1, min(32, len(first)))) as pool:
        said = list(pool.map(lambda item: one(*item), first.items()))
    return [line for line in said if line is not None]
