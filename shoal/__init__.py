"""Shoal: batch inference for iterative retrieval workloads.

`shoal.Client`, `shoal.Job`, `shoal.LocalCluster` and `shoal.ShoalError` (the base of
every error Shoal raises, with the protocol's code where one applies) load on first use
(PEP 562), so importing any part of the package (a pure policy in `shoal.scheduler`,
the protocol) loads nothing else: no ZeroMQ, no client, no etcd.
"""

from __future__ import annotations

import importlib

__all__ = ["Client", "Job", "LocalCluster", "ShoalError"]
__version__ = "0.1.0"

_LAZY = {"Client": "shoal.sdk.client", "Job": "shoal.sdk.client", "LocalCluster": "shoal.cluster.local_cluster",
         "ShoalError": "shoal.protocol.errors"}  # the base of every error Shoal raises on purpose


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shoal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once loaded, a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
