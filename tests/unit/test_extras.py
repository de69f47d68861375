"""Without an extra's packages, a command names the extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shoal.extras import MissingExtra, need

# Makes one module impossible to import in a fresh interpreter, as on a machine
# where the extra that brings it was not installed.
BLOCK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == {blocked!r} or name.startswith({blocked!r} + "."):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Block())
"""


def test_need_names_the_extra():
    assert need("json", "node", "x").dumps(1) == "1"
    with pytest.raises(MissingExtra, match=r'a thing needs no_such_module_x.*pip install "shoal\[node\]"'):
        need("no_such_module_x", "node", "a thing")


def generate_without(blocked: str, model, input_path, output_path) -> subprocess.CompletedProcess:
    """`shoal generate` in a fresh interpreter where `blocked` cannot be imported."""
    code = BLOCK.format(blocked=blocked) + (
        "from shoal.cli import main\n"
        f"raise SystemExit(main(['generate', '--model', {str(model)!r}, '--input', {str(input_path)!r},"
        f" '--output', {str(output_path)!r}]))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_local_cluster_without_the_node_extra_says_what_to_install(tiny_model, tmp_path):
    (tmp_path / "in.jsonl").write_text('{"id": 1, "prompt": "hi"}\n')
    run = generate_without("etcd3", tiny_model, tmp_path / "in.jsonl", tmp_path / "out.jsonl")
    assert run.returncode == 2, run.stderr
    assert 'pip install "shoal[node]"' in run.stderr and "etcd3" in run.stderr


def test_parquet_input_without_pyarrow_says_what_to_install(tiny_model, tmp_path):
    (tmp_path / "in.parquet").write_bytes(b"PAR1")  # never read: the import fails first
    run = generate_without("pyarrow", tiny_model, tmp_path / "in.parquet", tmp_path / "out.jsonl")
    assert run.returncode == 2, run.stderr
    assert "reading Parquet needs pyarrow" in run.stderr and 'pip install "shoal[node]"' in run.stderr
