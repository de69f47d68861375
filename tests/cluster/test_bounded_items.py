"""One bad item never stalls a job: an item too large to deliver, or a max_tokens past
the model's context, is refused before the job starts (naming its line), and a job
submitted through the SDK with such a max_tokens still finishes."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

import shoal
from shoal.transport.rpc import RemoteError


def run_cli(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "shoal.cli", *args], capture_output=True, text=True, timeout=timeout)


GOOD = [{"id": "a", "prompt_token_ids": [5, 6, 7], "max_tokens": 4}, {"id": "b", "prompt": "The module", "max_tokens": 4}]
HUGE = {"id": "huge", "prompt": "a " * 200_000, "max_tokens": 4}  # 400 KB: over the 256 KiB default


def write(path, items) -> None:
    path.write_bytes(b"".join(orjson.dumps(it) + b"\n" for it in items))


def test_an_oversized_line_is_refused_naming_it(tiny_model, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write(inp, [*GOOD, HUGE])
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(out))
    assert res.returncode == 2, res.stderr[-2000:]
    assert "in.jsonl:3: item of 400" in res.stderr and "exceeds the limit of 262144 bytes per item" in res.stderr
    assert not out.exists()
    # The limit is the user's to raise (here for the CLI and its local cluster's storage).
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(out),
                  "--max-item-bytes", str(500_000))
    # (taken, it then fails on the worker: 200,001 tokens do not fit the context)
    assert res.returncode == 4 and "1 of 3 sequences failed" in res.stderr, res.stderr[-2000:]
    assert sorted(orjson.loads(line)["id"] for line in out.read_bytes().splitlines()) == ["a", "b", "huge"]


def test_max_tokens_past_the_context_is_refused_naming_its_line(tiny_model, tmp_path):
    inp = tmp_path / "in.jsonl"
    write(inp, [*GOOD, {"id": "long", "prompt_token_ids": [1, 2], "max_tokens": 1_000_000_000}])
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(tmp_path / "o.jsonl"))
    assert res.returncode == 2
    assert "in.jsonl:3: max_tokens 1000000000 after a prompt of 2 tokens does not fit the model's context of 2048" \
        in res.stderr
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(tmp_path / "in.jsonl"),
                  "--output", str(tmp_path / "o.jsonl"), "--max-tokens", "5000")
    assert res.returncode == 2 and "--max-tokens 5000 does not fit the model's context of 2048" in res.stderr


def test_through_the_sdk_bad_items_fail_alone_and_nothing_hangs(tiny_model, tmp_path):
    with shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb") as c:
        client = shoal.Client(c.router, reply_timeout=30)
        with pytest.raises(RemoteError, match=r"3: item of \d+ bytes exceeds the limit"):
            client.submit([*GOOD, HUGE])
        # A max_tokens past the context once kept its item pending forever: it runs to the
        # end of what the worker can hold, like any sequence that reaches its context.
        job = client.submit([*GOOD, {"id": "long", "prompt_token_ids": [1, 2], "max_tokens": 1_000_000_000}],
                            params={"ignore_eos": True})
        got = {r["id"]: r for r in job.wait(timeout=120)}
    assert sorted(got) == ["a", "b", "long"]
    assert got["long"]["finish_reason"] == "length" and len(got["long"]["token_ids"]) == 2048 - 2
    assert len(got["a"]["token_ids"]) == 4


def test_on_error_skip_runs_the_rest_and_records_each_bad_line(tiny_model, tmp_path):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [orjson.dumps(it) for it in GOOD] + [
        orjson.dumps(HUGE), b"{not json", orjson.dumps({"id": "t", "prompt": "x", "temperature": -1}),
        orjson.dumps({"id": "long", "prompt_token_ids": [1, 2], "max_tokens": 1_000_000_000})]
    inp.write_bytes(b"\n".join(lines) + b"\n")
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(out), "--on-error", "skip")
    assert res.returncode == 4 and "4 of 6 sequences failed" in res.stderr, res.stderr[-2000:]
    got = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    errors = {r["line"]: r for r in got if r.get("finish_reason") == "error"}
    assert sorted(errors) == [3, 4, 5, 6]
    assert errors[3]["id"] == "huge" and "exceeds the limit of 262144 bytes per item" in errors[3]["error"]
    assert errors[4]["id"] is None and "in.jsonl:4: not valid JSON" in errors[4]["error"]
    assert errors[5]["id"] == "t" and "temperature must be >= 0" in errors[5]["error"]
    assert errors[6]["id"] == "long" and "does not fit the model's context" in errors[6]["error"]
    ok = {r["id"]: r for r in got if r.get("finish_reason") != "error"}
    assert sorted(ok) == ["a", "b"] and len(ok["a"]["token_ids"]) == 4
    assert "(6 sequences, 4 failed" in res.stdout
    # Without it the first bad line refuses the job.
    res = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(out))
    assert res.returncode == 2 and "in.jsonl:3: item of" in res.stderr


def test_a_bad_setting_is_refused_at_submit_whoever_sends_it(tiny_model, tmp_path):
    """The SDK refuses it before sending; a client that sends it anyway (the raw protocol)
    is refused by the scheduler with the field named; a bad item setting is refused by
    storage with its place. Nothing is accepted, so no item fails later on a worker."""
    from shoal.request_settings import SettingsError
    from shoal.transport.rpc import RpcClient

    with shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb") as c:
        client = shoal.Client(c.router, reply_timeout=30)
        with pytest.raises(SettingsError, match="temperature must be a number"):
            client.submit(GOOD, params={"temperature": "hot"})
        rpc = RpcClient(c.router)
        for params, field in (({"temperature": "hot"}, "params.temperature"), ({"max_tokns": 4}, "params.max_tokns"),
                              ({"regex": "a(?=b)"}, "params.regex")):
            with pytest.raises(RemoteError, match=field.replace(".", r"\.")):
                rpc.request("SubmitJob", {"job_key": f"raw-{field}", "program": "generate", "params": params,
                                          "items": GOOD}, timeout=30)
        with pytest.raises(RemoteError, match=r"2: .*top_p must be in"):
            client.submit([GOOD[0], {"id": "x", "prompt": "p", "top_p": 7}])
        assert client.submit(GOOD, params={"max_tokens": 2}).wait(timeout=120)
