"""`shoal batch` with what extraction and labelling jobs ask for: response_format
(json_object, json_schema), vLLM's structured_outputs and guided_* fields, logprobs with
top alternatives, n > 1 and penalties, through a local cluster. Every body parses with
the `openai` package's models; every constrained choice that stopped satisfies its
constraint; vLLM's example batch file runs unchanged; a constraint that cannot compile
is refused on its own line, naming it."""

from __future__ import annotations

import re
import subprocess
import sys

import jsonschema
import orjson
import pytest

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["label", "score"],
          "properties": {"label": {"enum": ["positive", "negative", "neutral"]},
                         "score": {"type": "integer", "minimum": 1, "maximum": 5}}}
CHOICES = ["alpha", "beta", "gamma"]
REGEX = r"[A-Z][a-z]{1,6}, [0-9]{4}"


def chat(cid: str, **body) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "dec", "messages": [{"role": "user", "content": f"Classify {cid}."}], "max_tokens": 40,
                     **body}}


def completion(cid: str, **body) -> dict:
    return {"custom_id": cid, "method": "POST", "url": "/v1/completions",
            "body": {"model": "dec", "prompt": f"Answer for {cid}:", "max_tokens": 24, **body}}


# vLLM's own example batch file (examples/offline_inference/openai_batch), as it is.
VLLM_EXAMPLE = [
    {"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "meta-llama/Meta-Llama-3-8B-Instruct",
              "messages": [{"role": "system", "content": "You are a helpful assistant."},
                           {"role": "user", "content": "Hello world!"}], "max_completion_tokens": 1000}},
    {"custom_id": "request-2", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "meta-llama/Meta-Llama-3-8B-Instruct",
              "messages": [{"role": "system", "content": "You are an unhelpful assistant."},
                           {"role": "user", "content": "Hello world!"}], "max_completion_tokens": 1000}},
]

GOOD = [
    *[chat(f"schema-{i}", temperature=0.7, seed=i,
           response_format={"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}})
      for i in range(6)],
    *[chat(f"object-{i}", response_format={"type": "json_object"}, max_tokens=60) for i in range(3)],
    *[chat(f"regex-{i}", structured_outputs={"regex": REGEX}, temperature=1.0, seed=i) for i in range(3)],
    *[completion(f"choice-{i}", guided_choice=CHOICES, temperature=1.0, seed=i) for i in range(3)],
    chat("chat-logprobs", logprobs=True, top_logprobs=3, max_tokens=8),
    completion("completion-logprobs", logprobs=2, max_tokens=6),
    chat("chat-n", n=3, temperature=0.8, seed=4, max_tokens=10, logprobs=True),
    completion("completion-n", prompt=["first prompt", "second prompt"], n=2, temperature=0.8, seed=1, max_tokens=5),
    chat("penalties", presence_penalty=1.0, frequency_penalty=0.5, logit_bias={"42": 5}, max_completion_tokens=12,
         repetition_penalty=1.2, min_tokens=4),
    *VLLM_EXAMPLE,
]

BAD = [
    (chat("bad-schema", response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}),
     "json_schema does not compile"),
    (chat("bad-regex", structured_outputs={"regex": "a(?=b)"}), "look-around"),
    (chat("bad-two", guided_regex="a", guided_choice=["a"]), "give one structured output"),
    (chat("bad-top", top_logprobs=2), "top_logprobs needs logprobs: true"),
    (chat("bad-many", logprobs=True, top_logprobs=40), "logprobs must be an integer from 0 to 20"),
    (chat("bad-format", response_format={"type": "yaml"}), "response_format type 'yaml'"),
]


@pytest.mark.timeout(400)
def test_structured_outputs_logprobs_and_n_through_shoal_batch(tiny_chat_model, tmp_path):
    from openai.types import BatchError, Completion
    from openai.types.chat import ChatCompletion

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [orjson.dumps(q) for q in GOOD] + [orjson.dumps(q) for q, _ in BAD]
    inp.write_bytes(b"\n".join(lines) + b"\n")
    res = subprocess.run([sys.executable, "-m", "shoal.cli", "batch", "--input", str(inp), "--output", str(out),
                          "--model", str(tiny_chat_model), "--dtype", "float32"],
                         capture_output=True, text=True, timeout=360)
    assert res.returncode == 4 and "6 of 28 requests failed" in res.stderr, res.stderr[-3000:]
    outputs = {o["custom_id"]: o for o in map(orjson.loads, out.read_bytes().splitlines())}
    assert len(outputs) == len(GOOD) + len(BAD)
    for q, reason in BAD:
        err = BatchError.model_validate(outputs[q["custom_id"]]["error"])
        assert reason in err.message and f"({q['custom_id']})" in err.message, err.message

    stopped = 0
    for q in GOOD:
        o = outputs[q["custom_id"]]
        assert o["error"] is None, o["error"]
        is_chat = q["url"] == "/v1/chat/completions"
        parsed = (ChatCompletion if is_chat else Completion).model_validate(o["response"]["body"])
        body = q["body"]
        n = body.get("n", 1) * (len(body["prompt"]) if isinstance(body.get("prompt"), list) else 1)
        assert [c.index for c in parsed.choices] == list(range(n))
        for c in parsed.choices:
            text = c.message.content if is_chat else c.text
            if c.finish_reason != "stop":
                continue
            stopped += 1
            cid = q["custom_id"]
            if cid.startswith("schema-"):
                jsonschema.validate(orjson.loads(text), SCHEMA)
            elif cid.startswith("object-"):
                assert isinstance(orjson.loads(text), dict)
            elif cid.startswith("regex-"):
                assert re.fullmatch(REGEX, text), text
            elif cid.startswith("choice-"):
                assert text in CHOICES
        if body.get("logprobs"):
            for c in parsed.choices:
                if is_chat:
                    content = c.logprobs.content
                    assert len(content) == parsed.usage.completion_tokens // n
                    assert all(len(t.top_logprobs) == body.get("top_logprobs", 0) for t in content)
                    assert "".join(t.token for t in content) == c.message.content or c.finish_reason == "stop"
                    assert all(t.logprob <= 0 and bytes(t.bytes) == t.token.encode() for t in content)
                else:
                    lp = c.logprobs
                    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
                    assert all(len(top) <= 2 for top in lp.top_logprobs)
                    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
        else:
            assert all(c.logprobs is None for c in parsed.choices)
    assert stopped >= 12  # the grammars end most constrained answers, even on a random model
    # n samples with their own seeds differ; the usage counts each prompt once.
    samples = outputs["chat-n"]["response"]["body"]["choices"]
    assert len({s["message"]["content"] for s in samples}) > 1
    one = outputs["chat-logprobs"]["response"]["body"]["usage"]["prompt_tokens"]
    assert outputs["chat-n"]["response"]["body"]["usage"]["prompt_tokens"] <= one + 2
