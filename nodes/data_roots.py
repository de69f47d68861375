"""The folders a storage node may open when a request names a path (a job's input
file, an embedding corpus and its output, an index): a submitter must not make storage
read or reveal any file the node's user can read."""

from __future__ import annotations

from pathlib import Path

from shoal.protocol.errors import ProtocolError


class DataRoots:
    def __init__(self, roots: list[str | Path]):
        self.roots = [Path(r).resolve() for r in roots]

    def check(self, path: str | Path, what: str) -> Path:
        """The path, resolved (links followed), if it lies under a root; else a
        `forbidden` error that says nothing of whether it exists."""
        resolved = Path(path).resolve()
        if not any(resolved == r or r in resolved.parents for r in self.roots):
            where = ", ".join(map(str, self.roots)) if self.roots else "none: start storage with --data-root"
            raise ProtocolError(ProtocolError.FORBIDDEN, f"{what} {path} is outside this storage node's data roots ({where})")
        return resolved
