"""A cluster is not open to whoever can reach it: beyond loopback a node refuses to
listen without CURVE keys (unless --insecure), `shoal up` makes keys for its cluster,
a keyless client is told so, storage opens only paths under its data roots (saying
nothing of whether a file exists), and workers import only allowed user programs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from netns import NetnsHost

import shoal
from shoal.transport.rpc import RemoteError

pytestmark = pytest.mark.netns


def cli(*args, env=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "shoal.cli", *args], capture_output=True, text=True, timeout=timeout,
                          env={k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None})


def test_a_node_beyond_loopback_needs_keys_or_insecure(tmp_path):
    with NetnsHost("x1") as net:  # an address of this machine that is not loopback
        res = cli("node", "storage", "--dir", str(tmp_path / "s"), "--bind", f"tcp://{net.outer_ip}:0",
                  env={"SHOAL_CURVE_KEYS": None})
        assert res.returncode == 2
        assert f"refusing to listen on tcp://{net.outer_ip}:0 without CURVE keys" in res.stderr
        proc = subprocess.Popen([sys.executable, "-m", "shoal.cli", "node", "storage", "--dir", str(tmp_path / "s"),
                                 "--bind", f"tcp://{net.outer_ip}:0", "--insecure"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert proc.stdout.readline().startswith(f"storage: tcp://{net.outer_ip}:")
        finally:
            proc.kill()
            proc.wait()


def test_shoal_up_beyond_loopback_is_closed_by_default(tiny_model, tmp_path):
    state = tmp_path / "c"
    secret = tmp_path / "secret.txt"
    secret.write_text("not JSON\n")
    with NetnsHost("x2") as net:
        up = cli("up", "--model", str(tiny_model), "--dir", str(state), "--host", net.outer_ip, "--detach")
        try:
            assert up.returncode == 0, up.stderr[-2000:]
            keys = state / "keys"
            assert f"CURVE keys: {keys}" in up.stdout and (keys / "cluster.key_secret").exists()
            router = next(line.split()[1] for line in up.stdout.splitlines() if line.startswith("router:"))
            res = cli("status", "j", "--router", router, env={"SHOAL_CURVE_KEYS": None})
            assert res.returncode == 2 and "this client has no CURVE keys" in res.stderr
            res = cli("nodes", "--dir", str(state), env={"SHOAL_CURVE_KEYS": None})
            assert res.returncode == 0 and "unreachable" not in res.stdout and res.stdout.count("messages") == 4

            client = shoal.Client(router, curve_keys=keys, timeout=60)
            # Storage opens no path a request names: the refusal is the same whether the file exists.
            for path in (secret, tmp_path / "no-such-file.jsonl"):
                with pytest.raises(RemoteError, match="outside this storage node's data roots") as e:
                    client.submit(input_path=str(path))
                assert "not valid JSON" not in str(e.value) and "does not exist" not in str(e.value)
            # Workers import no user program; built-ins run.
            job = client.submit([{"id": 1, "prompt_token_ids": [3, 4]}], program="os.path:join")
            rec = job.wait(timeout=120)[0]
            assert rec["finish_reason"] == "error" and "is not allowed on this worker" in rec["error"]
            ok = client.submit([{"id": 1, "prompt_token_ids": [3, 4], "max_tokens": 2}]).wait(timeout=120)[0]
            assert len(ok["token_ids"]) == 2
        finally:
            down = cli("down", "--dir", str(state))
        assert down.returncode == 0, down.stderr
