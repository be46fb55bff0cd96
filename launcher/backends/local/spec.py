"""The local backend's cluster model: ``backend: local`` and its ``local:`` section."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from launcher.spec.base import Strict
from launcher.spec.cluster import ClusterSpec
from launcher.spec.fields import MAX_PROCS_PER_NODE


class LocalSpec(Strict):
    gpus: int | None = Field(None, ge=0, le=MAX_PROCS_PER_NODE,
                             description="GPUs on this machine (default: those nvidia-smi lists); 0 runs gloo on CPU slots.")
    slots: int | None = Field(None, ge=1, le=MAX_PROCS_PER_NODE,
                              description="Processes the machine takes without GPUs (default: the CPUs launch may use).")


class LocalCluster(ClusterSpec):
    """Every node of a job on this machine (the default when a cluster names no backend)."""

    backend: Literal["local"] = "local"
    local: LocalSpec = LocalSpec()

    @model_validator(mode="after")
    def _no_nodes(self) -> LocalCluster:
        if self.nodes:
            raise ValueError("backend 'local' runs on this machine: use 'local: {slots, gpus}', not 'nodes'")
        return self
