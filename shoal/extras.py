"""What to install when a feature's packages are missing: `pip install shoal` gives the
client; the `node` extra brings etcd's client and pyarrow, the `worker` extra torch.
A command that needs one says which, instead of failing later with a bare
ModuleNotFoundError or a node that never starts."""

from __future__ import annotations

import importlib

from shoal.protocol.errors import ShoalError


class MissingExtra(ShoalError, ImportError):
    """A feature needs packages an extra of Shoal brings, and they are not installed."""


def need(module: str, extra: str, what: str):
    """Imports `module`, or raises MissingExtra naming the extra that brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = e.name or module
        raise MissingExtra(f"{what} needs {missing}, which is not installed: pip install \"shoal[{extra}]\"") from None
