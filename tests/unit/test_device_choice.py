"""Which device a worker computes on, and which GPU each worker of a host sees."""

from __future__ import annotations

import pytest

from shoal.cluster.gpu_assignment import host_gpus, wants_gpu, worker_gpu_env
from shoal.nodes.worker.device_choice import DeviceError, check_device_name, choose_device


def test_auto_takes_the_gpu_where_torch_sees_one():
    gpu = choose_device("auto", cuda_count=2)
    assert gpu.name == "cuda:0" and gpu.is_gpu and "2 GPU(s)" in gpu.reason
    cpu = choose_device("auto", cuda_count=0)
    assert cpu.name == "cpu" and not cpu.is_gpu and "no GPU" in cpu.reason


def test_a_named_device_is_taken_or_refused_with_the_reason():
    assert choose_device("cpu", cuda_count=4).name == "cpu"
    assert choose_device("cuda", cuda_count=1).name == "cuda:0"
    assert choose_device("cuda:1", cuda_count=2).name == "cuda:1"
    with pytest.raises(DeviceError, match="sees 2 GPU"):
        choose_device("cuda:2", cuda_count=2)
    with pytest.raises(DeviceError, match="CPU build"):
        choose_device("cuda", cuda_count=0)
    for bad in ("gpu", "cuda:x", "cuda:", "tpu:0"):
        with pytest.raises(DeviceError, match="unknown device"):
            check_device_name(bad)


def test_each_worker_sees_one_gpu_round_robin(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5,7")
    gpus = host_gpus()
    assert gpus == ["2", "5", "7"]
    assert [worker_gpu_env(i, gpus)["CUDA_VISIBLE_DEVICES"] for i in range(4)] == ["2", "5", "7", "2"]
    assert worker_gpu_env(0, []) == {}
    # More workers than GPUs: each is told how many share its GPU (their KV caches split it).
    envs = [worker_gpu_env(i, gpus, 4) for i in range(4)]
    assert [e.get("SHOAL_GPU_SHARE") for e in envs] == ["2", None, None, "2"]
    assert "SHOAL_GPU_SHARE" not in worker_gpu_env(1, gpus, 3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # set but empty: no GPU
    assert host_gpus() == []
    assert wants_gpu("auto") and wants_gpu("cuda") and not wants_gpu("cpu") and not wants_gpu("cuda:1")


def test_a_cluster_files_hosts_run_one_worker_per_gpu(tmp_path):
    from shoal.cluster.cluster_file import ClusterFileError, load_cluster_file
    from shoal.cluster.cluster_up import worker_envs

    head = 'cluster = "c"\netcd = "a:1"\nmodel = "m"\nstate_dir = "/tmp"\n{device}\n' \
           '[[hosts]]\nname = "head"\naddress = "1"\nroles = ["router", "scheduler", "storage"]\n'
    path = tmp_path / "cluster.toml"
    path.write_text(head.format(device="") + '[[hosts]]\nname = "g"\naddress = "2"\nroles = ["worker"]\ngpus = [1, 3]\n'
                    '[[hosts]]\nname = "h"\naddress = "3"\nroles = ["worker"]\nworkers = 3\n')
    cf = load_cluster_file(path)
    assert cf.device == "auto"
    # gpus named: one worker each; none named: one per GPU the host has, or as many as it sets.
    assert worker_envs(cf.host("g"), cf.device, lambda: ["0"]) == [{"CUDA_VISIBLE_DEVICES": "1"},
                                                                   {"CUDA_VISIBLE_DEVICES": "3"}]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in worker_envs(cf.host("h"), cf.device, lambda: ["0", "1"])] == ["0", "1", "0"]
    assert worker_envs(cf.host("h"), "cpu", lambda: ["0", "1"]) == [{}, {}, {}]
    no_gpu = cf.host("h").__class__("x", "4", ("worker",))
    assert worker_envs(no_gpu, cf.device, lambda: []) == [{}]
    path.write_text(head.format(device='device = "tpu"') + '[[hosts]]\nname = "g"\naddress = "2"\nroles = ["worker"]\n')
    with pytest.raises(ClusterFileError, match="unknown device 'tpu'"):
        load_cluster_file(path)
    path.write_text(head.format(device="") + '[[hosts]]\nname = "g"\naddress = "2"\nroles = ["worker"]\ngpus = ["a"]\n')
    with pytest.raises(ClusterFileError, match="gpus must be a list of GPU indices"):
        load_cluster_file(path)


def test_a_worker_reads_how_many_share_its_gpu(monkeypatch):
    from shoal.nodes.worker.worker_config import gpu_share

    monkeypatch.delenv("SHOAL_GPU_SHARE", raising=False)
    assert gpu_share() == 1
    monkeypatch.setenv("SHOAL_GPU_SHARE", "3")
    assert gpu_share() == 3
    monkeypatch.setenv("SHOAL_GPU_SHARE", "two")
    with pytest.raises(ValueError, match="SHOAL_GPU_SHARE='two'"):
        gpu_share()
