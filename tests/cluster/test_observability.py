"""`shoal nodes` and the Prometheus endpoint on a running local cluster."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import shoal
from shoal.cluster.etcd_server import free_port


def test_nodes_listing_and_metrics(tiny_model, tmp_path):
    with shoal.LocalCluster(tiny_model, workers=1, state_dir=tmp_path / "c", policy="mb") as cluster:
        job = shoal.Client(cluster.router).submit([{"id": i, "prompt_token_ids": [3, i + 1]} for i in range(5)],
                                                  params={"max_tokens": 3, "ignore_eos": True})
        assert len(job.wait(timeout=120)) == 5
        out = subprocess.run([sys.executable, "-m", "shoal.cli", "nodes", "--dir", str(cluster.dir)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert {ln.split()[0] for ln in lines} == {"router", "scheduler", "storage", "worker"}
        worker = next(ln for ln in lines if ln.startswith("worker"))
        assert "generated 15 tokens" in worker and "kv " in worker
        assert "dtype float32" in worker and "rows padded" not in worker  # padded: bf16 on AMX only
        assert "leader True" in next(ln for ln in lines if ln.startswith("scheduler"))
        # A storage node with a metrics port, scraped over HTTP.
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "shoal.nodes.storage.storage_node", "--dir", str(tmp_path / "s2"),
                                 "--metrics-port", str(port)], stdout=subprocess.PIPE, text=True)
        try:
            proc.stdout.readline()
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            assert 'shoal_uptime_s{node_id=' in body and 'role="storage"' in body
        finally:
            proc.kill()
            proc.wait()
