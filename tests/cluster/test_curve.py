"""CURVE: with the cluster's keys every connection is encrypted and authenticated; a
peer with the wrong key (or none) is never answered, in either direction; a whole job
runs on a CURVE cluster."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import shoal
from shoal.transport.curve import CurveKeys, generate
from shoal.transport.rpc import RpcClient


def start_storage(tmp_path, keys_dir):
    env = {**os.environ, "SHOAL_CURVE_KEYS": str(keys_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "shoal.nodes.storage.storage_node", "--dir", str(tmp_path / "st"), "--node-id", "st"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    line = proc.stdout.readline().strip()
    assert line.startswith("storage: tcp://"), line
    return proc, line.split(" ", 1)[1]


def test_only_the_right_key_gets_in(tmp_path):
    right, wrong = generate(tmp_path / "right"), generate(tmp_path / "wrong")
    proc, address = start_storage(tmp_path, right)
    try:
        assert RpcClient(address, curve_keys=right).request("Ping", {"sent_at": 2.0}, timeout=5)["sent_at"] == 2.0
        with pytest.raises(TimeoutError):
            RpcClient(address, curve_keys=wrong).request("Ping", {"sent_at": 2.0}, timeout=1.5)
        with pytest.raises(TimeoutError):  # plaintext
            RpcClient(address, curve_keys=None).request("Ping", {"sent_at": 2.0}, timeout=1.5)
    finally:
        proc.kill()
        proc.wait()
    # A node started with the wrong key is refused by the cluster's clients.
    proc, address = start_storage(tmp_path, wrong)
    try:
        with pytest.raises(TimeoutError):
            RpcClient(address, curve_keys=right).request("Ping", {"sent_at": 2.0}, timeout=1.5)
    finally:
        proc.kill()
        proc.wait()


def test_keys_generate_and_load_errors(tmp_path):
    d = generate(tmp_path / "k")
    assert (d / "cluster.key").exists() and oct((d / "cluster.key_secret").stat().st_mode & 0o777) == "0o600"
    assert len(CurveKeys.load(d).public) == 40
    with pytest.raises(FileExistsError):
        generate(d)
    with pytest.raises(FileNotFoundError, match="shoal keys generate"):
        CurveKeys.load(tmp_path / "none")
    res = subprocess.run([sys.executable, "-m", "shoal.cli", "keys", "generate", str(d)], capture_output=True, text=True)
    assert res.returncode == 2 and "already holds a cluster keypair" in res.stderr


def test_a_job_on_a_curve_cluster(tiny_model, tmp_path):
    keys = generate(tmp_path / "keys")
    with shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb", curve_keys=keys) as c:
        with pytest.raises(TimeoutError):
            RpcClient(c.router, curve_keys=None).request("Ping", timeout=1.5)
        job = shoal.Client(c.router, curve_keys=keys).submit([{"id": i, "prompt_token_ids": [3 + i, 9]} for i in range(4)],
                                                             params={"max_tokens": 3})
        results = job.wait(timeout=120)
    assert sorted(r["id"] for r in results) == [0, 1, 2, 3]
