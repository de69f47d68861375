"""Constrained decoding in the engine: every output that ends with "stop" satisfies its
constraint, the masks are what the grammar allows, and a constrained sequence moved
mid-generation continues as if it had never moved."""

from __future__ import annotations

import random
import re

import jsonschema
import numpy as np
import orjson
import pytest
import torch

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.nodes.worker.logits_processing import apply_bitmask, unpack_bitmask, unpack_words
from shoal.output_compare import compare_outputs
from shoal.protocol.sequence_state import SequenceState
from shoal.sampling import RequestError, SamplingParams

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "kind"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "kind": {"enum": ["cat", "dog", "fish"]}}}
REGEX = r"[0-9]{3}-[a-z]{2,4}"
CHOICES = ["yes", "no", "it depends"]


def prompts(n, seed=0):
    r = random.Random(seed)
    return [[r.randrange(511) for _ in range(r.randint(3, 40))] for _ in range(n)]


def test_bitmask_application_matches_a_brute_force_reference():
    rng = np.random.default_rng(0)
    for vocab in (1, 31, 32, 33, 100):
        words = (vocab + 31) // 32
        mask = rng.integers(-(2**31), 2**31, size=(3, words), dtype=np.int64).astype(np.int32)
        logits = torch.randn(5, vocab)
        rows = [4, 0, 2]
        out = logits.clone()
        apply_bitmask(out, rows, mask)
        for k, r in enumerate(rows):
            for t in range(vocab):
                allowed = (int(mask[k, t // 32]) >> (t % 32)) & 1
                assert out[r, t] == (logits[r, t] if allowed else float("-inf"))
        for r in (1, 3):  # rows not named are untouched
            assert torch.equal(out[r], logits[r])
        # The GPU's unpacking (shifts on the device) gives the CPU's (numpy's) bits.
        assert torch.equal(unpack_words(torch.from_numpy(mask), vocab), unpack_bitmask(mask, vocab, "cpu"))


def test_the_mask_allows_exactly_the_tokens_that_keep_a_choice_reachable(tiny_model):
    """Brute force over the whole vocabulary: a token is allowed at the start iff its text
    begins one of the choices (the tiny tokenizer is byte-level, every text canonical)."""
    eng = LLMEngine(tiny_model, EngineConfig())
    choices = ["yes", "no", "it depends"]
    m = eng.grammars.matcher(SamplingParams(choice=choices).constraint)
    allowed = unpack_bitmask(eng.grammars.fill([m]), eng.model_cfg.vocab_size, "cpu")[0]
    vocab = eng.model_cfg.vocab_size
    eos = set(eng.model_cfg.eos_token_ids)
    for t in range(vocab):
        text = eng.tokenizer.token_text(t)
        reachable = t not in eos and bool(text) and any(c.startswith(text) for c in choices)
        if reachable and not allowed[t]:
            # llguidance keeps to the tokenizer's canonical splits: a token the tokenizer
            # would never produce for this text may be left out, never a wrong one in.
            assert eng.tokenizer.encode(text) != [t], f"token {t} {text!r} should be allowed"
        if allowed[t]:
            assert reachable, f"token {t} {text!r} allowed but leads outside every choice"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_constrained_output_that_stops_satisfies_its_constraint(tiny_model, temperature):
    eng = LLMEngine(tiny_model, EngineConfig())
    ps = prompts(12, seed=int(temperature))
    params = []
    for i in range(len(ps)):
        kind = ("json_schema", "regex", "choice", "json_object")[i % 4]
        spec = {"json_schema": {"json_schema": SCHEMA}, "regex": {"regex": REGEX}, "choice": {"choice": CHOICES},
                "json_object": {"json_schema": {"type": "object"}}}[kind]
        params.append(SamplingParams(max_tokens=80, temperature=temperature, seed=i, **spec))
    outs = eng.generate(ps, params)
    stopped = 0
    for p, o in zip(params, outs):
        if o.finish_reason != "stop":
            assert o.finish_reason == "length" and len(o.token_ids) == p.max_tokens
            continue
        stopped += 1
        if p.json_schema is not None:
            jsonschema.validate(orjson.loads(o.text), p.json_schema)
        elif p.regex is not None:
            assert re.fullmatch(p.regex, o.text), o.text
        else:
            assert o.text in p.choice
    assert stopped >= 9  # a random model still finishes most: the grammar ends them
    assert eng.grammars.stats()["misses"] == 4 and eng.grammars.stats()["hits"] == 8


def test_a_grammar_that_can_only_end_ends_the_sequence_at_once(tiny_model):
    eng = LLMEngine(tiny_model, EngineConfig())
    out = eng.generate([[5, 6, 7]], SamplingParams(max_tokens=50, regex="abc"))[0]
    assert out.text == "abc" and out.finish_reason == "stop"
    assert eng.model_cfg.eos_token_ids[0] not in out.token_ids


def test_a_constraint_that_does_not_fit_max_tokens_ends_as_length(tiny_model):
    eng = LLMEngine(tiny_model, EngineConfig())
    out = eng.generate([[5, 6, 7]], SamplingParams(max_tokens=3, regex="[a-z]{40}"))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    assert re.fullmatch("[a-z]*", out.text)


def test_a_constraint_that_cannot_compile_is_refused_naming_it(tiny_model):
    eng = LLMEngine(tiny_model, EngineConfig())
    with pytest.raises(RequestError, match="look-around"):
        eng.add_request("bad", prompt_token_ids=[1, 2], params=SamplingParams(regex="a(?=b)"))
    with pytest.raises(RequestError, match="one constraint"):
        eng.add_request("two", prompt_token_ids=[1, 2], params=SamplingParams(regex="a", choice=["a"]))
    with pytest.raises(RequestError, match="Invalid type"):
        SamplingParams(json_schema={"type": "objekt"}).validate()
    assert not eng.has_unfinished()


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_constrained_sequence_moved_mid_generation_continues_identically(tiny_model, temperature):
    ps = prompts(6, seed=5)
    params = [SamplingParams(max_tokens=60, temperature=temperature, seed=7, return_margins=True, logprobs=2,
                             json_schema=SCHEMA if i % 2 else None, regex=None if i % 2 else REGEX)
              for i in range(len(ps))]
    reference = LLMEngine(tiny_model, EngineConfig()).generate(ps, params)

    src = LLMEngine(tiny_model, EngineConfig(max_num_batched_tokens=48))
    for i, (p, sp) in enumerate(zip(ps, params)):
        src.add_request(i, prompt_token_ids=p, params=sp)
    results = {}
    for _ in range(8):
        results.update({o.seq_id: o for o in src.step()})
    moved = [i for i in (1, 2, 3) if i in src.seqs]
    assert moved
    states = [src.export_sequence(i, remove=True) for i in moved]
    assert any(s.output_token_ids for s in states)
    states = [SequenceState.from_header(orjson.loads(orjson.dumps(s.header())), bytes(s.kv) if s.kv else None)
              for s in states]
    dst = LLMEngine(tiny_model, EngineConfig())
    for s in states:
        dst.import_sequence(s)
    for eng in (src, dst):
        while eng.has_unfinished():
            results.update({o.seq_id: o for o in eng.step()})
    for i in range(len(ps)):
        ref = reference[i]
        cmp = compare_outputs(results[i].token_ids, ref.token_ids, [ref.margins])
        assert cmp, f"sequence {i}: {cmp.detail}"
        assert results[i].finish_reason == ref.finish_reason
        got = [e["logprob"] for e in results[i].logprobs]
        assert got == pytest.approx([e["logprob"] for e in ref.logprobs], abs=1e-4)
