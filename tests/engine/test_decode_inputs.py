"""A step of one token per sequence builds its inputs column by column
(`ModelRunner._decode_inputs`): the same tensors, key by key, as the row-by-row path
builds for those chunks, on both attention paths; and on a device no host tensor reaches
an op."""

from __future__ import annotations

import pytest
import torch

from shoal.nodes.worker.kv_cache import KVCache
from shoal.nodes.worker.model_runner import ModelRunner
from shoal.nodes.worker.ops_backend import TorchOps
from shoal.nodes.worker.sequence import Sequence
from shoal.sampling import SamplingParams


def decode_chunks(contexts: list[int], bs: int = 16, extra_block: int | None = None) -> list:
    chunks, next_block = [], 0
    for i, ctx in enumerate(contexts):
        prompt = list(range(3, 3 + max(1, ctx - 2)))
        seq = Sequence(i, prompt, SamplingParams(), output_token_ids=[7] * (ctx - len(prompt)))
        blocks = -(-ctx // bs) + (1 if i == extra_block else 0)
        # Blocks out of order, as a cache hands them out after some churn.
        seq.block_table = [(next_block + 5 * k) % 400 for k in range(blocks)]
        next_block += 1 + blocks
        seq.num_computed = ctx - 1
        chunks.append((seq, 1))
    return chunks


@pytest.mark.parametrize("ops", [None, TorchOps()], ids=["gather", "spans"])
def test_column_built_inputs_equal_the_row_built(tiny_model, ops):
    from shoal.nodes.worker.models.loader import load_decoder

    model, _ = load_decoder(tiny_model, "float32")
    runner = ModelRunner(model, KVCache(model.cfg, 400, 16, torch.float32), ops)
    chunks = decode_chunks([1, 17, 16, 33, 200, 5, 64])
    mask = [True] * len(chunks)
    fast_host, fast_meta, fast_rows = runner._decode_inputs(chunks, mask)
    host, meta, rows = runner._inputs(chunks, mask)
    assert fast_rows == rows == list(range(len(chunks)))
    assert set(fast_host) == set(host)
    for key in host:
        assert fast_host[key].dtype == host[key].dtype, key
        assert torch.equal(fast_host[key], host[key]), key
    for field in ("num_decodes", "span_max_len", "span_max_ctx", "decode_len"):
        assert getattr(fast_meta, field, None) == getattr(meta, field, None), field
    # A table longer than its context needs: left to the row path, which slices it.
    assert runner._decode_inputs(decode_chunks([20, 40], extra_block=1), [True, True]) is None
    # And the whole step gives the row path's logits.
    fast = runner.run(chunks, mask)[0]
    runner._decode_inputs = lambda *a: None
    torch.testing.assert_close(fast, runner.run(chunks, mask)[0], rtol=0, atol=0)


def test_a_decode_step_on_a_device_takes_no_host_tensor(tiny_model):
    from shoal.nodes.worker.models.loader import load_decoder
    from test_ops_backends import RejectMixedDevices

    model, _ = load_decoder(tiny_model, "float32", device="meta")
    runner = ModelRunner(model, KVCache(model.cfg, 400, 16, torch.float32, device="meta"), TorchOps())
    chunks = decode_chunks([9, 40, 17])
    mode = RejectMixedDevices("meta")
    with mode:
        logits, rows = runner.run(chunks, [True] * 3)
    assert logits.shape == (3, model.cfg.vocab_size) and rows == [0, 1, 2]
    assert not mode.offenders, f"ops given host tensors beside device ones: {sorted(set(mode.offenders))}"
    assert mode.transfers == 1
