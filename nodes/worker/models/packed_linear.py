"""Linear layers whose weights are reordered once, at load, into oneDNN's blocked layout.

`F.linear` on a CPU hands the row-major weight to a GEMM that re-packs panels of it on
every call; for a decoder step (M = a few hundred tokens, K = hidden) that re-packing is
a large share of the multiply. Reordering each weight once, as vLLM's CPU build does,
measured 1.1-1.9x faster per projection on W1's shapes (fp32, AVX2; the largest gain on
the 4096-wide MLP and the 32000-wide vocabulary projection). The numbers are the same
fp32 (or bf16) products, so logits agree with the unpacked model to rounding.

Only CPU fp32/bf16 models are packed, and only where oneDNN passes a probe here; any
other model keeps `nn.Linear` (and a GPU build plugs its own GEMMs in at this seam).
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

log = logging.getLogger(__name__)

PACKABLE = (torch.float32, torch.bfloat16)

# oneDNN keeps every kernel it builds, one per (rows, in, out) shape, in two caches of
# 1,024 entries by default (ideep's and oneDNN's own), a few hundred KB each. A step's
# row count changes almost every step, so a worker grew for as long as new counts came:
# +250 MiB over a job of 1M one-token items. 128 entries bound both at ~70 MB and cost
# W1 nothing measurable (docs/performance.md). Padded rows (`row_buckets.py`) come in a
# few hundred shapes that the default caches hold whole, so those keep the default.
KERNEL_CACHE_ENTRIES = 128


def bound_kernel_caches(rows_padded: bool) -> None:
    """Caps oneDNN's kernel caches for unpadded rows. Both read their capacity from the
    environment when the first kernel is built, so this runs before any; a capacity
    the user set wins."""
    if rows_padded:
        return
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(KERNEL_CACHE_ENTRIES))


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear, batch_hint: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # The layout oneDNN picks depends a little on the expected rows per call.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_hint)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def onednn_usable(dtype: torch.dtype) -> bool:
    """Whether packed oneDNN linears run here and match F.linear on a small probe."""
    if dtype not in PACKABLE or not torch.backends.mkldnn.is_available():
        return False
    try:
        g = torch.Generator().manual_seed(0)
        lin = nn.Linear(64, 48, bias=True).to(dtype)
        x = torch.randn(5, 64, generator=g).to(dtype)
        with torch.no_grad():
            want = lin(x).float()
            got = PackedLinear(lin, 8)(x).float()
        return bool((got - want).abs().max() <= 1e-2 * max(1.0, want.abs().max().item()))
    except Exception as e:  # an ATen build without the mkldnn ops: the plain path still works
        log.info("[matmul] oneDNN packed linears unavailable: %s", e)
        return False


def pack_linears(model: nn.Module, batch_hint: int = 128, skip: tuple[nn.Module, ...] = (),
                 rows_padded: bool = False) -> int:
    """Replaces every CPU `nn.Linear` of `model` by a `PackedLinear`; returns how many.
    A tied output projection gets its own packed copy (the embedding keeps the weight).
    Modules inside `skip` keep theirs (streamed layers: their weights are copied in).
    `rows_padded`: whether the steps will pad their rows (the kernel caches' size)."""
    dtype = next(model.parameters()).dtype
    bound_kernel_caches(rows_padded)
    if next(model.parameters()).device.type != "cpu" or not onednn_usable(dtype):
        return 0
    skipped = {id(m) for s in skip for m in s.modules()}
    targets = [(parent, name, child) for parent in model.modules() if id(parent) not in skipped
               for name, child in parent.named_children() if type(child) is nn.Linear]
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child, batch_hint))
    return len(targets)
