"""Checking where a command will write, before any work starts."""

from __future__ import annotations

import os
from pathlib import Path


def check_output_file(path: str | Path) -> None:
    """Refuses an output file that could not be written: a missing or unwritable
    directory, or a directory where the file should be. Found at the end of a job, the
    job's results would be lost with its temporary cluster."""
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ValueError(f"output {p} is a directory; give a file name")
    if not parent.is_dir():
        raise ValueError(f"output directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"output {p} is not writable")
