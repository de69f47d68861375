"""Shoal: batch inference for iterative retrieval workloads."""

from shoal.client import Client, Job  # noqa: F401
from shoal.local_cluster import LocalCluster  # noqa: F401

__all__ = ["Client", "Job", "LocalCluster"]
__version__ = "0.1.0"
