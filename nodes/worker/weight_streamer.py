"""Weight streaming for a device that cannot hold the model (`--device-memory BYTES`).

The embeddings, the final norm, the output projection and as many decoder layers as fit
stay resident; the other layers' weights live in host memory (`host_layer.py`: one
allocation per layer, page-locked on a GPU) and are copied into one of two device slots
just ahead of use: while layer i computes, the next streamed layer's weights are copied
into the other slot (`weight_copies.py`: on a CPU on a copy thread; on a GPU on a CUDA
stream of their own, ordered against the compute stream by events, so that copies
overlap kernels and the host never waits on either; not yet run on a GPU). A
mixture-of-experts layer's experts are copied only once the router has chosen them, and
only those some token of the step chose: experts nobody routes to cost no bytes.

Each streamed layer's parameters are bound, once, to views of its slot (layers
alternate between the two), so a fetch is a copy into memory the modules already read:
nothing is re-bound while the model runs. On a CPU the "device" is the same memory and
a fetch a memcpy, measured like any other: the code path is the one a GPU takes.

Every copy is timed (on a GPU by the copy stream's events), so the streamer knows its copy
bandwidth, and with it the fetch term
of the step cost (`scheduler/fetch_cost.py`): the engine sizes its steps by it, and a
step whose tokens are expected to use most of a MoE layer's experts has all of them
copied ahead of use with the layer's dense part, hidden behind the previous layer's
compute instead of waited for after the router chose.
"""

from __future__ import annotations

import ctypes
import logging
import time
from dataclasses import replace

import torch
from torch import nn

from shoal.nodes.worker.host_layer import HostLayer
from shoal.nodes.worker.page_lock import page_lock
from shoal.nodes.worker.weight_copies import copies_for
from shoal.scheduler.fetch_cost import FetchCost

log = logging.getLogger(__name__)

EXPERT_PARAMS = ("gate_up", "down")  # a MoE block's stacked expert tensors (`models/moe.py`)


