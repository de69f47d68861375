"""Storage opens only paths under its data roots, links followed."""

from __future__ import annotations

import pytest

from shoal.nodes.data_roots import DataRoots
from shoal.protocol.errors import ProtocolError


def test_paths_under_a_root_only(tmp_path):
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "in.jsonl").write_text("{}\n")
    roots = DataRoots([root])
    assert roots.check(root / "sub" / "in.jsonl", "input file") == (root / "sub" / "in.jsonl").resolve()
    assert roots.check(root / "not-yet", "output directory") == (root / "not-yet").resolve()
    for outside in (tmp_path / "other.jsonl", root / ".." / "data2", "/etc/passwd"):
        with pytest.raises(ProtocolError, match="outside this storage node's data roots") as e:
            roots.check(outside, "input file")
        assert e.value.code == "forbidden"
    (root / "link").symlink_to("/etc")  # a link out of the root is outside it
    with pytest.raises(ProtocolError, match="outside"):
        roots.check(root / "link" / "passwd", "input file")
    with pytest.raises(ProtocolError, match="none: start storage with --data-root"):
        DataRoots([]).check(root / "sub" / "in.jsonl", "input file")
