"""Three hosts (network namespaces on a bridge) started from one cluster file by
`cluster-up` each, with CURVE keys and shaped links: a head (router, scheduler,
storage) and two worker hosts. A generation job runs across them whole; then one with
the link to a worker host cut mid-job and healed; then one with a whole worker host's
processes killed mid-job. Each time: every item exactly once, the same output as the
engine alone (the shared comparator). Between them, a corpus embedded across the worker
hosts and IRCoT questions over an index of it: each answer the same as the question's
alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from job_check import PARAMS, check_whole, wait_for_progress, workload
from netns_hosts import NetnsHosts

import shoal
from rag_setup import embed_corpus, rag_items

from shoal.cli.index_build import build_index
from shoal.cluster.etcd_server import EtcdServer
from shoal.output_compare import compare_rag
from shoal.transport.rpc import RpcClient

HEAD, WORKER_A, WORKER_B = 1, 2, 3


def cluster_file(tmp_path, net: NetnsHosts, etcd: str, model, encoder) -> str:
    path = tmp_path / "cluster.toml"
    path.write_text(f'''
cluster = "hosts"
etcd = ["{etcd}"]
model = "{model}"
encoder = "{encoder}"
state_dir = "{tmp_path / 'state'}"
data_roots = ["{tmp_path / 'data'}"]

[[hosts]]
name = "head"
address = "{net.address(HEAD)}"
roles = ["router", "scheduler", "storage"]

[[hosts]]
name = "wa"
address = "{net.address(WORKER_A)}"
roles = ["worker"]

[[hosts]]
name = "wb"
address = "{net.address(WORKER_B)}"
roles = ["worker"]
''')
    return str(path)


def on_host(net: NetnsHosts, k: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*net.prefix(k), sys.executable, "-m", "shoal.cli", *args], capture_output=True, text=True,
                          timeout=300)


def kill_host(tmp_path, name: str) -> int:
    """SIGKILL to every process a host's cluster-up started: the host is gone."""
    pids = json.loads((tmp_path / "state" / name / "pids.json").read_text())["pids"]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(pids)


@pytest.mark.netns
@pytest.mark.timeout(600)
def test_three_hosts_over_shaped_links_a_cut_and_a_lost_host(tiny_model, minilm, tmp_path):
    hosts = {HEAD: "head", WORKER_A: "wa", WORKER_B: "wb"}
    with NetnsHosts(3) as net, EtcdServer(tmp_path / "etcd", host=net.gateway) as etcd:
        shaped = [net.shape(k, rate_mbit=100, delay_ms=2, loss_pct=0.5) for k in hosts]
        (tmp_path / "data").mkdir()  # a data root is a folder that exists when storage starts
        path = cluster_file(tmp_path, net, etcd.endpoint, tiny_model, minilm)
        try:
            for k, name in hosts.items():  # the head first: its cluster-up makes the CURVE keys
                up = on_host(net, k, "cluster-up", "--file", path, "--host", name)
                assert up.returncode == 0, up.stderr[-2000:]
                assert net.address(k) in up.stdout
            router = (tmp_path / "state" / "head" / "router.txt").read_text().strip()
            client = shoal.Client(router, curve_keys=str(tmp_path / "state" / "keys"), reply_timeout=5)

            items = workload(60)
            whole = client.submit(items, params=PARAMS.to_dict(), job_key="across-hosts").wait(timeout=300)
            check_whole(tiny_model, items, whole)
            keys = str(tmp_path / "state" / "keys")
            for name in ("wa", "wb"):  # both worker hosts took part, over their shaped links
                address = json.loads((tmp_path / "state" / name / "pids.json").read_text())["addresses"][f"worker-{name}-0"]
                rpc = RpcClient(address, curve_keys=keys)
                assert rpc.request("StatsQuery", timeout=10)["stats"]["counters"]["sequences.assigned"] > 0, name
                rpc.close()

            # W2 then W3 shapes across the hosts: a corpus embedded in SuperBatches on both
            # worker hosts, an index of it on the head, questions retrieving over the links.
            corpus, emb = embed_corpus(client, tmp_path / "data", minilm, count=120)
            build_index(emb, tmp_path / "data" / "index", 2)
            client.load_index(tmp_path / "data" / "index", "w3")
            work = rag_items(corpus, 6)
            params = {"k": 3, "index": "w3"}
            together = {r["id"]: r for r in client.submit(work, program="ircot", params=params).wait(timeout=300)}
            assert sorted(together) == sorted(it["id"] for it in work)
            for it in work[:2]:  # the same answers as each question alone
                alone = client.submit([it], program="ircot", params=params).wait(timeout=120)[0]
                got = together[it["id"]]
                assert "error" not in got and len(got["hops"]) == it["max_hops"], got
                assert all(len(h["passages"]) == 3 for h in got["hops"])
                cmp = compare_rag(got, alone)
                assert cmp, f"{it['id']}: {cmp.detail}"

            crossed = net.stats()  # the links were lossy: frames were lost on them, and TCP made up for it
            print("frames before the cut:", crossed)
            assert sum(p["dropped"] for p in crossed.values()) > 0, crossed

            cut = client.submit(items, params=PARAMS.to_dict(), job_key="link-cut")
            wait_for_progress(cut, 3)
            net.cut(WORKER_A)
            time.sleep(8)  # past the 3 s lease: its work goes to the other host
            net.heal(WORKER_A)
            check_whole(tiny_model, items, cut.wait(timeout=300))

            lost = client.submit(items, params=PARAMS.to_dict(), job_key="host-lost")
            wait_for_progress(lost, 3)
            assert kill_host(tmp_path, "wb") == 1
            check_whole(tiny_model, items, lost.wait(timeout=300))
            client.close()
        finally:
            for k, name in hosts.items():
                on_host(net, k, "cluster-down", "--file", path, "--host", name)
        print(f"links: {shaped[0]}")
