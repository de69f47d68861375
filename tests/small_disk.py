"""A small filesystem of its own for a test to fill: a tmpfs mounted on a folder (needs
root, as the partition test's namespaces do; tests using it are marked `mounts`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


class SmallDisk:
    def __init__(self, path: Path, size_bytes: int):
        self.path = Path(path)
        self.size = size_bytes
        self.filler = self.path / "filler.bin"

    def __enter__(self) -> "SmallDisk":
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.path)], check=True,
                       capture_output=True)
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)

    def free(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize

    def fill(self, leave: int = 0) -> None:
        """Writes a filler file until `leave` bytes (rounded to pages) stay free."""
        with open(self.filler, "ab", buffering=0) as fh:
            while (room := self.free() - leave) > 0:
                try:
                    fh.write(b"\0" * min(room, 1 << 20))
                except OSError:  # full
                    break

    def free_up(self) -> None:
        self.filler.unlink(missing_ok=True)
