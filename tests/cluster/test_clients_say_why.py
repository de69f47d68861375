"""Clients say what is wrong instead of waiting in silence: a command waiting on a
node that is down says what it waits for and gives up after --timeout naming it; a
keyless client of a CURVE cluster is told it has no keys; a node that cannot start
gives its reason; an unwritable output and a bad per-item sampling value are refused
before any work starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import orjson
import pytest

import shoal
from shoal.transport.curve import generate


def run_cli(*args, timeout=120, env=None):
    t = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "shoal.cli", *args], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})})
    return res, time.monotonic() - t


def kill(c: shoal.LocalCluster, name: str) -> None:
    c.process(name).send_signal(signal.SIGKILL)
    c.process(name).wait()


def write(path, items) -> None:
    path.write_bytes(b"".join(orjson.dumps(it) + b"\n" for it in items))


def test_commands_give_up_naming_the_node_that_is_down(tiny_model, tmp_path):
    inp = tmp_path / "in.jsonl"
    write(inp, [{"id": "a", "prompt_token_ids": [5, 6], "max_tokens": 3}])
    with shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb") as c:
        res, _ = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(tmp_path / "o"),
                         "--router", c.router)
        assert res.returncode == 0, res.stderr[-2000:]
        kill(c, "scheduler-0")
        time.sleep(4)  # its lease expires: it is gone from the cluster
        res, took = run_cli("status", "some-job", "--router", c.router, "--timeout", "4")
        assert res.returncode == 3 and took < 30
        assert "waiting for the cluster (JobStatusQuery): no scheduler node in the cluster" in res.stderr
        assert "gave up on JobStatusQuery after 4 s: no scheduler node in the cluster" in res.stderr
        res, _ = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(tmp_path / "o"),
                         "--router", c.router, "--timeout", "3")
        assert res.returncode == 3 and "gave up on SubmitJob after 3 s: no scheduler node in the cluster" in res.stderr
        # `shoal nodes` lists who is left; a node that is gone is not listed.
        res, _ = run_cli("nodes", "--etcd", c.etcd.endpoint, "--cluster", c.cluster)
        assert res.returncode == 0 and "storage-0" in res.stdout and "scheduler-0" not in res.stdout
        # The SDK gives up too, by its timeout, whatever it retries.
        client = shoal.Client(c.router, timeout=2)
        t = time.monotonic()
        with pytest.raises(TimeoutError, match="no scheduler node in the cluster"):
            client.job("j").status()
        assert time.monotonic() - t < 10
        kill(c, "router-0")
        res, took = run_cli("status", "some-job", "--router", c.router, "--timeout", "3")
        assert res.returncode == 3 and took < 30
        assert f"the router {c.router} does not answer" in res.stderr
        etcd = c.etcd.endpoint
    res, took = run_cli("nodes", "--etcd", etcd, "--timeout", "2")
    assert res.returncode == 2 and f"etcd at {etcd} did not answer" in res.stderr and took < 30


def test_a_keyless_client_of_a_curve_cluster_is_told_so(tiny_model, tmp_path):
    keys = generate(tmp_path / "keys")
    with shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb", curve_keys=keys) as c:
        res, took = run_cli("status", "j", "--router", c.router, "--timeout", "60")
        assert res.returncode == 2 and took < 30, res.stderr[-2000:]
        assert "the cluster uses CURVE and this client has no CURVE keys" in res.stderr
        res, _ = run_cli("status", "j", "--router", c.router, env={"SHOAL_CURVE_KEYS": str(generate(tmp_path / "other"))})
        assert res.returncode == 2 and "refused this client's CURVE keys" in res.stderr
        res, _ = run_cli("status", "j", "--router", c.router, env={"SHOAL_CURVE_KEYS": str(keys)})
        assert res.returncode == 2 and "no job j" in res.stderr  # in, and answered


def test_a_node_that_cannot_start_says_why(tiny_model, tmp_path):
    import shutil

    bad = tmp_path / "bad-model"
    shutil.copytree(tiny_model, bad)
    cfg = orjson.loads((bad / "config.json").read_bytes())
    (bad / "config.json").write_bytes(orjson.dumps({**cfg, "architectures": ["NoSuchForCausalLM"]}))
    inp = tmp_path / "in.jsonl"
    write(inp, [{"id": "a", "prompt": "x"}])
    res, _ = run_cli("generate", "--model", str(bad), "--input", str(inp), "--output", str(tmp_path / "o.jsonl"))
    assert res.returncode == 2
    assert "worker-0 did not start: " in res.stderr and "unsupported architecture ['NoSuchForCausalLM']" in res.stderr
    (bad / "tokenizer.json").unlink()
    (bad / "config.json").write_bytes(orjson.dumps(cfg))
    res, _ = run_cli("generate", "--model", str(bad), "--input", str(inp), "--output", str(tmp_path / "o.jsonl"))
    assert res.returncode == 2 and "worker-0 did not start: " in res.stderr and "tokenizer.json" in res.stderr


def test_output_and_item_overrides_are_checked_before_the_job(tiny_model, tmp_path):
    inp = tmp_path / "in.jsonl"
    write(inp, [{"id": "a", "prompt": "x"}])
    for output, why in ((tmp_path / "missing" / "o.jsonl", "output directory"), (tmp_path, "is a directory")):
        res, took = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(output))
        assert res.returncode == 2 and why in res.stderr and took < 20
        assert "job " not in res.stderr  # refused before a job (or a cluster) started
    write(inp, [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y", "temperature": -1}])
    res, _ = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(tmp_path / "o.jsonl"))
    assert res.returncode == 2 and "in.jsonl:2: temperature must be >= 0, got -1" in res.stderr
    write(inp, [{"id": "b", "prompt": "y", "top_p": 0}])
    res, _ = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(tmp_path / "o.jsonl"))
    assert res.returncode == 2 and "in.jsonl:1: top_p must be in (0, 1], got 0" in res.stderr
    # A valid override is used: the same prompt sampled vs greedy.
    prompt = [7, 8, 9]
    write(inp, [{"id": "greedy", "prompt_token_ids": prompt, "max_tokens": 12, "ignore_eos": True},
                {"id": "sampled", "prompt_token_ids": prompt, "max_tokens": 12, "ignore_eos": True,
                 "temperature": 1.5, "seed": 3}])
    out = tmp_path / "o.jsonl"
    res, _ = run_cli("generate", "--model", str(tiny_model), "--input", str(inp), "--output", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    got = {r["id"]: r["token_ids"] for r in map(orjson.loads, out.read_bytes().splitlines())}
    assert len(got["greedy"]) == len(got["sampled"]) == 12 and got["greedy"] != got["sampled"]
