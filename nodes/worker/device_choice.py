"""Which device a worker computes on: `--device auto` (the default) takes the GPU where
torch sees one, else the host CPU; `cpu`, `cuda` or `cuda:N` name one.

A worker computes on one device. On a host with several GPUs each worker is started
seeing one of them (`CUDA_VISIBLE_DEVICES`, `gpu_assignment.py`), so inside the worker
`auto` and `cuda` both mean its `cuda:0`. The choice is made once, when the engine is
set up (`engine_setup.py`), and logged with its reason as the dtype's is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from shoal.protocol.errors import ShoalError

DEVICE_HELP = "auto (a GPU where torch sees one, else the CPU), cpu, cuda or cuda:N"
# How many workers were given this worker's GPU, set beside CUDA_VISIBLE_DEVICES by
# whoever starts them (`gpu_assignment.worker_gpu_env`); read by `worker_config.gpu_share`.
GPU_SHARE_ENV = "SHOAL_GPU_SHARE"


class DeviceError(ShoalError, ValueError):
    """A device that cannot be used here, named with the reason."""


@dataclass(frozen=True)
class DeviceChoice:
    name: str  # "cpu" or "cuda:N": what torch.device() takes
    reason: str

    @property
    def is_gpu(self) -> bool:
        return self.name.startswith("cuda")


def check_device_name(requested: str) -> str:
    """`requested` if it is a device name Shoal takes, else DeviceError (for the CLI, before
    anything loads torch)."""
    if requested in ("auto", "cpu", "cuda"):
        return requested
    head, _, index = requested.partition(":")
    if head == "cuda" and index.isdigit():
        return requested
    raise DeviceError(f"unknown device {requested!r}; choose {DEVICE_HELP}")


def device_arg(text: str) -> str:
    """argparse's type for --device: a name Shoal takes, refused when the command starts."""
    import argparse

    try:
        return check_device_name(text)
    except DeviceError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_device_arg(ap) -> None:
    ap.add_argument("--device", type=device_arg, default="auto",
                    help=f"the workers' device: {DEVICE_HELP}; with auto or cuda each local worker gets a GPU of "
                         "its own (CUDA_VISIBLE_DEVICES), round robin over the host's")


def choose_device(requested: str = "auto", cuda_count: int | None = None) -> DeviceChoice:
    """The device for `requested`; `cuda_count` is how many GPUs torch sees (asked of
    torch when None). A GPU asked for where there is none is an error, not a silent CPU."""
    check_device_name(requested)
    if cuda_count is None:
        cuda_count = visible_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "no CUDA_VISIBLE_DEVICES"
    if requested == "cpu":
        return DeviceChoice("cpu", "--device cpu")
    if requested == "auto":
        if cuda_count:
            return DeviceChoice("cuda:0", f"auto: torch sees {cuda_count} GPU(s) ({seen}); this worker takes cuda:0")
        return DeviceChoice("cpu", "auto: torch sees no GPU (a CPU build of torch, or no device visible): the host CPU")
    index = int(requested.partition(":")[2] or 0)
    if index >= cuda_count:
        raise DeviceError(f"--device {requested}: torch sees {cuda_count} GPU(s) here ({seen})"
                          + ("; is this torch's CPU build?" if cuda_count == 0 else ""))
    return DeviceChoice(f"cuda:{index}", f"--device {requested}")


def visible_gpus() -> int:
    import torch

    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except (RuntimeError, AssertionError):  # a CUDA build on a host whose driver is missing
        return 0


def device_label(name: str) -> str:
    """What a device is, for logs, `shoal nodes` and the calibration's key: the GPU's
    model name and memory, or the CPU's model."""
    if name.startswith("cuda"):
        import torch

        props = torch.cuda.get_device_properties(torch.device(name))
        return f"{props.name} ({props.total_memory / 2**30:.0f} GiB)"
    from shoal.nodes.worker.dtype_choice import cpu_model

    return cpu_model()
