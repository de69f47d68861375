"""`shoal generate` and `shoal batch` killed mid-job (kill -9: no way out, their local
cluster dies with them) keep the results they wrote; the same command run again runs
only the rest, and the file ends with every item once, as an uninterrupted run would
have made it. (`shoal rag`'s resume is in test_retrieval.py, beside its cluster.)"""

from __future__ import annotations

import subprocess
import sys

import orjson

from killed_command import kill_when, whole_lines
from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.output_compare import compare_outputs
from shoal.sampling import SamplingParams

ITEMS = 16


def max_tokens(i: int) -> int:
    return 20 + 120 * i  # staggered, so that results arrive a few at a time over the job


def test_a_killed_generate_is_finished_by_the_same_command(tiny_model, tmp_path):
    prompts = [[1 + (7 * i + j) % 500 for j in range(3 + i)] for i in range(ITEMS)]
    inp = tmp_path / "in.jsonl"
    # Three lines --on-error skip refuses, each an error record of its own, written first:
    # one repeats a good line's id, two have none.
    refused = [b'{"id": 3, "prompt_token_ids": [5]}', b'{"prompt_token_ids": [5]}', b"not json"]
    inp.write_bytes(b"".join(orjson.dumps({"id": i, "prompt_token_ids": p, "max_tokens": max_tokens(i)}) + b"\n"
                             for i, p in enumerate(prompts)) + b"\n".join(refused) + b"\n")
    out = tmp_path / "out.jsonl"
    marker = tmp_path / "out.jsonl.unfinished"
    args = [sys.executable, "-m", "shoal.cli", "generate", "--model", str(tiny_model), "--input", str(inp),
            "--output", str(out), "--on-error", "skip", "--max-tokens", "8"]
    kill_when(args, lambda: whole_lines(out).count(b"\n") >= 6)
    first = whole_lines(out)
    kept = first.count(b"\n")
    assert marker.exists() and 6 <= kept < ITEMS + 3, kept

    # Another job's run is not continued in that file, nor is the file touched.
    raw = out.read_bytes()
    other = subprocess.run([*args[:-1], "9"], capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and "unfinished run of another job" in other.stderr, other.stderr[-2000:]
    assert out.read_bytes() == raw

    again = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert again.returncode == 4 and f"3 of {ITEMS + 3} sequences failed" in again.stderr, again.stderr[-2000:]
    assert f"resuming: {kept} of {ITEMS + 3} records already in {out}; running the other {ITEMS + 3 - kept}" \
        in again.stderr
    assert f"{kept} kept from the interrupted run" in again.stdout
    after = out.read_bytes()
    assert after.startswith(first) and not marker.exists()
    recs = [orjson.loads(line) for line in after.splitlines()]
    assert sorted(r["line"] for r in recs if "line" in r) == [ITEMS + 1, ITEMS + 2, ITEMS + 3]  # each once
    recs = [r for r in recs if "line" not in r]
    assert sorted(r["id"] for r in recs) == list(range(ITEMS))
    eng = LLMEngine(tiny_model, EngineConfig(policy="mb"))
    refs = eng.generate(prompts, [SamplingParams(max_tokens=max_tokens(i), return_margins=True) for i in range(ITEMS)])
    for r in recs:
        ref = refs[r["id"]]
        cmp = compare_outputs(r["token_ids"], ref.token_ids, [ref.margins])
        assert cmp, f"{r['id']}: {cmp.detail}"


def test_a_killed_batch_is_finished_with_the_same_line_ids(tiny_chat_model, tmp_path):
    requests = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
                 "body": {"model": "m", "prompt": [1 + i, 2, 3], "max_tokens": max_tokens(i), "temperature": 0}}
                for i in range(ITEMS)]
    inp, out = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    inp.write_bytes(b"".join(orjson.dumps(q) + b"\n" for q in requests) + b"not json\n")
    args = [sys.executable, "-m", "shoal.cli", "batch", "--model", str(tiny_chat_model), "--input", str(inp),
            "--output", str(out)]
    kill_when(args, lambda: whole_lines(out).count(b"\n") >= 4)  # the bad line's error, then results
    first = whole_lines(out)
    kept = [orjson.loads(line) for line in first.splitlines()]
    assert kept[0]["error"]["line"] == ITEMS + 1 and len(kept) < ITEMS + 1

    again = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert again.returncode == 4 and f"1 of {ITEMS + 1} requests failed" in again.stderr, again.stderr[-2000:]
    assert f"resuming: {len(kept)} of {ITEMS + 1} lines already in {out}" in again.stderr
    after = out.read_bytes()
    assert after.startswith(first) and not (tmp_path / "results.jsonl.unfinished").exists()
    lines = [orjson.loads(line) for line in after.splitlines()]
    assert sorted(o["custom_id"] for o in lines[1:]) == sorted(q["custom_id"] for q in requests)
    assert sum(o["error"] is not None for o in lines) == 1  # the bad line's error, written once
    tag = lines[0]["id"].rsplit("_", 1)[0]  # one job, one tag: ids of both runs alike
    line_of = {q["custom_id"]: n for n, q in enumerate(requests, 1)}
    assert all(o["id"] == f"{tag}_{line_of[o['custom_id']]}" for o in lines[1:])
    for o in lines[1:]:
        i = line_of[o["custom_id"]] - 1
        assert o["response"]["status_code"] == 200
        assert 0 < o["response"]["body"]["usage"]["completion_tokens"] <= max_tokens(i)


def test_a_rerun_after_the_client_died_reattaches_to_its_job(tiny_model, tmp_path):
    """Against a running cluster, the client killed mid-job: the same command run again
    finds the job by its key (the run's fingerprint) and reads the results stored
    meanwhile; no item is computed twice (each assigned once, in one job)."""
    import shoal
    from shoal.transport.rpc import RpcClient

    prompts = [[1 + (7 * i + j) % 500 for j in range(3 + i)] for i in range(ITEMS)]
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_bytes(b"".join(orjson.dumps({"id": i, "prompt_token_ids": p, "max_tokens": max_tokens(i)}) + b"\n"
                             for i, p in enumerate(prompts)))
    with shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb") as c:
        args = [sys.executable, "-m", "shoal.cli", "generate", "--model", str(tiny_model), "--input", str(inp),
                "--output", str(out), "--router", c.router]
        kill_when(args, lambda: whole_lines(out).count(b"\n") >= 3)
        kept = whole_lines(out).count(b"\n")
        again = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr[-2000:]
        assert f"resuming: {kept} of {ITEMS} records" in again.stderr
        counters = RpcClient(c.nodes["worker-0"][2]).request("StatsQuery", timeout=5)["stats"]["counters"]
    assert counters["sequences.assigned"] == ITEMS, counters  # the rerun submitted nothing new
    recs = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(r["id"] for r in recs) == list(range(ITEMS))
