"""Storage's disk fills up mid-job (a real tmpfs under its data directory, filled by
another writer) and is freed: storage stays up and says why it takes no results, the
workers keep theirs and retry, a new submit is refused naming the disk, and once space
is back the job finishes whole: every id once, the undisturbed output."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from job_check import PARAMS, WORKER_ARGS, check_whole, wait_for_progress, workload
from small_disk import SmallDisk

import shoal
from shoal.protocol.errors import ProtocolError
from shoal.transport.rpc import RemoteError, RpcClient


def _storage_stats(c) -> dict:
    rpc = RpcClient(c.nodes["storage-0"][2])
    try:
        return rpc.request("StatsQuery", timeout=5)["stats"]
    finally:
        rpc.close()


def _until(check, timeout: float = 60.0, what: str = ""):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise TimeoutError(f"not within {timeout}s: {what}")


@pytest.mark.mounts
@pytest.mark.timeout(300)
def test_storage_disk_filled_mid_job_then_freed(tiny_model, tmp_path):
    items = workload(60)
    # No reserve: the writes run into the kernel's ENOSPC itself, the path a reserve
    # only makes rarer (the commit rolled back, its writes refused, not acknowledged).
    with SmallDisk(tmp_path / "c" / "storage", 32 << 20) as disk, \
            shoal.LocalCluster(tiny_model, state_dir=tmp_path / "c", policy="mb", worker_args=WORKER_ARGS,
                               storage_args=["--min-free-mb", "0"]) as c:
        client = shoal.Client(c.router)
        job = client.submit(items, params=PARAMS.to_dict())
        wait_for_progress(job, 3)
        disk.fill(leave=0)

        # Refused writes make it a state: storage says so, to a stats query and to a reader.
        stats = _until(lambda: (s := _storage_stats(c))["disk"]["full"] and s, what="storage seeing its disk full")
        assert stats["disk"]["dir"] == str(disk.path)
        refused = _until(lambda: _storage_stats(c)["counters"].get("errors.disk_full", 0), what="a write refused")
        assert refused >= 1
        batch = client._request("Subscribe", {"job_id": job.id, "offset": 0})
        assert "storage-0's disk is full" in batch["disk_full"] and str(disk.path) in batch["disk_full"]
        nodes = subprocess.run([sys.executable, "-m", "shoal.cli", "nodes", "--dir", str(c.dir)], capture_output=True,
                               text=True, timeout=60)
        assert nodes.returncode == 0 and "FULL" in nodes.stdout, nodes.stdout + nodes.stderr
        with pytest.raises(RemoteError) as e:  # a new job is refused before it is accepted, naming the disk
            client.submit(workload(3, seed=9), params=PARAMS.to_dict())
        assert e.value.code == ProtocolError.DISK_FULL and str(disk.path) in e.value.message
        held = job.status()["done"]
        time.sleep(2.0)
        assert job.status()["done"] == held < len(items)  # nothing lands while the disk is full

        disk.free_up()
        results = job.wait(timeout=180)
        assert not _storage_stats(c)["disk"]["full"]
        check_whole(tiny_model, items, results)
        client.close()
