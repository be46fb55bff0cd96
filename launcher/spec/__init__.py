"""Job and cluster specs: pydantic models and the YAML loader that keeps line numbers.

The names below load on first use, so a light module of this package (``files``) can be imported
without pydantic (``launch status`` reads LAUNCH_HOME through it).
"""

from __future__ import annotations

from typing import Any

__all__ = ["ClusterSpec", "JobSpec", "NodeSpec", "load_job"]


def __getattr__(name: str) -> Any:
    if name in ("ClusterSpec", "NodeSpec"):
        from launcher.spec import cluster

        return getattr(cluster, name)
    if name == "JobSpec":
        from launcher.spec.job import JobSpec

        return JobSpec
    if name == "load_job":
        from launcher.spec.load import load_job

        return load_job
    raise AttributeError(f"module 'launcher.spec' has no attribute {name!r}")
