"""Why Ray has not placed a job's placement group: the bundles it asks for against the nodes and resources the
cluster has, for the error once ``ray.placement_timeout`` has passed and the message while waiting.
"""

from __future__ import annotations

from collections.abc import Mapping

from launcher.plan.planner import Plan

UNPLACED_HINT = (
    "lower resources.nproc_per_node (or ray.cpus_per_node), add nodes to the Ray cluster, "
    "free what other work holds, or raise ray.placement_timeout"
)


def why_unplaced(ray, plan: Plan, bundle: dict[str, float], timeout: float) -> str:
    """Why the group was not placed: what it asked for against what the cluster has."""
    alive = [n for n in ray.nodes() if n.get("Alive")]
    fitting = [n for n in alive if all(n["Resources"].get(k, 0) >= v for k, v in bundle.items())]
    if len(alive) < plan.nnodes:
        missing = f"the cluster has {len(alive)} alive node(s), {plan.nnodes - len(alive)} too few"
    elif not fitting:
        missing = f"no node has {resource_text(bundle)} in total"
    elif len(fitting) < plan.nnodes:
        missing = f"only {len(fitting)} node(s) have {resource_text(bundle)} in total"
    else:
        missing = "enough nodes exist, but other work holds their resources"
    nodes = "; ".join(f"{n['NodeManagerAddress']} {resource_text(n['Resources'])}" for n in alive) or "none"
    return (
        f"Ray could not place the job within {timeout:.0f} s (ray.placement_timeout): it asks for "
        f"{plan.nnodes} bundle(s) of {resource_text(bundle)}, each on a different node (STRICT_SPREAD), and {missing}. "
        f"Nodes (total resources): {nodes}. Available now: {resource_text(ray.available_resources(), bundle)}. "
        "Nothing was started and the placement group was removed."
    )


def resource_text(resources: Mapping[str, float], keys: Mapping[str, float] | None = None) -> str:
    """CPU and GPU of a resource map as ``{CPU: 2, GPU: 8}`` (the ``keys`` ones, 0 when absent)."""
    names = sorted(keys) if keys else [k for k in ("CPU", "GPU") if k in resources]
    return "{" + ", ".join(f"{k}: {resources.get(k, 0):g}" for k in names) + "}"
