"""`launch clean`: this user's run directories on a cluster's nodes, those no agent runs in, removed.

Each node agent keeps its job's run directory (journal, record, pid and contact files, the ranks' directory) after
the job ends, so that `launch attach --cluster` can read an ended job back into another store. They are removed
by every new agent of the same user on that node once untouched for 7 days (``launcher.node.follow.RETENTION_S``),
or now by this command (docs/JOURNALS.md "Run directories").
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from launcher.backends import get_backend
from launcher.node.protocol import CleanRequest
from launcher.spec.cluster import ClusterSpec


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
