"""The engine's default dtype is `auto`: a bf16 checkpoint runs in bf16 where this CPU
has native bf16 and in fp32 (converted once at load) where it does not; the engine's
config, its stats and its calibration cache name the dtype that runs."""

from __future__ import annotations

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
