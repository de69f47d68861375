"""Bad models and bad requests get clear errors; the engine keeps serving the rest."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.nodes.worker.models.config import ModelError
from shoal.sampling import RequestError, SamplingParams


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        LLMEngine(tmp_path)


def test_missing_folder(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        LLMEngine(tmp_path / "nope")


def test_unsupported_architecture(tiny_model, tmp_path):
    d = copy_model(tiny_model, tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["MambaForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="unsupported architecture.*MambaForCausalLM"):
        LLMEngine(d)


def test_missing_tensor(tiny_model, tmp_path):
    d = copy_model(tiny_model, tmp_path / "m")
    w = load_file(d / "model.safetensors")
    del w["model.layers.1.mlp.up_proj.weight"]
    save_file(w, d / "model.safetensors")
    with pytest.raises(ModelError, match="missing tensor model.layers.1.mlp.up_proj.weight"):
        LLMEngine(d)


def test_misshaped_tensor(tiny_model, tmp_path):
    d = copy_model(tiny_model, tmp_path / "m")
    w = load_file(d / "model.safetensors")
    w["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(3, 64)
    save_file(w, d / "model.safetensors")
    with pytest.raises(ModelError, match=r"model.layers.0.self_attn.k_proj.weight has shape \(3, 64\), expected \(32, 64\)"):
        LLMEngine(d)


def test_no_safetensors(tiny_model, tmp_path):
    d = copy_model(tiny_model, tmp_path / "m")
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelError, match="no \\*.safetensors"):
        LLMEngine(d)


def test_corrupt_safetensors(tiny_model, tmp_path):
    d = copy_model(tiny_model, tmp_path / "m")
    (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ModelError, match="cannot read"):
        LLMEngine(d)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt_token_ids=[]), "empty prompt"),
        (dict(prompt=""), "empty prompt"),
        (dict(prompt_token_ids=[1] * 2048), "prompt of 2048 tokens does not fit the model's context of 2048"),
        (dict(prompt_token_ids=[1, 99999]), "token id 99999 outside the vocabulary"),
        (dict(prompt_token_ids=[1], params=SamplingParams(max_tokens=0)), "max_tokens must be a positive integer"),
        (dict(prompt_token_ids=[1], params=SamplingParams(max_tokens=-3)), "max_tokens must be a positive integer"),
        (dict(prompt_token_ids=[1], params=SamplingParams(top_p=0.0)), "top_p"),
        (dict(prompt_token_ids=[1], params=SamplingParams(temperature=-1.0)), "temperature"),
        (dict(), "give a prompt or prompt_token_ids"),
    ],
)
def test_bad_request_is_refused_and_others_continue(tiny_model, kwargs, message):
    eng = LLMEngine(tiny_model, EngineConfig())
    eng.add_request("good-1", prompt_token_ids=[5, 6, 7], params=SamplingParams(max_tokens=5, ignore_eos=True))
    with pytest.raises(RequestError, match=message) as info:
        eng.add_request("bad", **kwargs)
    assert "'bad'" in str(info.value)  # the error names the sequence
    eng.add_request("good-2", prompt="hello world", params=SamplingParams(max_tokens=5, ignore_eos=True))
    done = {}
    while eng.has_unfinished():
        done.update({o.seq_id: o for o in eng.step()})
    assert sorted(done) == ["good-1", "good-2"]
    assert all(len(o.token_ids) == 5 for o in done.values())


def test_duplicate_sequence_id(tiny_model):
    eng = LLMEngine(tiny_model, EngineConfig())
    eng.add_request("a", prompt_token_ids=[1, 2])
    with pytest.raises(RequestError, match="already in the engine"):
        eng.add_request("a", prompt_token_ids=[3])


def test_generation_stops_at_context_end(tiny_model):
    eng = LLMEngine(tiny_model, EngineConfig())
    out = eng.generate([[1] * 2040], SamplingParams(max_tokens=100, ignore_eos=True))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 8


def test_stop_strings_and_stop_tokens(tiny_model):
    eng = LLMEngine(tiny_model, EngineConfig())
    free = eng.generate([[9, 8, 7]], SamplingParams(max_tokens=30, ignore_eos=True))[0]
    text = free.text
    # Stop at a string that the free run produced: the text is cut before it.
    needle = text[len(text) // 2 : len(text) // 2 + 2]
    assert needle
    out = eng.generate([[9, 8, 7]], SamplingParams(max_tokens=30, ignore_eos=True, stop=[needle]), seq_ids=["s"])[0]
    assert out.finish_reason == "stop" and needle not in out.text and text.startswith(out.text)
    tok = free.token_ids[4]
    out = eng.generate([[9, 8, 7]], SamplingParams(max_tokens=30, ignore_eos=True, stop_token_ids=[tok]), seq_ids=["t"])[0]
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: free.token_ids.index(tok) + 1]


def test_sequence_longer_than_the_cache_ends_instead_of_spinning(tiny_model):
    # 4 blocks of 16 tokens: a 20-token prompt asking for 100 tokens can never fit.
    eng = LLMEngine(tiny_model, EngineConfig(num_blocks=4, block_size=16, policy="mb"))
    outs = eng.generate([[3] * 20, [4] * 10], SamplingParams(max_tokens=100, ignore_eos=True))
    assert [o.finish_reason for o in outs] == ["length", "length"]
    assert len(outs[0].token_ids) == 64 - 20 and len(outs[1].token_ids) == 64 - 10
    with pytest.raises(RequestError, match="needs more KV blocks"):
        eng.add_request("big", prompt_token_ids=[1] * 64)
