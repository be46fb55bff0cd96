"""A restart re-planned: without a host that failed first in two attempts (``leave_out_failed_nodes``), or an
elastic job's next attempt on the nodes left (``run.elastic``). The supervisor goes on with what is returned."""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

from launcher.backends.base import Backend, Preflight
from launcher.backends.failures import Failure
from launcher.errors import LaunchError
from launcher.plan.planner import Plan
from launcher.run.elastic import Lost
from launcher.run.elastic import Replanner as ElasticReplanner
from launcher.run.restarts import node_at_fault
from launcher.store.db import Store

#: re-plans a restart without the hosts given: (the plan, its backend); LaunchError when it cannot
Replanner = Callable[[Plan, frozenset[str]], tuple[Plan, Backend]]


@dataclass(frozen=True)
class Moved:
    """The next attempt's plan and backend, how a scheduler's allocation re-plans it (None: as before), and the
    event that says what changed."""

    plan: Plan
    backend: Backend
    place: Callable[[Plan, Preflight], Plan] | None
    kind: str
    text: str
    data: dict


def without_twice_failed(failure: Failure, plan: Plan, first_failures: collections.Counter[str],
                         replan: Replanner) -> Moved | str | None:
    """Count a node's own failure (``restarts.node_at_fault``, with an exit code) against its host; at its second,
    re-plan without every host that failed first twice. A problem text if that fails; None: nothing moves."""
    if not node_at_fault(failure) or failure.exit_code is None:
        return None
    host = failure.host or plan.nodes[failure.node or 0].host
    first_failures[host] += 1
    if first_failures[host] < 2:
        return None
    left_out = frozenset(h for h, count in first_failures.items() if count >= 2)
    try:
        smaller, backend = replan(plan, left_out)
    except LaunchError as exc:
        return f"{host} failed first in two attempts and was left out, but the job cannot restart without it: {exc}"
    return Moved(smaller, backend, None, "node_left_out",
                 f"{host} failed first in two attempts: left out; restarting on {', '.join(n.host for n in smaller.nodes)}",
                 {"host": host, "nodes": [n.host for n in smaller.nodes]})


def on_nodes_left(failure: Failure | None, plan: Plan, attempt: int, store: Store,
                  elastic: ElasticReplanner) -> Moved | str:
    """An elastic job's next attempt re-planned without the node ``attempt`` lost; a problem text if it cannot go on."""
    lost = Lost()
    if node_at_fault(failure):
        assert failure is not None
        steps = [r.step for r in store.metrics(plan.job_id) if r.attempt == attempt]
        lost = Lost(failure.host or plan.nodes[failure.node or 0].host, max(steps, default=None))
    try:
        shrunk = elastic(plan, lost, attempt + 1)
    except LaunchError as exc:
        return f"not restarted on fewer nodes: {exc}"
    return Moved(shrunk.plan, shrunk.backend, shrunk.place, "elastic_restart", shrunk.message, shrunk.data)
