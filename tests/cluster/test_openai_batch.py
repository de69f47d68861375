"""`shoal batch`: an OpenAI Batch API file of 1,000 chat, completion and embedding
requests, 20 of its lines malformed, through a real local cluster. Every good line's
output parses with the `openai` package's models and equals the same request run as
`shoal generate` runs it (the `generate` program) and through `shoal embed`; every bad
line has its own error naming its problem."""

from __future__ import annotations

import base64
import random
import subprocess
import sys

import numpy as np
import orjson
import pytest

from shoal.output_compare import compare_results

WORDS = "river stone light paper window garden music number silver story table cloud".split()

# Malformed lines and what each one's error must say.
BAD_LINES = [
    (b'{"custom_id": "x1", "method": "POST", "url": ', "not valid JSON"),
    (b"[1, 2, 3]", "a request must be a JSON object"),
    (b'{"method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "a"}}', "custom_id must be a non-empty string"),
    ({"custom_id": "chat-0", "url": "/v1/completions", "body": {"model": "m", "prompt": "a"}}, "duplicate custom_id (first on line 1)"),
    ({"custom_id": "b-url", "url": "/v1/images/generations", "body": {"model": "m"}}, "url '/v1/images/generations' is not one of"),
    ({"custom_id": "b-get", "method": "GET", "url": "/v1/completions", "body": {"model": "m", "prompt": "a"}}, "method must be POST"),
    ({"custom_id": "b-body", "url": "/v1/completions", "body": "prompt"}, "body must be a JSON object"),
    ({"custom_id": "b-model", "url": "/v1/completions", "body": {"prompt": "a"}}, "body.model must be a non-empty string"),
    ({"custom_id": "b-msgs", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}, "messages must be a non-empty list"),
    ({"custom_id": "b-role", "url": "/v1/chat/completions", "body": {"model": "m", "messages": [{"content": "hi"}]}},
     "messages[0] must be an object with a string role"),
    ({"custom_id": "b-n", "url": "/v1/chat/completions", "body": {"model": "m", "best_of": 2, "messages": [{"role": "user", "content": "a"}]}},
     "best_of=2 is not supported"),
    ({"custom_id": "b-param", "url": "/v1/completions", "body": {"model": "m", "prompt": "a", "mirostat": 1}},
     "unsupported parameter 'mirostat'"),
    ({"custom_id": "b-temp", "url": "/v1/completions", "body": {"model": "m", "prompt": "a", "temperature": 5}},
     "temperature must be a number from 0 to 2"),
    ({"custom_id": "b-max", "url": "/v1/completions", "body": {"model": "m", "prompt": "a", "max_tokens": -1}},
     "max_tokens must be a positive integer"),
    ({"custom_id": "b-prompt", "url": "/v1/completions", "body": {"model": "m", "prompt": {"text": "a"}}},
     "prompt must be a string or a non-empty list of token ids"),
    ({"custom_id": "b-input", "url": "/v1/embeddings", "body": {"model": "e", "input": []}},
     "input must be a string or a non-empty list of strings"),
    ({"custom_id": "b-ids", "url": "/v1/embeddings", "body": {"model": "e", "input": [[1, 2, 3]]}}, "token-id input is not supported"),
    ({"custom_id": "b-fmt", "url": "/v1/embeddings", "body": {"model": "e", "input": "a", "encoding_format": "hex"}},
     "encoding_format must be float or base64"),
    ({"custom_id": "b-dims", "url": "/v1/embeddings", "body": {"model": "e", "input": "a", "dimensions": 7}},
     "dimensions=7 is not supported"),
    ({"custom_id": "b-image", "url": "/v1/chat/completions", "body": {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}},
     "content part of type 'image_url' is not supported"),
]


def _text(r: random.Random, n: int) -> str:
    return " ".join(r.choice(WORDS) for _ in range(n))


