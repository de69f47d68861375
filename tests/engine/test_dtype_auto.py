"""The engine's default dtype is `auto`: a bf16 checkpoint runs in bf16 where this CPU
has native bf16 and in fp32 (converted once at load) where it does not; the engine's
config, its stats and its calibration cache name the dtype that runs. The KV cache keeps
the checkpoint's bf16 either way, unless the user names the dtypes."""

from __future__ import annotations

import pytest
import torch

from shoal.nodes.worker import calibration
from shoal.nodes.worker.dtype_choice import cpu_native_bf16
from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.nodes.worker.models.make_model import make_model
from shoal.sampling import SamplingParams


def test_auto_is_the_default_and_names_what_runs(tmp_path):
    model = make_model(tmp_path / "m", preset="tiny", dtype="bfloat16", tokenizer_text_chars=20_000)
    eng = LLMEngine(model, EngineConfig(policy="mb"))
    want = "bfloat16" if cpu_native_bf16() else "float32"
    assert eng.config.dtype == want
    assert {p.dtype for p in eng.model.parameters()} == {getattr(torch, want)}
    assert eng.stats_snapshot()["dtype"] == want and eng.stats_snapshot()["dtype_reason"]
    assert f"-{want}-" in calibration.cache_path(eng, tmp_path).name
    out = eng.generate([[5, 6, 7]], [SamplingParams(max_tokens=3)])
    assert len(out[0].token_ids) == 3
    forced = LLMEngine(model, EngineConfig(policy="mb", dtype="float32"))
    assert forced.config.dtype == "float32" and forced.stats_snapshot()["dtype_reason"] == "--dtype float32"


def test_kv_cache_dtype_follows_the_choice(tmp_path):
    bf16 = make_model(tmp_path / "b", preset="tiny", dtype="bfloat16", tokenizer_text_chars=20_000)
    fp32 = make_model(tmp_path / "f", preset="tiny", dtype="float32", tokenizer_text_chars=20_000)
    cases = [  # (checkpoint, dtype, kv_cache_dtype) -> the cache's dtype
        (bf16, "auto", "auto", "bfloat16"),  # native bf16, or fp32 compute over the checkpoint's bf16
        (bf16, "float32", "auto", "float32"),  # asked for fp32: fp32 throughout
        (bf16, "auto", "float32", "float32"),
        (fp32, "auto", "auto", "float32"),
        (fp32, "float32", "bfloat16", "bfloat16"),
    ]
    for model, dtype, kv, want in cases:
        eng = LLMEngine(model, EngineConfig(policy="mb", dtype=dtype, kv_cache_dtype=kv, num_blocks=64))
        snap = eng.stats_snapshot()
        assert eng.cache.layers[0].dtype == getattr(torch, want), (dtype, kv)
        assert snap["kv_cache_dtype"] == want and snap["kv_cache_dtype_reason"], (dtype, kv)
        if want != eng.config.dtype:
            assert f"-kv{want}-" in calibration.cache_path(eng, tmp_path).name
        out = eng.generate([[5, 6, 7, 8]], [SamplingParams(max_tokens=4)])
        assert len(out[0].token_ids) == 4
    with pytest.raises(ValueError, match="unknown KV cache dtype 'float16'"):
        LLMEngine(fp32, EngineConfig(policy="mb", kv_cache_dtype="float16", num_blocks=64))
