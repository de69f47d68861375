import torch

from shoal.nodes.worker.sampler import sample, sequence_key, uniform
from shoal.sampling import SamplingParams


def test_uniform_is_a_pure_function_of_its_key():
    k = sequence_key("seq-1")
    assert uniform(1, k, 0, 5) == uniform(1, k, 0, 5)
    draws = {uniform(1, k, 0, p) for p in range(1000)}
    assert len(draws) == 1000 and all(0.0 <= u < 1.0 for u in draws)
    assert abs(sum(draws) / 1000 - 0.5) < 0.05
    assert uniform(2, k, 0, 5) != uniform(1, k, 0, 5) != uniform(1, k, 1, 5)


def test_top_k_one_is_greedy_and_top_p_keeps_the_head():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    for u in (0.0, 0.5, 0.999):
        assert sample(logits, [SamplingParams(temperature=1.0, top_k=1)], [u])[0] == [1]
        # p(1) ~ 0.64 < 0.7: top_p 0.7 keeps tokens 1 and 3 only.
        assert sample(logits, [SamplingParams(temperature=1.0, top_p=0.7)], [u])[0][0] in (1, 3)


def test_inverse_cdf_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    p = SamplingParams(temperature=1.0)
    assert sample(logits, [p], [0.1])[0] == [0]
    assert sample(logits, [p], [0.6])[0] == [1]
    assert sample(logits, [p], [0.9])[0] == [2]


def test_margins_are_top_two_gaps():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 4.5, 0.0]])
    _, m, _ = sample(logits, [SamplingParams(return_margins=True)] * 2, [0.0, 0.0])
    assert torch.allclose(m, torch.tensor([2.0, 0.5]))


def flat_logits(vocab=30522, rows=1, seed=0):
    """A random model's logits: nearly flat over a large vocabulary (as W3's decoder)."""
    g = torch.Generator().manual_seed(seed)
    return 0.3 * torch.randn(rows, vocab, generator=g)


def test_rounding_changes_a_draw_only_at_a_cdf_boundary():
    """The failure of issue 15: logits that differ by rounding (~1e-6) pick another token
    only when the uniform lies within the rounding of a boundary of the token's CDF
    interval. Ordering the CDF by probability broke this (adjacent tokens swapped by a
    1e-7 change carry the uniform to another token from anywhere in their interval):
    that sampler changed 41 of these 1000 draws, far from any boundary."""
    from shoal.output_compare import DRAW_FP32_TOL

    logits = flat_logits()
    noisy = logits + 1e-6 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=0.8, top_p=0.9, return_margins=True)
    changed = 0
    for j in range(1000):
        u = uniform(11, sequence_key("flat"), 0, j)
        (a,), _, da = sample(logits, [params], [u])
        (b,), _, db = sample(noisy, [params], [u])
        assert da[0].lo <= u < da[0].hi and db[0].lo <= u < db[0].hi
        if a != b:
            changed += 1
            edge = min(u - da[0].lo, da[0].hi - u, da[0].cut)
            assert edge < DRAW_FP32_TOL, f"draw {j}: token {a} vs {b} with u {edge:.2e} from any boundary"
    assert changed <= 3, changed


def test_a_near_tie_swap_does_not_move_the_draw():
    """Two tokens 3e-7 apart in tempered logit (the pair seen in the drained-worker test:
    88 and 449), swapped by rounding: the uniform lands in the same token either way."""
    logits = flat_logits(vocab=512, seed=2)
    logits[0, 88], logits[0, 449] = 2.6421390, 2.6421387
    swapped = logits.clone()
    swapped[0, 88], swapped[0, 449] = 2.6421387, 2.6421390
    p = SamplingParams(temperature=0.8)
    probs = torch.softmax(logits[0].double() / 0.8, dim=-1)
    cdf = torch.cumsum(probs, dim=-1)
    for tok in (88, 449):  # uniforms in the middle of each of the two tokens' intervals
        u = float(cdf[tok] - probs[tok] / 2)
        assert sample(logits, [p], [u])[0] == sample(swapped, [p], [u])[0] == [tok]


def test_a_draw_records_its_interval_and_cut():
    logits = torch.log(torch.tensor([[0.1, 0.4, 0.2, 0.3]]))
    (tok,), _, d = sample(logits, [SamplingParams(temperature=1.0, return_margins=True)], [0.35])
    # In id order the CDF is 0.1 | 0.5 | 0.7 | 1.0: 0.35 falls in token 1's interval.
    assert tok == 1 and abs(d[0].lo - 0.1) < 1e-6 and abs(d[0].hi - 0.5) < 1e-6 and d[0].cut is None
    # top_p just under 0.7 keeps 0.4 and 0.3; 0.7 of the mass lies before 0.2, so the
    # cut is 1e-7 from keeping it too.
    (tok,), _, d = sample(logits, [SamplingParams(temperature=1.0, top_p=0.6999999, return_margins=True)], [0.9])
    assert tok == 3 and abs(d[0].lo - 0.4 / 0.7) < 1e-6 and abs(d[0].hi - 1.0) < 1e-9
    assert d[0].cut < 1e-6
    (tok,), _, d = sample(logits, [SamplingParams(temperature=1.0, top_k=2, return_margins=True)], [0.9])
    assert tok == 3 and abs(d[0].cut - (torch.log(torch.tensor(0.3)) - torch.log(torch.tensor(0.2))).item()) < 1e-6


def test_sampled_rows_drawn_in_chunks_draw_what_they_draw_together():
    """The draw's [rows, vocab] float64 tensors are bounded by drawing the sampled rows a
    chunk at a time (1,024 rows of a 152k vocabulary would otherwise hold 12 GB of a GPU):
    every chunking gives the same tokens, intervals and cuts, greedy rows untouched."""
    from shoal.nodes.worker.sampler import SAMPLE_CHUNK_BYTES, chunk_rows, pick

    rows = 23
    logits = flat_logits(vocab=2000, rows=rows, seed=3) * 4
    kinds = [SamplingParams(), SamplingParams(temperature=0.8), SamplingParams(temperature=1.0, top_k=40),
             SamplingParams(temperature=1.3, top_p=0.9), SamplingParams(temperature=0.7, top_k=100, top_p=0.5)]
    params = [kinds[i % len(kinds)] for i in range(rows)]
    us = [uniform(7, sequence_key(f"s{i}"), 0, i) for i in range(rows)]
    whole, _, (r0, lo0, hi0, cut0) = pick(logits, params, us, rows_per_chunk=rows)
    assert r0 == [i for i in range(rows) if i % len(kinds)]
    for step in (1, 2, 5, 7):
        got, _, (r, lo, hi, cut) = pick(logits, params, us, rows_per_chunk=step)
        assert r == r0 and torch.equal(got, whole)
        assert torch.equal(lo, lo0) and torch.equal(hi, hi0) and torch.equal(cut, cut0)
    assert torch.equal(whole[::len(kinds)], logits[::len(kinds)].argmax(-1))
    assert (cut0 < float("inf")).sum() == len([p for p in params if p.top_k or p.top_p < 1.0])
    assert chunk_rows(151_936) * 151_936 * 8 <= SAMPLE_CHUNK_BYTES < (chunk_rows(151_936) + 1) * 151_936 * 8
