"""Two "hosts" on one machine (127.0.0.2 and 127.0.0.3) started from one cluster file,
each with only its own roles, run a job together; bad files get named errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

import shoal
from shoal.cluster.cluster_file import ClusterFileError, load_cluster_file


def write_file(tmp_path, etcd, model, body=None):
    path = tmp_path / "cluster.toml"
    path.write_text(body or f'''
cluster = "two-hosts"
etcd = ["{etcd}"]
model = "{model}"
state_dir = "{tmp_path / 'state'}"

[[hosts]]
name = "head"
address = "127.0.0.2"
roles = ["router", "scheduler", "storage"]

[[hosts]]
name = "gpu"
address = "127.0.0.3"
roles = ["worker"]
workers = 2
''')
    return path


def cli(*args):
    return subprocess.run([sys.executable, "-m", "shoal.cli", *args], capture_output=True, text=True, timeout=300)


def test_two_hosts_from_one_cluster_file(tmp_path, etcd_endpoint, tiny_model):
    path = write_file(tmp_path, etcd_endpoint, tiny_model)
    try:
        up_head = cli("cluster-up", "--file", str(path), "--host", "head")
        assert up_head.returncode == 0, up_head.stderr
        assert "127.0.0.2" in up_head.stdout and "worker" not in up_head.stdout
        up_gpu = cli("cluster-up", "--file", str(path), "--host", "gpu")
        assert up_gpu.returncode == 0, up_gpu.stderr
        assert up_gpu.stdout.count("tcp://127.0.0.3:") == 2 and "router" not in up_gpu.stdout
        router = (tmp_path / "state" / "head" / "router.txt").read_text().strip()
        job = shoal.Client(router).submit([{"id": i, "prompt_token_ids": [i + 1, 7, 9]} for i in range(8)],
                                          params={"max_tokens": 4, "ignore_eos": True})
        results = job.wait(timeout=120)
        assert sorted(r["id"] for r in results) == list(range(8))
        assert all(len(r["token_ids"]) == 4 for r in results)
    finally:
        down = [cli("cluster-down", "--file", str(path), "--host", h) for h in ("gpu", "head")]
    assert "stopped 2 nodes" in down[0].stdout and "stopped 3 nodes" in down[1].stdout


@pytest.mark.parametrize("body, message", [
    ('cluster = "x"\n', "lacks 'hosts'"),
    ('cluster = "x"\netcd = "a:1"\nmodel = "m"\nstate_dir = "/tmp"\n[[hosts]]\nname = "a"\naddress = "1"\nroles = ["gpu"]\n',
     "unknown role 'gpu'"),
    ('cluster = "x"\netcd = "a:1"\nmodel = "m"\nstate_dir = "/tmp"\n[[hosts]]\nname = "a"\naddress = "1"\nroles = ["worker"]\n',
     "no host runs a router"),
    ("not = [toml", "cluster.toml"),
])
def test_bad_cluster_files(tmp_path, body, message):
    with pytest.raises(ClusterFileError, match=message):
        load_cluster_file(write_file(tmp_path, "", "", body))
