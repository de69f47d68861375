"""`shoal generate` end to end: input checked line by line before anything starts, a
local cluster started and stopped for the job, every id exactly once in the output."""

from __future__ import annotations

import random
import subprocess
import sys

import orjson

from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.output_compare import compare_outputs
from shoal.sampling import SamplingParams


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "shoal.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_generate_through_a_local_cluster(tiny_model, tmp_path):
    r = random.Random(31)
    prompts = [[r.randrange(511) for _ in range(r.randint(1, 60))] for _ in range(12)]
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps({"id": i, "prompt_token_ids": p, "max_tokens": 6 + i % 5}) + b"\n"
                             for i, p in enumerate(prompts)) + orjson.dumps({"id": "t", "prompt": "The module"}) + b"\n")
    out = tmp_path / "out.jsonl"
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(out),
                  "--max-tokens", "8", "--workers", "2", "--predict")
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"results: {out}" in res.stdout
    # The workers' calibration predicted the job (an upper bound: these items may end early).
    assert "prediction: " in res.stderr and "at most" in res.stderr and "on 2 worker(s)" in res.stderr, res.stderr[-2000:]
    assert "measured" in res.stderr and "error" in res.stderr
    recs = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(map(str, (r["id"] for r in recs))) == sorted(map(str, [*range(12), "t"])) and len(recs) == 13
    by_id = {r["id"]: r for r in recs}
    assert set(by_id["t"]) == {"id", "text", "token_ids", "finish_reason", "prompt_tokens"}
    assert by_id[3]["prompt_tokens"] == len(prompts[3])
    eng = LLMEngine(tiny_model, EngineConfig(policy="mb"))
    for i, p in enumerate(prompts):
        ref = eng.generate([p], SamplingParams(max_tokens=6 + i % 5, return_margins=True), seq_ids=[i])[0]
        cmp = compare_outputs(by_id[i]["token_ids"], ref.token_ids, [ref.margins])
        assert cmp, f"{i}: {cmp.detail}"


def test_a_dry_run_predicts_and_writes_nothing(tiny_model, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_bytes(b"".join(orjson.dumps({"id": i, "prompt_token_ids": [5] * (10 + i), "max_tokens": 9,
                                           "ignore_eos": True}) + b"\n" for i in range(6)))
    out = tmp_path / "out.jsonl"
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(out), "--dry-run")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "prediction: " in res.stderr and "for 54 output tokens on 1 worker(s)" in res.stderr, res.stderr[-2000:]
    assert "at most" not in res.stderr  # ignore_eos: the lengths are known
    assert not out.exists() and "job " not in res.stderr


def test_bad_input_is_refused_before_anything_starts(tiny_model, tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n')
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(tmp_path / "o.jsonl"))
    assert res.returncode == 2 and "in.jsonl:2: duplicate id 1" in res.stderr
    inp.write_text('{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": \n')
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(tmp_path / "o.jsonl"))
    assert res.returncode == 2 and "in.jsonl:2: not valid JSON" in res.stderr
    assert not (tmp_path / "o.jsonl").exists()


def test_up_detached_and_down(tiny_model, tmp_path):
    state = tmp_path / "up"
    up = run_cli("up", "--model", str(tiny_model), "--dir", str(state), "--detach")
    assert up.returncode == 0, up.stderr[-2000:]
    router = next(line.split(" ", 1)[1] for line in up.stdout.splitlines() if line.startswith("router: "))
    import shoal

    job = shoal.Client(router).submit([{"id": "a", "prompt": "The module"}], params={"max_tokens": 3})
    assert [r["id"] for r in job.wait(timeout=60)] == ["a"]
    # A long job cancelled from the command line: its results end at once (run on, it
    # would take minutes), with at most what the worker held (two batches of 256).
    long = shoal.Client(router).submit([{"id": i, "prompt_token_ids": [1 + i % 500, 2]} for i in range(1200)],
                                       params={"max_tokens": 1000})
    cancel = run_cli("cancel", long.id, "--router", router)
    assert cancel.returncode == 0, cancel.stderr[-2000:]
    assert orjson.loads(cancel.stdout)["state"] == "cancelled"
    assert len(long.wait(timeout=240)) <= 512
    unknown = run_cli("cancel", "j-nope", "--router", router)
    assert unknown.returncode == 2 and "no job j-nope" in unknown.stderr
    down = run_cli("down", "--dir", str(state))
    assert down.returncode == 0 and "stopped" in down.stdout
    again = run_cli("down", "--dir", str(state))
    assert again.returncode == 2 and "no cluster recorded" in again.stderr


def test_parquet_input_and_output(tiny_model, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"id": f"p{i}", "prompt_token_ids": [5 + i, 7, 9], "max_tokens": 3 + i} for i in range(4)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    out = tmp_path / "out.parquet"
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(tmp_path / "in.parquet"), "--output", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    got = {r["id"]: r for r in pq.read_table(out).to_pylist()}
    assert sorted(got) == [r["id"] for r in rows]
    eng = LLMEngine(tiny_model, EngineConfig(policy="mb"))
    for r in rows:
        ref = eng.generate([r["prompt_token_ids"]], SamplingParams(max_tokens=r["max_tokens"], return_margins=True))[0]
        cmp = compare_outputs(got[r["id"]]["token_ids"], ref.token_ids, [ref.margins])
        assert cmp, f"{r['id']}: {cmp.detail}"
    assert not list(tmp_path.glob("*.part"))


