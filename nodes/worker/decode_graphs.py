"""Decode steps replayed from CUDA graphs, one captured per padded batch size.

A decode step of a 1.7B model is ~28 x 15 kernel launches from Python, each a few
microseconds of host time: at a few milliseconds of GPU work per step the host, not the
GPU, sets the pace. A CUDA graph replays the whole forward in one launch. It replays
fixed shapes on fixed buffers, so a step of `n` decodes runs in the graph of the
smallest captured size `B >= n`: the step's inputs are copied into the graph's buffers
(one staged host-to-device copy, then device copies) and rows `n..B` are padding, which
write their keys and values to a scratch block past the cache's last and attend to that
block alone. The sampler reads the first `n` rows of the graph's logits.

Only the Triton backend runs in a graph: it reads nothing back from the device (the
torch backend sizes its gathers from host integers, the native one is a CPU's). MoE
layers (a host read per layer) and streamed weights (copies timed on the host) run eager.
Where a capture fails the engine runs eager and says why; `enforce_eager` turns graphs
off. `replay="eager"` runs the same buffers and padding without a graph (the tests, on a
CPU: everything here but the capture itself).
"""

from __future__ import annotations

import logging

import torch

from shoal.nodes.worker.attention import AttentionMetadata

log = logging.getLogger(__name__)


def graph_sizes(max_seqs: int) -> list[int]:
    """The padded batch sizes captured: 1, 2, 4, 8, then every multiple of 16 up to
    `max_seqs` (at most 15 padding rows past 8 sequences)."""
    sizes = [s for s in (1, 2, 4, 8) if s < max_seqs] + list(range(16, max_seqs + 16, 16))
    return sorted({min(s, max_seqs) for s in sizes})


def graph_output_bytes(model, max_seqs: int) -> int:
    """What the captured graphs keep on the device between steps: one logits buffer of
    the largest size ([B, vocab] in the model's dtype) that every size writes. The KV
    sizing leaves room for it (78 MB for the qwen3-1.7b preset in bf16 at 256 sequences;
    a buffer per size was 0.67 GB, and 10 GB at 1,024)."""
    return graph_sizes(max_seqs)[-1] * model.cfg.vocab_size * model.lm_head.weight.element_size()


def graphs_unsupported(model, ops, device: torch.device) -> str | None:
    """Why decode steps cannot run from graphs here, or None."""
    if device.type != "cuda":
        return "not a GPU"
    if ops is None or ops.name != "triton":
        return f"the {'sdpa' if ops is None else ops.name} backend reads the device back"
    if model.cfg.num_experts:
        return "mixture-of-experts layers read the router's choices back"
    if model.streamer is not None:
        return "streamed weights are copied and timed from the host"
    return None


class DecodeGraphs:
    def __init__(self, model, cache, ops, max_seqs: int, max_blocks: int, scratch_block: int, replay: str = "cuda"):
        self.model, self.cache, self.ops = model, cache, ops
        self.bs = cache.block_size
        self.sizes = graph_sizes(max_seqs)
        self.max_blocks = max_blocks
        self.scratch = scratch_block  # a block of the cache no sequence owns: padding rows write and read it
        self.replay_mode = replay
        dev, B = cache.device, self.sizes[-1]
        long = dict(dtype=torch.long, device=dev)
        self.ids = torch.zeros(B, **long)
        self.pos = torch.zeros(B, **long)
        self.slots = torch.full((B,), scratch_block * self.bs, **long)
        self.rows = torch.arange(B, **long)
        self.lens = torch.ones(B, **long)
        self.ctx = torch.ones(B, **long)
        self.tables = torch.full((B, max_blocks), scratch_block, **long)
        # Every size's logits land here (one step at a time reads them): the graphs keep
        # no output of their own alive, and their intermediates share one memory pool.
        self.logits = torch.empty(B, model.cfg.vocab_size, dtype=model.lm_head.weight.dtype, device=dev)
        self.graphs: dict[int, object] = {}

    def _forward(self, B: int) -> torch.Tensor:
        meta = AttentionMetadata(slot_mapping=self.slots[:B], block_size=self.bs, ops=self.ops)
        meta.span_rows, meta.span_lens, meta.span_ctx = self.rows[:B], self.lens[:B], self.ctx[:B]
        meta.span_tables, meta.span_max_len, meta.span_max_ctx = self.tables[:B], 1, self.max_blocks * self.bs
        return self.model(self.ids[:B], self.pos[:B], self.cache.layers, meta, self.rows[:B],
                          logits_out=self.logits[:B])

    def capture(self) -> None:
        """One graph per size, largest first (the smaller ones reuse its memory pool).
        Each size runs once eagerly first: Triton compiles its kernel outside the capture."""
        if self.replay_mode == "eager":
            return
        pool = torch.cuda.graph_pool_handle()
        dev = self.cache.device
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            for B in reversed(self.sizes):
                self._forward(B)  # warm-up: compiles, and allocates what the capture will reuse
        torch.cuda.current_stream(dev).wait_stream(stream)
        for B in reversed(self.sizes):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._forward(B)
            self.graphs[B] = graph
        torch.cuda.synchronize(dev)
        log.info("[graphs] decode steps of up to %d sequences replay CUDA graphs (%d sizes)", self.sizes[-1],
                 len(self.sizes))

    def size_for(self, n: int) -> int | None:
        return next((B for B in self.sizes if B >= n), None)

    def run(self, dev: dict[str, torch.Tensor], n: int) -> torch.Tensor:
        """Logits of a step of `n` decodes whose inputs are on the device (`dev`: ids,
        pos, slot_mapping, span_ctx, span_tables, as the runner stages them)."""
        B = self.size_for(n)
        width = dev["span_tables"].shape[1]
        self.ids[:n].copy_(dev["ids"])
        self.pos[:n].copy_(dev["pos"])
        self.slots[:n].copy_(dev["slot_mapping"])
        self.ctx[:n].copy_(dev["span_ctx"])
        self.tables[:n, :width].copy_(dev["span_tables"])
        # Padding rows: the scratch block, one token of context. A slot or block of an
        # earlier, larger step must not be left there.
        self.slots[n:B].fill_(self.scratch * self.bs)
        self.ctx[n:B].fill_(1)
        self.tables[n:B, 0].fill_(self.scratch)
        if self.replay_mode == "eager":
            return self._forward(B)[:n]
        self.graphs[B].replay()
        return self.logits[:n]
