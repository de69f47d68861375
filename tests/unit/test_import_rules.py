"""The parts import only what the layering allows (import_rules.py), nothing imports
itself in a circle, and the light parts stay light: the scheduler's policies load no
ZeroMQ, the SDK loads no torch."""

from __future__ import annotations

import subprocess
import sys

from import_rules import cycles, violations


def _tree(tmp_path, files: dict[str, str]):
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_the_checker_finds_a_forbidden_arrow_and_a_cycle(tmp_path):
    root = _tree(tmp_path, {
        "protocol/__init__.py": "",
        "protocol/codec.py": "from shoal.nodes import node\n",  # the protocol imports nothing of Shoal
        "nodes/__init__.py": "",
        "nodes/node.py": "import shoal.nodes.storage.storage_node\n",
        "nodes/storage/storage_node.py": "def f():\n    from shoal.sdk.client import Client\n\nimport shoal.nodes.node\n",
        "shoal/__init__.py": "", "shoal/sdk/client.py": "", "transport/__init__.py": "", "scheduler/__init__.py": "",
    })
    found = violations(root)
    assert any("protocol/codec.py:1: protocol shoal.protocol.codec -> nodes shoal.nodes.node" in v for v in found)
    assert any("nodes/storage/storage_node.py:2: nodes shoal.nodes.storage.storage_node -> sdk shoal.sdk.client" in v for v in found)  # a late import counts
    assert cycles(root) == [["shoal.nodes.node", "shoal.nodes.storage.storage_node"]]


def test_the_repository_keeps_its_layering():
    assert violations() == []
    assert cycles() == []


def _loaded(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_policies_load_no_zmq_and_the_sdk_no_torch():
    policies = _loaded("import shoal.scheduler.core, shoal.scheduler.sim.cluster_sim, shoal.scheduler.step_planner")
    assert "zmq" not in policies and "shoal.sdk.client" not in policies
    sdk = _loaded("import shoal; shoal.Client; import shoal.sdk.embeddings")
    assert "torch" not in sdk and "shoal.sdk.client" in sdk
