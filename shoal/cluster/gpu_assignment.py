"""One worker per GPU: which GPUs this host has, and which one each worker sees.

A worker computes on one device, so a host with eight GPUs runs eight workers, each
started with `CUDA_VISIBLE_DEVICES` naming one GPU (inside, that GPU is its `cuda:0`).
Read without torch (the CLI and the cluster tools stay light): `CUDA_VISIBLE_DEVICES`
where it is set, else what `nvidia-smi` lists, else none.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from shoal.nodes.worker.device_choice import GPU_SHARE_ENV


def host_gpus() -> list[str]:
    """The GPUs this process may give its workers, as `CUDA_VISIBLE_DEVICES` entries."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip() and g.strip() != "-1"]
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def wants_gpu(device: str) -> bool:
    """Whether workers started with `--device device` are each given a GPU of their own
    (an explicit `cuda:N` already names one)."""
    return device in ("auto", "cuda")


def worker_gpu_env(index: int, gpus: list[str], workers: int = 0) -> dict[str, str]:
    """The environment that gives worker `index` of `workers` its GPU (round robin over
    `gpus`, so more workers than GPUs share them, and then each is told how many share
    its GPU: `SHOAL_GPU_SHARE`, so that their KV caches split the device's memory);
    empty without GPUs."""
    if not gpus:
        return {}
    env = {"CUDA_VISIBLE_DEVICES": gpus[index % len(gpus)]}
    sharing = sum(1 for i in range(max(workers, index + 1)) if i % len(gpus) == index % len(gpus))
    if sharing > 1:
        env[GPU_SHARE_ENV] = str(sharing)
    return env
