"""The Ray backend's cluster model: ``backend: ray`` and its ``ray:`` section (Ray places the nodes)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from launcher.spec.base import Strict
from launcher.spec.cluster import ClusterSpec
from launcher.spec.fields import FiniteFloat, Line


class RaySpec(Strict):
    address: Line = Field("auto", description="'auto' on a cluster node, or ray://HOST:10001.")
    placement_timeout: FiniteFloat = Field(60.0, gt=0, le=86400, description="Seconds to wait for the placement group.")
    cpus_per_node: FiniteFloat | None = Field(
        None, gt=0, le=65536, description="CPUs each node bundle asks for (default: nproc).",
    )


class RayCluster(ClusterSpec):
    """An existing Ray cluster: one placement-group bundle a job node (``nodes``, if listed, are not used)."""

    backend: Literal["ray"]
    ray: RaySpec = RaySpec()
