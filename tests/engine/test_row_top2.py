"""The native greedy pick (`row_top2`) against torch's argmax and topk(2), and the
sampler's choices with and without it."""

from __future__ import annotations

import pytest
import torch

from native_builds import builds, load
from shoal.nodes.worker.sampler import sample
from shoal.sampling import SamplingParams

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", params=builds())
def kernel(request):
    return load(request.param)


def cases() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = [torch.randn(rows, vocab, generator=g) for rows, vocab in ((1, 2), (3, 17), (128, 32000), (5, 30522))]
    tied = torch.randn(4, 100, generator=g)
    tied[0, [7, 70]] = 9.0  # a maximum twice: the first index, margin 0
    tied[1, [3, 99]] = 9.0
    tied[2, :] = 1.0  # all equal
    tied[3, 50:] = float("-inf")
    tied[3, 99] = 4.0  # the maximum in the scalar tail
    out.append(tied)
    rounded = torch.randn(64, 1000, generator=g).bfloat16().float()  # many exact ties, as bf16 logits have
    out.append(rounded)
    return out


def test_row_top2_matches_torch(kernel):
    for logits in cases():
        ids, margins = kernel.row_top2(logits)
        top2 = torch.topk(logits, 2, dim=-1).values
        assert torch.equal(ids, logits.argmax(dim=-1)), f"ids differ on {tuple(logits.shape)}"
        assert torch.equal(margins, top2[:, 0] - top2[:, 1]), f"margins differ on {tuple(logits.shape)}"


def test_row_top2_reads_bf16_as_its_fp32_copy(kernel):
    for logits in cases():
        if not torch.isfinite(logits).all():
            continue
        low = logits.bfloat16()
        ids, margins = kernel.row_top2(low)
        want_ids, want_margins = kernel.row_top2(low.float())
        assert margins.dtype == torch.float32
        assert torch.equal(ids, want_ids) and torch.equal(ids, low.float().argmax(dim=-1))
        assert torch.equal(margins, want_margins), f"margins differ on {tuple(logits.shape)}"


def test_row_top2_rejects_bad_input(kernel):
    with pytest.raises(RuntimeError, match="row_top2"):
        kernel.row_top2(torch.randn(4, 10).half())
    with pytest.raises(RuntimeError, match="row_top2"):
        kernel.row_top2(torch.randn(10))


def test_sampler_picks_the_same_with_the_native_op(kernel):
    logits = torch.randn(6, 500, generator=torch.Generator().manual_seed(1)).bfloat16().float()
    params = [SamplingParams(return_margins=True), SamplingParams(), SamplingParams(temperature=0.8, seed=3),
              SamplingParams(return_margins=True, temperature=1.2, top_k=20, seed=4), SamplingParams(),
              SamplingParams(return_margins=True, top_p=0.9, temperature=0.7, seed=5)]
    us = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    want = sample(logits, params, us)
    for got in (sample(logits, params, us, kernel.row_top2), sample(logits.bfloat16(), params, us, kernel.row_top2),
                sample(logits.bfloat16(), params, us)):
        assert got[0] == want[0]
        assert torch.equal(got[1], want[1])
        assert {i: d.to_list() for i, d in got[2].items()} == {i: d.to_list() for i, d in want[2].items()}
