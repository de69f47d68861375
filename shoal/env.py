"""Every environment variable Shoal reads, in one place."""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    """Where a node keeps caches such as its device calibration (SHOAL_STATE_DIR)."""
    return Path(os.environ.get("SHOAL_STATE_DIR") or Path.home() / ".cache" / "shoal")
