"""Weight streaming for a device that cannot hold the model (`--device-memory BYTES`).

The embeddings, the final norm, the output projection and as many decoder layers as fit
stay resident; the other layers' weights live in host memory (pinned on a GPU) and are
copied into one of two device slots just ahead of use: while layer i computes, the next
streamed layer's weights are copied into the other slot on a copy thread (a copy stream
on a GPU). A mixture-of-experts layer's experts are copied only once the router has
chosen them, and only those some token of the step chose: experts nobody routes to cost
no bytes.

Each streamed layer's parameters are bound, once, to views of its slot (layers
alternate between the two), so a fetch is a copy into memory the modules already read:
nothing is re-bound while the model runs. On a CPU the "device" is the same memory and
a fetch a memcpy, measured like any other: the code path is the one a GPU takes.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch
from torch import nn

log = logging.getLogger(__name__)

EXPERT_PARAMS = ("gate_up", "down")  # a MoE block's stacked expert tensors (`models/moe.py`)


def nbytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


class WeightStreamer:
    def __init__(self, model: nn.Module, device_bytes: int, resident_layers: int | None = None,
                 overlap: bool = True, routed_experts_only: bool = True):
        """`resident_layers`, `overlap` and `routed_experts_only` exist for baselines
        (`scripts/bench_offload_weights.py`): a fixed count of resident layers, copies
        not started ahead of use, every expert copied."""
        layers = list(model.layers)
        per_layer = [nbytes(layer) for layer in layers]
        fixed = nbytes(model) - sum(per_layer)
        slot = max(per_layer)
        resident = 0
        # Resident layers from the front, keeping room for the two slots a streamed layer needs.
        while resident < len(layers) and fixed + sum(per_layer[:resident + 1]) + (
                2 * slot if resident + 1 < len(layers) else 0) <= device_bytes:
            resident += 1
        if resident_layers is not None:
            resident, device_bytes = resident_layers, fixed + sum(per_layer[:resident_layers]) + 2 * slot
        self.overlap, self.routed_experts_only = overlap, routed_experts_only
        if fixed + sum(per_layer[:resident]) + (2 * slot if resident < len(layers) else 0) > device_bytes:
            raise ValueError(f"--device-memory {device_bytes} bytes cannot hold the embeddings and output projection "
                             f"({fixed} bytes) and two streamed layers ({2 * slot} bytes)")
        self.layers = layers
        self.streamed = list(range(resident, len(layers)))
        self.position = {i: n for n, i in enumerate(self.streamed)}
        self.host: dict[int, dict[str, torch.Tensor]] = {}
        self.slots: list[dict[str, torch.Tensor]] = [{}, {}]
        for i in self.streamed:
            slot_params = self.slots[self.position[i] % 2]
            host = {}
            for name, p in layers[i].named_parameters():
                host[name] = p.detach().clone().pin_memory() if torch.cuda.is_available() else p.detach().clone()
                if name not in slot_params:
                    slot_params[name] = torch.empty_like(p.detach())
                p.data = slot_params[name]  # the layer reads its slot from now on
            self.host[i] = host
            mlp = getattr(layers[i], "mlp", None)
            if hasattr(mlp, "router"):
                mlp.on_experts = lambda used, i=i: self.fetch_experts(i, used)
        self.resident_bytes = fixed + sum(per_layer[:resident]) + (2 * slot if self.streamed else 0)
        self.weight_bytes = fixed + sum(per_layer)
        self.stats = {"bytes_fetched": 0, "layers_fetched": 0, "experts_fetched": 0, "experts_skipped": 0,
                      "fetch_wait_s": 0.0}
        self._copier = ThreadPoolExecutor(1, thread_name_prefix="weight-fetch")
        self._pending: dict[int, Future] = {}
        if self.streamed:
            log.info("[stream] %d of %d layers resident, %d streamed through 2 slots of %.1f MB "
                     "(%.0f%% of %.1f MB of weights on the device)", resident, len(layers), len(self.streamed),
                     slot / 1e6, 100 * self.resident_bytes / self.weight_bytes, self.weight_bytes / 1e6)
            self._prefetch(self.streamed[0])

    def _copy_dense(self, i: int) -> int:
        """Copies a layer's weights but its experts; returns the bytes copied."""
        slot, copied = self.slots[self.position[i] % 2], 0
        expert_names = self._expert_names(i)
        with torch.no_grad():
            for name, src in self.host[i].items():
                if name in expert_names:
                    continue
                slot[name].copy_(src, non_blocking=True)
                copied += src.numel() * src.element_size()
        return copied

    def _expert_names(self, i: int) -> set[str]:
        return {f"mlp.{n}" for n in EXPERT_PARAMS} if hasattr(getattr(self.layers[i], "mlp", None), "router") else set()

    def _prefetch(self, i: int) -> None:
        if i not in self._pending:
            self._pending[i] = self._copier.submit(self._copy_dense, i)

    def before_layer(self, i: int) -> None:
        """Waits for layer i's weights (if streamed) and starts copying the next one's."""
        if i not in self.position:
            return
        future = self._pending.pop(i, None) or self._copier.submit(self._copy_dense, i)
        t = time.perf_counter()
        self.stats["bytes_fetched"] += future.result()
        self.stats["fetch_wait_s"] += time.perf_counter() - t
        self.stats["layers_fetched"] += 1
        n = self.position[i]
        if n + 1 < len(self.streamed) and self.overlap:
            self._prefetch(self.streamed[n + 1])

    def after_step(self) -> None:
        """The next step starts with the first streamed layer: fetch it now (its slot is free)."""
        if self.streamed and self.overlap:
            self._prefetch(self.streamed[0])

    def fetch_experts(self, i: int, used: list[int]) -> None:
        """Copies the experts a MoE layer's router chose for this step, and no others."""
        slot, host = self.slots[self.position[i] % 2], self.host[i]
        if not self.routed_experts_only:
            used = list(range(host["mlp.gate_up"].shape[0]))
        with torch.no_grad():
            for name in EXPERT_PARAMS:
                key = f"mlp.{name}"
                for e in used:
                    slot[key][e].copy_(host[key][e], non_blocking=True)
                    self.stats["bytes_fetched"] += host[key][e].numel() * host[key][e].element_size()
        self.stats["experts_fetched"] += len(used)
        self.stats["experts_skipped"] += host["mlp.gate_up"].shape[0] - len(used)

    def summary(self) -> dict:
        return {"resident_bytes": self.resident_bytes, "weight_bytes": self.weight_bytes,
                "streamed_layers": len(self.streamed), **self.stats}

    def close(self) -> None:
        self._copier.shutdown(wait=True)