def copy_weights(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Host memory into the device. On a GPU, an asynchronous copy. On a CPU, one plain
    memcpy: a `copy_` from the copy thread would be a parallel torch op, and a second
    thread entering parallel ops gets an OpenMP team of its own, which on a machine with
    no spare core makes every op of the compute thread wait on futex wakes (see
    `compute_thread.py`)."""
    if dst.is_cuda or src.is_cuda or not (dst.is_contiguous() and src.is_contiguous()):
        dst.copy_(src, non_blocking=True)
        return
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise ValueError(f"weight copy of {tuple(src.shape)} {src.dtype} into {tuple(dst.shape)} {dst.dtype}")
    ctypes.memmove(dst.data_ptr(), src.data_ptr(), src.numel() * src.element_size())


def nbytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


class WeightStreamer:
    def __init__(self, model: nn.Module, device_bytes: int, resident_layers: int | None = None,
                 overlap: bool = True, routed_experts_only: bool = True, device: str | torch.device | None = None):
        """`model` on the host, or already on `device` (default: where its parameters
        are); on a GPU the streamed layers' weights stay on the host, pinned, and the rest
        of the model moves to the device. `resident_layers`, `overlap` and
        `routed_experts_only` exist for baselines (`scripts/bench_offload_weights.py`):
        a fixed count of resident layers, copies not started ahead of use, every expert
        copied."""
        device = torch.device(device) if device is not None else next(model.parameters()).device
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
        # Per streamed layer, the names of its stacked expert tensors (none for a dense layer).
        self.experts = {i: {f"mlp.{n}" for n in EXPERT_PARAMS} if hasattr(getattr(layers[i], "mlp", None), "router")
                        else set() for i in self.streamed}
        self.position = {i: n for n, i in enumerate(self.streamed)}
        self.host: dict[int, dict[str, torch.Tensor]] = {}
        self.slots: list[dict[str, torch.Tensor]] = [{}, {}]
        self._on_gpu = device.type == "cuda"
        self._host_layers: list[HostLayer] = []  # (they own the host memory, and unlock it when freed)
        for i in self.streamed:
            slot_params = self.slots[self.position[i] % 2]
            # A copy of its own on the host, in one allocation (page-locked for a GPU's asynchronous copies).
            host = HostLayer(layers[i].named_parameters(), lock=page_lock if self._on_gpu else None)
            self._host_layers.append(host)
            for name, p in layers[i].named_parameters():
                if name not in slot_params:
                    # Zeroed, so its pages exist before the first copy is timed.
                    slot_params[name] = torch.zeros(p.shape, dtype=p.dtype, device=device)
                p.data = slot_params[name]  # the layer reads its slot from now on (its loaded copy is freed)
            self.host[i] = host.views
            mlp = getattr(layers[i], "mlp", None)
            if hasattr(mlp, "router"):
                mlp.on_experts = lambda used, i=i: self.fetch_experts(i, used)
        model.to(device)  # the rest of the model (the slots are there already)
        if getattr(model, "rope", None) is not None:
            model.rope.to(device)  # (its tables are plain tensors, which Module.to does not move)
        self.resident_bytes = fixed + sum(per_layer[:resident]) + (2 * slot if self.streamed else 0)
        self.weight_bytes = fixed + sum(per_layer)
        self.stats = {"bytes_fetched": 0, "layers_fetched": 0, "experts_fetched": 0, "experts_skipped": 0,
                      "experts_prefetched": 0, "fetch_wait_s": 0.0, "expert_copy_s": 0.0}
        self._shape = self._cost_shape()  # a FetchCost without its bandwidth (measured as copies run)
        self.copies = copies_for(device)
        self._pending: dict[int, object] = {}  # streamed layer -> the handle of its copy under way
        self._deferred: tuple[int, int] | None = None  # (layer, rows): a prefetch waiting on expert copies
        self._with_experts: dict[int, bool] = {}  # streamed layer -> its experts are in its slot this step
        if self.streamed:
            log.info("[stream] %d of %d layers resident, %d streamed through 2 slots of %.1f MB "
                     "(%.0f%% of %.1f MB of weights on the device)", resident, len(layers), len(self.streamed),
                     slot / 1e6, 100 * self.resident_bytes / self.weight_bytes, self.weight_bytes / 1e6)
            # The first fetch is done here: it gives the bandwidth a first measure.
            first = self.copies.now(lambda: self._copy(self.streamed[0], False))
            self.copies.use(first)
            if self._on_gpu:
                torch.cuda.synchronize(device)  # so that the copy stream's events give a first bandwidth
            self._pending[self.streamed[0]] = first

    def _cost_shape(self) -> FetchCost:
        """What a step fetches, by kind: the streamed layers' dense bytes, and one expert's."""
        dense, expert, moe_layers, experts, top_k = 0, 0, 0, 0, 0
        for i in self.streamed:
            names = self.experts[i]
            dense += sum(t.numel() * t.element_size() for n, t in self.host[i].items() if n not in names)
            if names:
                mlp = self.layers[i].mlp
                moe_layers, experts, top_k = moe_layers + 1, mlp.num_experts, mlp.top_k
                expert = sum(self.host[i][n][0].numel() * self.host[i][n][0].element_size() for n in names)
        return FetchCost(dense_bytes=dense, expert_bytes=expert, moe_layers=moe_layers, num_experts=experts,
                         top_k=top_k)

    @property
    def fetch_cost(self) -> FetchCost:
        """The fetch term of the step cost, at the copy bandwidth measured so far."""
        copied, seconds = self.copies.measured()
        return replace(self._shape, bandwidth=copied / seconds if seconds > 0 else 0.0)

    def _copy(self, i: int, with_experts: bool) -> tuple[int, bool]:
        """Issues the copies of a layer's weights (its experts too if asked) into its
        slot; returns the bytes and whether the experts came along."""
        slot, copied = self.slots[self.position[i] % 2], 0
        skip = () if with_experts else self.experts[i]
        with torch.no_grad():
            for name, src in self.host[i].items():
                if name in skip:
                    continue
                copy_weights(slot[name], src)
                copied += src.numel() * src.element_size()
        return copied, with_experts and bool(self.experts[i])

    def _prefetch(self, i: int, rows: int) -> None:
        if i not in self._pending:
            # Experts ahead of use only when the step's tokens are expected to use most of them.
            ahead = self.routed_experts_only and self._shape.prefetch_all_experts(rows)
            self._pending[i] = self.copies.start(lambda: self._copy(i, ahead))

    def before_layer(self, i: int, rows: int) -> None:
        """Waits for layer i's weights (if streamed) and starts copying the next one's.
        `rows`: the step's tokens, which a MoE layer routes."""
        if i not in self.position:
            return
        if i == self.streamed[0]:
            self._forget_stale_copies()
        # The layers issued so far are behind this point: the other slot frees when they finish.
        self.copies.compute_moved_on()
        handle = self._pending.pop(i, None) or self.copies.start(lambda: self._copy(i, False))
        t = time.perf_counter()
        copied, self._with_experts[i] = self.copies.use(handle)
        self.stats["fetch_wait_s"] += time.perf_counter() - t  # (on a GPU the host does not wait)
        self.stats["bytes_fetched"] += copied
        self.stats["layers_fetched"] += 1
        n = self.position[i]
        if n + 1 < len(self.streamed) and self.overlap:
            if self._on_gpu and self.experts[i] and not self._with_experts[i]:
                # This layer's routed experts are copied once its router has chosen them, and
                # compute waits for that copy: on one in-order copy stream it must not queue
                # behind the whole next layer. The next layer's copy starts after it.
                self._deferred = (self.streamed[n + 1], rows)
            else:
                self._prefetch(self.streamed[n + 1], rows)

    def _forget_stale_copies(self) -> None:
        """At a step's first streamed layer no other layer's copy is pending, unless the
        step before failed part way: such a copy was overwritten in its slot since (the
        copies run in order on one thread, and this step's copy of its first layer comes
        after them), so it is waited for and dropped, and fetched again when due."""
        first = self.streamed[0]
        self._deferred = None
        for i in [k for k in self._pending if k != first]:
            self.copies.use(self._pending.pop(i))

    def after_step(self, rows: int) -> None:
        """The next step starts with the first streamed layer: fetch it now (its slot is
        free), guessing the next step as large as this one."""
        if self.streamed and self.overlap:
            self.copies.compute_moved_on()  # the last streamed layer may have read the first's slot
            self._prefetch(self.streamed[0], rows)

    def fetch_experts(self, i: int, used: list[int]) -> None:
        """Copies the experts a MoE layer's router chose for this step, and no others
        (none if all of them came ahead of use with the layer)."""
        host = self.host[i]
        total = host["mlp.gate_up"].shape[0]
        if self._with_experts.get(i):
            self.stats["experts_prefetched"] += total
            return
        slot = self.slots[self.position[i] % 2]
        if not self.routed_experts_only:
            used = list(range(total))

        def copy_experts() -> tuple[int, bool]:
            copied = 0
            with torch.no_grad():
                for name in EXPERT_PARAMS:
                    key = f"mlp.{name}"
                    for e in used:
                        copy_weights(slot[key][e], host[key][e])
                        copied += host[key][e].numel() * host[key][e].element_size()
            return copied, True

        t = time.perf_counter()
        copied, _ = self.copies.use(self.copies.now(copy_experts))  # after the layer's own copy, in order
        self.stats["bytes_fetched"] += copied
        self.stats["expert_copy_s"] += time.perf_counter() - t  # (on a GPU: the time to issue them)
        if self._deferred is not None:  # the next layer's copy, now behind these experts
            nxt, rows = self._deferred
            self._deferred = None
            self._prefetch(nxt, rows)
        self.stats["experts_fetched"] += len(used)
        self.stats["experts_skipped"] += total - len(used)

    def summary(self) -> dict:
        return {"resident_bytes": self.resident_bytes, "weight_bytes": self.weight_bytes,
                "streamed_layers": len(self.streamed), **self.stats, "fetch_cost": self.fetch_cost.to_dict()}

    def close(self) -> None:
        self.copies.close()
