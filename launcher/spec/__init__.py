"""Job and cluster specs: pydantic models and the YAML loader that keeps line numbers."""

from launcher.spec.cluster import ClusterSpec, NodeSpec
from launcher.spec.job import JobSpec
from launcher.spec.load import load_cluster, load_job

__all__ = ["ClusterSpec", "JobSpec", "NodeSpec", "load_cluster", "load_job"]