def _requests(n: int) -> list[dict]:
    """Chats (some with a system turn, some with text parts, some sampled with a seed),
    completions (text, token ids, several prompts) and embeddings (float and base64)."""
    r = random.Random(5)
    out = []
    for i in range(n):
        kind = ("chat", "completion", "embedding")[i % 3] if i else "chat"
        cid = f"{kind}-{i}"
        if kind == "embedding":
            texts = [_text(r, r.randint(1, 12)) for _ in range(r.randint(1, 3))]
            body = {"model": "enc", "input": texts if len(texts) > 1 or i % 2 else texts[0]}
            if i % 7 == 0:
                body["encoding_format"] = "base64"
            out.append({"custom_id": cid, "method": "POST", "url": "/v1/embeddings", "body": body})
            continue
        body = {"model": "dec", "max_tokens": r.randint(1, 6)}
        body.update({"temperature": 0.8, "seed": i, "top_p": 0.9} if i % 5 == 0 else {"temperature": 0})
        if kind == "chat":
            user = _text(r, r.randint(1, 10))
            msgs = [{"role": "user", "content": [{"type": "text", "text": user}] if i % 4 == 1 else user}]
            if i % 2:
                msgs.insert(0, {"role": "system", "content": "Answer in one word."})
            body["messages"] = msgs
            out.append({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body})
        else:
            prompt = [r.randrange(500) for _ in range(r.randint(1, 8))] if i % 4 == 2 else _text(r, r.randint(1, 8))
            # Several prompts only greedy: each is a Generate of its own in the reference,
            # where a sampled one would draw under another key.
            body["prompt"] = [prompt, _text(r, 3)] if i % 11 == 2 and i % 5 else prompt
            if i % 13 == 2:
                body["stop"] = "stone"
            out.append({"custom_id": cid, "method": "POST", "url": "/v1/completions", "body": body})
    return out


def _reference_items(req: dict) -> list[dict]:
    """The request as `shoal generate` items: one per prompt."""
    body = req["body"]
    sampling = {k: body[k] for k in ("temperature", "seed", "top_p") if k in body}
    sampling.setdefault("top_p", 1.0)
    if "stop" in body:
        sampling["stop"] = [body["stop"]]
    if "messages" in body:
        msgs = [{**m, "content": m["content"][0]["text"]} if isinstance(m["content"], list) else m for m in body["messages"]]
        return [{"id": req["custom_id"], "messages": msgs, "max_tokens": body["max_tokens"], **sampling}]
    prompts = body["prompt"] if isinstance(body["prompt"], list) and isinstance(body["prompt"][0], (str, list)) \
        else [body["prompt"]]
    return [{"id": f"{req['custom_id']}#{j}" if len(prompts) > 1 else req["custom_id"],
             **({"prompt": p} if isinstance(p, str) else {"prompt_token_ids": p}),
             "max_tokens": body["max_tokens"], **sampling} for j, p in enumerate(prompts)]