def test_embed_cli_predicts_runs_and_reports_bad_rows(tiny_encoder, tmp_path):
    """`shoal embed --dry-run` prints the cost model's prediction and stops; a run with
    --on-error skip names the bad row, embeds the rest, and compares its prediction
    with what it measured; a run with the default --on-error fail stops before anything."""
    from shoal.sdk.embeddings import EmbeddingSet

    (tmp_path / "a.jsonl").write_bytes(b"".join(orjson.dumps({"id": f"a{i}", "text": "word " * (i + 1)}) + b"\n"
                                                for i in range(30)))
    (tmp_path / "b.jsonl").write_bytes(b'{"id": "b0", "text": "fine"}\n{"id": "b1", "text": 7}\n{"text": "last"}\n')
    inputs = ["--input", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    common = ["embed", "--encoder", str(tiny_encoder), *inputs, "--output", str(tmp_path / "out"),
              "--b-min", "8", "--n-max", "8"]
    res = run_cli(*common, "--dry-run", "--on-error", "skip")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "prediction: 32 texts in 2 partitions" in res.stderr and "SuperBatches: predicted" in res.stderr
    assert not (tmp_path / "out").exists()
    res = run_cli(*common)
    assert res.returncode == 2 and "b.jsonl:line 2: 'text' must be a string, got int" in res.stderr
    res = run_cli(*common, "--on-error", "skip")
    assert res.returncode == 4 and "1 of 33 rows failed" in res.stderr, res.stderr[-2000:]
    assert "skipped 1 bad rows" in res.stderr and "b.jsonl:line 2" in res.stderr
    assert f"embeddings: {tmp_path / 'out'}  (32 texts, 32 embedded now" in res.stdout
    assert "predicted" in res.stdout and "measured" in res.stdout
    out = EmbeddingSet(tmp_path / "out")
    assert out.missing() == {} and out.matrix("b")[0] == ["b0", "b:3"]


def test_generate_chat_messages_with_the_model_s_template(tiny_chat_model, tmp_path):
    """Items given as chats: rendered with the checkpoint's template on the worker, the
    same tokens as transformers' apply_chat_template prompt run on the engine; a chat
    with no messages is refused on its line."""
    from transformers import AutoTokenizer

    chats = {"c1": [{"role": "user", "content": "The module reads a file"}],
             "c2": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What does it return?"}]}
    inp = tmp_path / "chats.jsonl"
    inp.write_bytes(b"".join(orjson.dumps({"id": i, "messages": m, "max_tokens": 6}) + b"\n" for i, m in chats.items())
                    + b'{"id": "c3", "messages": []}\n')
    out = tmp_path / "out.jsonl"
    res = run_cli("generate", "--model", str(tiny_chat_model), "--input", str(inp), "--output", str(out),
                  "--on-error", "skip")
    assert res.returncode == 4 and "1 of 3 sequences failed" in res.stderr, res.stderr[-2000:]
    assert "chats.jsonl:3: messages must be a non-empty list" in res.stderr
    by_id = {r["id"]: r for r in map(orjson.loads, out.read_bytes().splitlines())}
    assert by_id["c3"]["finish_reason"] == "error"
    tok = AutoTokenizer.from_pretrained(str(tiny_chat_model))
    eng = LLMEngine(tiny_chat_model, EngineConfig(policy="mb"))
    for cid, messages in chats.items():
        ids = tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
        ref = eng.generate([list(ids)], SamplingParams(max_tokens=6, return_margins=True), seq_ids=[cid])[0]
        cmp = compare_outputs(by_id[cid]["token_ids"], ref.token_ids, [ref.margins])
        assert cmp, f"{cid}: {cmp.detail}"
        assert by_id[cid]["prompt_tokens"] == len(ids)


def test_generate_with_a_schema_samples_and_logprobs(tiny_model, tmp_path):
    """--json-schema, --n and --logprobs for the job; an item overrides with its own regex;
    a bad item constraint is refused with its line before anything starts."""
    import re

    import jsonschema

    schema = {"type": "object", "required": ["city"], "additionalProperties": False,
              "properties": {"city": {"type": "string", "maxLength": 10}}}
    (tmp_path / "schema.json").write_bytes(orjson.dumps(schema))
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    items = [{"id": i, "prompt": f"City number {i}:"} for i in range(4)] + [{"id": "r", "prompt": "Code:", "regex": "[0-9]{4}"}]
    inp.write_bytes(b"".join(orjson.dumps(it) + b"\n" for it in items))
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(out),
                  "--max-tokens", "40", "--temperature", "0.9", "--json-schema", str(tmp_path / "schema.json"),
                  "--n", "2", "--logprobs", "2")
    assert res.returncode == 0, res.stderr[-2000:]
    recs = {r["id"]: r for r in map(orjson.loads, out.read_bytes().splitlines())}
    assert sorted(map(str, recs)) == ["0", "1", "2", "3", "r"]
    for rid, rec in recs.items():
        assert len(rec["choices"]) == 2
        for c in rec["choices"]:
            assert len(c["logprobs"]) == len(c["token_ids"]) and all(len(e["top_logprobs"]) == 2 for e in c["logprobs"])
            if c["finish_reason"] == "stop":
                if rid == "r":
                    assert re.fullmatch("[0-9]{4}", c["text"])
                else:
                    jsonschema.validate(orjson.loads(c["text"]), schema)
    assert sum(c["finish_reason"] == "stop" for r in recs.values() for c in r["choices"]) >= 8

    inp.write_bytes(b'{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": "b", "regex": "(?<=x)y"}\n')
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(tmp_path / "o2.jsonl"))
    assert res.returncode == 2 and "in.jsonl:2" in res.stderr and "look-around" in res.stderr, res.stderr[-800:]
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(tmp_path / "o2.jsonl"),
                  "--regex", "x", "--choice", "y")
    assert res.returncode == 2 and "not allowed with argument" in res.stderr
