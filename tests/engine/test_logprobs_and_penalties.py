"""Logprobs against transformers' logits; penalties, logit bias and min_tokens against
plain-Python references."""

from __future__ import annotations

import random

import pytest
import torch

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.nodes.worker.logits_processing import apply_penalties, mask_ends
from shoal.nodes.worker.sequence import Sequence
from shoal.sampling import RequestError, SamplingParams
from tests.hf_reference import hf_step_logits


def prompts(n, seed=0):
    r = random.Random(seed)
    return [[r.randrange(511) for _ in range(r.randint(3, 40))] for _ in range(n)]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_are_log_softmax_of_transformers_logits(tiny_model, temperature):
    """Before temperature and top-p (vLLM's default): the model's own distribution."""
    eng = LLMEngine(tiny_model, EngineConfig())
    ps = prompts(3, seed=2)
    params = SamplingParams(max_tokens=10, ignore_eos=True, temperature=temperature, top_p=0.9, seed=4, logprobs=5)
    for p, out in zip(ps, eng.generate(ps, params)):
        ref = torch.log_softmax(hf_step_logits(tiny_model, p, out.token_ids), dim=-1)
        assert len(out.logprobs) == len(out.token_ids) == 10
        for j, (tok, entry) in enumerate(zip(out.token_ids, out.logprobs)):
            assert entry["token_id"] == tok and entry["token"] == eng.tokenizer.token_text(tok)
            assert entry["bytes"] == list(entry["token"].encode())
            assert entry["logprob"] == pytest.approx(ref[j, tok].item(), abs=2e-4)
            top = entry["top_logprobs"]
            assert len(top) == 5
            assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
            want = torch.topk(ref[j], 5).values.tolist()
            assert [t["logprob"] for t in top] == pytest.approx(want, abs=2e-4)
            for t in top:
                assert t["logprob"] == pytest.approx(ref[j, t["token_id"]].item(), abs=2e-4)


def test_logprobs_zero_gives_the_sampled_token_only(tiny_model):
    eng = LLMEngine(tiny_model, EngineConfig())
    out = eng.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True, logprobs=0))[0]
    assert all(e["top_logprobs"] == [] and e["logprob"] <= 0 for e in out.logprobs)
    plain = eng.generate([[1, 2, 3]], SamplingParams(max_tokens=4, ignore_eos=True))[0]
    assert plain.logprobs is None and plain.token_ids == out.token_ids


def _reference_penalties(logits, prompt, output, p: SamplingParams):
    x = logits.tolist()
    for t in set(output):
        x[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    for t in set(prompt) | set(output):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    return torch.tensor(x)


def test_penalties_match_a_plain_python_reference():
    vocab = 50
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, vocab, generator=g)
    seqs = [Sequence(i, [3, 4, 4, 9], SamplingParams(presence_penalty=pp, frequency_penalty=fp, repetition_penalty=rp),
                     output_token_ids=out)
            for i, (pp, fp, rp, out) in enumerate([(0.5, 0.0, 1.0, [1, 1, 2]), (0.0, 1.5, 1.0, [7, 7, 7, 3]),
                                                  (0.0, 0.0, 1.3, [1, 49]), (-0.7, 0.4, 0.8, [])])]
    out = logits.clone()
    apply_penalties(out, [0, 1, 2, 3], seqs)
    for i, s in enumerate(seqs):
        want = _reference_penalties(logits[i], s.prompt_token_ids, s.output_token_ids, s.params)
        assert torch.allclose(out[i], want, atol=1e-6), i


def test_penalties_before_any_output_and_beside_a_long_context():
    """No row has generated anything yet: presence and frequency change nothing. A row of
    a long context beside short ones counts each of its tokens (the ids go over flat)."""
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))
    fresh = [Sequence(i, [3], SamplingParams(presence_penalty=1.0, frequency_penalty=1.0)) for i in range(2)]
    out = logits.clone()
    apply_penalties(out, [0, 1], fresh)
    assert torch.equal(out, logits)
    seqs = [Sequence(0, [5] * 3000 + [6], SamplingParams(frequency_penalty=0.001), output_token_ids=[5] * 2000),
            Sequence(1, [7], SamplingParams(frequency_penalty=0.5), output_token_ids=[8])]
    out = logits.clone()
    apply_penalties(out, [0, 1], seqs)
    assert out[0, 5].item() == pytest.approx(logits[0, 5].item() - 2.0, abs=1e-5) and out[0, 6] == logits[0, 6]
    assert out[1, 8].item() == pytest.approx(logits[1, 8].item() - 0.5, abs=1e-6) and out[1, 7] == logits[1, 7]


def test_min_tokens_masks_the_end_unless_nothing_else_is_allowed():
    logits = torch.zeros(3, 8)
    logits[2, :] = float("-inf")
    logits[2, 7] = 0.0  # a row whose grammar allows only its end
    mask_ends(logits, [0, 2], [[7, 3], [7]])
    assert logits[0, 7] == logits[0, 3] == float("-inf") and logits[0, 0] == 0
    assert torch.equal(logits[1], torch.zeros(8))
    assert logits[2, 7] == 0.0


def test_min_tokens_and_logit_bias_in_the_engine(tiny_model):
    eng = LLMEngine(tiny_model, EngineConfig())
    eos = eng.model_cfg.eos_token_ids[0]
    # A bias of +100 makes the end token certain, except where min_tokens forbids it.
    out = eng.generate([[1, 2, 3]], SamplingParams(max_tokens=20, min_tokens=6, logit_bias={eos: 100}))[0]
    assert out.token_ids[-1] == eos and len(out.token_ids) == 7 and out.finish_reason == "stop"
    forced = eng.generate([[1, 2, 3]], SamplingParams(max_tokens=5, ignore_eos=True, logit_bias={"42": 100.0}))[0]
    assert forced.token_ids == [42] * 5
    with pytest.raises(RequestError, match="outside the vocabulary"):
        eng.add_request("x", prompt_token_ids=[1], params=SamplingParams(logit_bias={10**6: 1.0}))


def test_a_frequency_penalty_breaks_a_greedy_repetition(tiny_model):
    eng = LLMEngine(tiny_model, EngineConfig())
    p = [[5, 5, 5, 5]]
    plain = eng.generate(p, SamplingParams(max_tokens=24, ignore_eos=True))[0].token_ids
    penalized = eng.generate(p, SamplingParams(max_tokens=24, ignore_eos=True, frequency_penalty=2.0))[0].token_ids
    assert max(plain.count(t) for t in set(plain)) >= 10  # the random model loops on two tokens
    assert max(penalized.count(t) for t in set(penalized)) <= 2


@pytest.mark.parametrize("bad, match", [
    (dict(presence_penalty=3.0), "presence_penalty"), (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(logprobs=21), "logprobs"), (dict(min_tokens=9, max_tokens=4), "min_tokens"),
    (dict(logit_bias={1: 200}), "logit_bias"), (dict(choice=[]), "choice")])
def test_bad_settings_are_refused_by_name(bad, match):
    with pytest.raises(RequestError, match=match):
        SamplingParams(**bad).validate()
