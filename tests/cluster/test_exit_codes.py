"""Exit statuses and input that mean what they say: a run with failed items exits 4
naming the count (0 with --allow-failures); what a worker would fail is refused before
the job starts, by `generate` and `batch` alike; a UTF-8 byte order mark is skipped."""

from __future__ import annotations

import subprocess
import sys

import orjson


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "shoal.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_failed_items_give_exit_4_naming_the_count(tiny_model, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    # A chat for a model without a chat template passes every check and fails on a worker.
    inp.write_bytes(b'\xef\xbb\xbf{"id": 1, "prompt_token_ids": [5, 6], "max_tokens": 3}\n'
                    b'{"id": 2, "prompt": "The module", "max_tokens": 3}\n'
                    b'{"id": 3, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}\n')
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(out))
    assert res.returncode == 4, res.stderr[-2000:]
    assert f"1 of 3 sequences failed: their errors are in {out}" in res.stderr and "--allow-failures" in res.stderr
    recs = {r["id"]: r for r in map(orjson.loads, out.read_bytes().splitlines())}
    assert "chat template" in recs[3]["error"] and len(recs[1]["token_ids"]) == 3  # the BOM line ran
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(out), "--overwrite",
                  "--allow-failures")
    assert res.returncode == 0 and "1 of 3 sequences failed" in res.stderr, res.stderr[-2000:]


def test_what_a_worker_would_fail_is_refused_before_the_job_starts(tiny_model, tiny_chat_model, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    for line, problem in ((b'{"id": 1, "prompt": ""}', "in.jsonl:1: empty prompt"),
                          (b'{"id": 1, "prompt_token_ids": []}', "in.jsonl:1: empty prompt_token_ids"),
                          (b'{"id": 1, "prompt_token_ids": [3, 99999]}', "token id 99999 outside the vocabulary [0, 512)")):
        inp.write_bytes(line + b"\n")
        res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(out))
        assert res.returncode == 2 and problem in res.stderr, (line, res.stderr[-800:])
        assert not out.exists()
    # `batch` holds its lines to the same rules: each bad one its own error line.
    def completion(cid, **body):
        return {"custom_id": cid, "method": "POST", "url": "/v1/completions",
                "body": {"model": "m", "prompt": "a b", "max_tokens": 2, **body}}
    lines = [completion("ok"), completion("empty", prompt=""), completion("ids", prompt=[1, 99999]),
             completion("huge", max_tokens=10**12)]
    inp.write_bytes(b"\xef\xbb\xbf" + b"".join(orjson.dumps(q) + b"\n" for q in lines))
    res = run_cli("batch", "--model", str(tiny_chat_model), "--input", str(inp), "--output", str(out))
    assert res.returncode == 4 and "3 of 4 requests failed" in res.stderr, res.stderr[-2000:]
    got = {o["custom_id"]: o for o in map(orjson.loads, out.read_bytes().splitlines())}
    assert got["ok"]["error"] is None
    assert "empty prompt" in got["empty"]["error"]["message"]
    assert "token id 99999 outside the vocabulary" in got["ids"]["error"]["message"]
    assert "does not fit the model's context" in got["huge"]["error"]["message"]