def run_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "shoal.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(900)
def test_openai_batch_file_of_1000_requests(tiny_chat_model, tiny_encoder, tmp_path):
    from openai.types import BatchError, Completion, CreateEmbeddingResponse
    from openai.types.chat import ChatCompletion

    from shoal.sdk.client import Client
    from shoal.sdk.embeddings import EmbeddingSet
    from shoal.cluster.local_cluster import LocalCluster

    good = _requests(980)
    lines = [orjson.dumps(q) for q in good]
    bad_at = {}
    r = random.Random(9)
    for raw, reason in BAD_LINES:  # spread through the file
        pos = r.randrange(1, len(lines) + 1)
        lines.insert(pos, raw if isinstance(raw, bytes) else orjson.dumps({"method": "POST", **raw}))
    for lineno, raw in enumerate(lines, 1):
        for bad_raw, reason in BAD_LINES:
            if raw == (bad_raw if isinstance(bad_raw, bytes) else orjson.dumps({"method": "POST", **bad_raw})):
                bad_at[lineno] = reason
    assert len(bad_at) == 20
    inp, out = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    inp.write_bytes(b"\n".join(lines) + b"\n")

    with LocalCluster(tiny_chat_model, encoder=tiny_encoder, workers=2, dtype="float32") as cluster:
        res = run_cli("batch", "--input", str(inp), "--output", str(out), "--model", str(tiny_chat_model),
                      "--encoder", str(tiny_encoder), "--router", cluster.router)
        assert res.returncode == 4 and "20 of 1000 requests failed" in res.stderr, res.stderr[-3000:]
        assert "(1000 requests, 980 completed, 20 failed" in res.stdout
        job_id = next(w for w in res.stderr.split() if w.startswith("j-")).rstrip(":")
        with Client(cluster.router) as client:
            raw = {rec["id"]: rec for rec in client.job(job_id).results()}
            # The same requests as `shoal generate` runs them, with margins to judge by.
            ref_items = [it for q in good if q["url"] != "/v1/embeddings" for it in _reference_items(q)]
            ref = {rec["id"]: rec for rec in client.submit(ref_items, params={"return_margins": True}).results()}
        texts = [(q["custom_id"], j, t) for q in good if q["url"] == "/v1/embeddings"
                 for j, t in enumerate([q["body"]["input"]] if isinstance(q["body"]["input"], str) else q["body"]["input"])]
        (tmp_path / "texts.jsonl").write_bytes(b"".join(orjson.dumps({"id": f"{c}#{j}", "text": t}) + b"\n"
                                                        for c, j, t in texts))
        res = run_cli("embed", "--encoder", str(tiny_encoder), "--input", str(tmp_path / "texts.jsonl"),
                      "--output", str(tmp_path / "emb"), "--router", cluster.router, "--no-predict")
        assert res.returncode == 0, res.stderr[-3000:]
    ids, matrix = EmbeddingSet(tmp_path / "emb").matrix("texts")
    embedded = dict(zip(ids, matrix))

    outputs = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert len(outputs) == 1000 and len({o["id"] for o in outputs}) == 1000
    errors = [o for o in outputs if o["error"] is not None]
    assert sorted(o["error"]["line"] for o in errors) == sorted(bad_at)
    for o in errors:
        err = BatchError.model_validate(o["error"])
        assert o["response"] is None and bad_at[err.line] in err.message, (err.line, err.message)
    by_custom = {o["custom_id"]: o for o in outputs if o["error"] is None}
    assert set(by_custom) == {q["custom_id"] for q in good}
    for q in good:
        o = by_custom[q["custom_id"]]
        body = o["response"]["body"]
        assert o["response"]["status_code"] == 200
        if q["url"] == "/v1/embeddings":
            if q["body"].get("encoding_format") == "base64":  # as the openai client decodes it
                for d in body["data"]:
                    d["embedding"] = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4").tolist()
            parsed = CreateEmbeddingResponse.model_validate(body)
            assert parsed.usage.prompt_tokens > 0 and parsed.model == "enc"
            for j, d in enumerate(parsed.data):
                assert d.index == j
                np.testing.assert_allclose(d.embedding, embedded[f"{q['custom_id']}#{j}"], atol=2e-5)
            continue
        chat = q["url"] == "/v1/chat/completions"
        parsed = (ChatCompletion if chat else Completion).model_validate(body)
        refs = [ref[it["id"]] for it in _reference_items(q)]
        assert len(parsed.choices) == len(refs) and parsed.model == "dec"
        assert parsed.usage.prompt_tokens == sum(x["prompt_tokens"] for x in refs)
        assert parsed.usage.completion_tokens == sum(len(c["token_ids"]) for c in raw[q["custom_id"]]["choices"])
        for choice, mine, theirs in zip(parsed.choices, raw[q["custom_id"]]["choices"], refs):
            cmp = compare_results(mine, theirs)
            assert cmp, f"{q['custom_id']}: {cmp.detail}"
            text = choice.message.content if chat else choice.text
            assert text == mine["text"]
            if cmp.diverged_at is None:
                assert text == theirs["text"] and choice.finish_reason == theirs["finish_reason"]
