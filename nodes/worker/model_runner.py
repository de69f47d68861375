"""Turns a step's chunks into tensors, runs the model, and returns logits.

Decode-like chunks (one token) come first in the flat batch, then each longer chunk.
With the native kernel every chunk is a *paged span*: its keys and values are written
to the cache first, and one kernel call per layer reads all spans through their block
tables (a fresh prompt too: the kernel's tiles measured 2.4x faster than causal SDPA
on 512-token prompts, fp32 on AVX2). Without the kernel (the reference path), decodes and
cached-prefix chunks gather their slots and use SDPA, and a fresh prompt runs causal
SDPA on the step's own keys.

On request (`sdpa_prefill_work`, off by default) prefill chunks of at least that many
rows x context leave the kernel for gather + SDPA: a chunk after a cached prefix then
runs as two flash calls (`attention.attend_after_prefix`) rather than one over a masked
rectangle. The kernel's tiles used to trail torch's blocked CPU flash kernel on large
fp32 chunks on AVX2, and this was the default there; since the tiles compute like a
GEMM (paged_attention.cpp) they lead it on every chunk shape measured, 1.2-3.3x.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from shoal.nodes.worker.attention import AttentionMetadata, PrefillSpan, chunk_mask
from shoal.nodes.worker.kv_cache import SHORT_SPAN, KVCache, slot_ints as cache_slot_ints
from shoal.nodes.worker.models.decoder import DecoderLM
from shoal.nodes.worker.sequence import Sequence


class ModelRunner:
    def __init__(self, model: DecoderLM, cache: KVCache, ops=None, sdpa_prefill_work: int = 0, graphs=None):
        self.model = model
        self.graphs = graphs  # `DecodeGraphs`: decode-only steps replay a captured graph
        self.cache = cache
        self.bs = cache.block_size
        self.device = cache.device
        self.ops = ops  # the ops backend (`ops_backend.py`), or None for the reference path
        # Native path: prefill chunks of at least this many rows x context go through SDPA
        # (0: none).
        self.sdpa_prefill_work = sdpa_prefill_work if ops is not None and ops.name == "native" else 0

    def run(self, chunks: list[tuple[Sequence, int]], sample_mask: list[bool], carry=None
            ) -> tuple[torch.Tensor, list[int]]:
        """Computes `n` tokens of each sequence from its `num_computed`; returns logits of
        the last token of every chunk whose `sample_mask` is set, with their chunk index.
        `carry`: the last step's `PendingTokens`, still on the device: a sequence it
        sampled takes its input token from there."""
        built = self._decode_inputs(chunks, sample_mask) if all(n == 1 for _, n in chunks) else None
        host, meta, logit_chunks = built if built is not None else self._inputs(chunks, sample_mask)
        carried = _carried_rows(chunks, carry) if carry is not None else None
        if carried is not None:
            host["carry_rows"], host["carry_from"] = carried
        dev = stage(host, self.device)
        if carried is not None:
            dev["ids"].index_copy_(0, dev["carry_rows"], carry.chosen.index_select(0, dev["carry_from"]))
        if (self.graphs is not None and meta.num_decodes == len(chunks) and len(logit_chunks) == len(chunks)
                and self.graphs.size_for(len(chunks)) is not None):
            return self.graphs.run(dev, len(chunks)), logit_chunks
        for name in ("slot_mapping", "span_rows", "span_lens", "span_ctx", "span_tables", "decode_slots", "decode_mask"):
            if name in dev:
                setattr(meta, name, dev[name])
        for span in meta.prefills:  # the reference path's chunks (and SDPA's large ones): per chunk
            span.slots = span.slots.to(self.device) if span.slots is not None else None
            span.mask = span.mask.to(self.device) if span.mask is not None else None
        logits = self.model(dev["ids"], dev["pos"], self.cache.layers, meta, dev["logit_rows"])
        return logits, logit_chunks

    def _decode_inputs(self, chunks: list[tuple[Sequence, int]], sample_mask: list[bool]):
        """`_inputs` for a step of one token per sequence (most steps of a large batch),
        built column by column with numpy instead of row by row: at a thousand sequences
        the row loop was the largest part of the host's time per step, which on a GPU is
        time the device waits. None where a block table holds more blocks than its
        context needs (the general path slices it)."""
        bs, b = self.bs, len(chunks)
        seqs = [seq for seq, _ in chunks]
        pos_list = [seq.num_computed for seq in seqs]
        tables = [seq.block_table for seq in seqs]
        pos = np.array(pos_list, dtype=np.int64)
        widths = np.fromiter(map(len, tables), dtype=np.int64, count=b)
        if not np.array_equal(widths, pos // bs + 1):
            return None
        table = np.zeros((b, int(widths.max())), dtype=np.int64)
        table[np.arange(table.shape[1]) < widths[:, None]] = np.fromiter(
            itertools.chain.from_iterable(tables), dtype=np.int64, count=int(widths.sum()))
        logit_chunks = [i for i, m in enumerate(sample_mask) if m]
        meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long), block_size=bs, ops=self.ops)
        meta.num_decodes = b
        ctx = torch.from_numpy(pos + 1)
        table_t = torch.from_numpy(table)
        host = {"ids": torch.tensor([seq.token(k) for seq, k in zip(seqs, pos_list)], dtype=torch.long),
                "pos": torch.from_numpy(pos), "logit_rows": torch.tensor(logit_chunks, dtype=torch.long),
                "slot_mapping": torch.from_numpy(table[np.arange(b), pos // bs] * bs + pos % bs)}
        self._span_inputs(host, meta, torch.arange(b), torch.ones(b, dtype=torch.long), ctx, table_t)
        return host, meta, logit_chunks

    def _span_inputs(self, host: dict, meta: AttentionMetadata, rows: torch.Tensor, lens: torch.Tensor,
                     ctx: torch.Tensor, table: torch.Tensor) -> None:
        """The paged spans' tensors (kernel path), or the decodes' gathered slots and mask
        (reference path), into `host` and `meta`."""
        bs = self.bs
        if self.ops is not None:
            host.update(span_rows=rows, span_lens=lens, span_ctx=ctx, span_tables=table)
            meta.span_max_len, meta.span_max_ctx = int(lens.max()), int(ctx.max())
            return
        # Only decodes are spans here: pad each to the longest context, mask the rest.
        b, L = len(rows), int(ctx.max())
        slots = (table.unsqueeze(2) * bs + torch.arange(bs)).view(b, -1)[:, :L]
        valid = torch.arange(L).unsqueeze(0) < ctx.unsqueeze(1)
        # Padding reads the sequence's own first token: a slot never written holds
        # whatever the memory held, and a NaN there survives the mask (0 * NaN).
        slots = torch.where(valid, slots, slots[:, :1])
        meta.decode_len = L
        host.update(decode_slots=slots.reshape(-1), decode_mask=valid.view(b, 1, 1, L))

    def _inputs(self, chunks: list[tuple[Sequence, int]], sample_mask: list[bool]):
        """The step's host tensors (`stage` moves them), its attention metadata and the
        chunks that sample, row by row: decode-like chunks first, then each longer one."""
        bs = self.bs
        order = sorted(range(len(chunks)), key=lambda i: chunks[i][1] != 1)
        ids: list[int] = []
        pos: list[int] = []
        # The step's cache slots in row order: ints where a tensor per sequence would cost
        # more than its rows (decodes, short prefills: one-token items are all such), a
        # tensor of its own for a long span.
        slot_ints: list[int] = []
        slot_parts: list[torch.Tensor] = []
        logit_rows: list[int] = []
        logit_chunks: list[int] = []
        # Paged spans (kernel path) or the decodes' tables (gather path): per span its first
        # row in the step, its row count, its context and its block table.
        rows: list[int] = []
        lens: list[int] = []
        ctxs: list[int] = []
        tables: list[list[int]] = []
        meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long), block_size=bs, ops=self.ops)
        row = 0
        for i in order:
            seq, n = chunks[i]
            start = seq.num_computed
            end = start + n
            by_sdpa = n > 1 and 0 < self.sdpa_prefill_work <= n * end
            if n == 1:
                ids.append(seq.token(start))
                pos.append(start)
                slot_ints.append(seq.block_table[start // bs] * bs + start % bs)
                meta.num_decodes += 1
            else:
                ids.extend(seq.tokens(start, end))
                pos.extend(range(start, end))
                if n <= SHORT_SPAN and not by_sdpa:  # as ints, into one tensor for the step
                    slot_ints.extend(cache_slot_ints(seq.block_table, start, end, bs))
                else:  # the ints so far, then this span's own tensor (a prefill span may keep it)
                    slot_parts.append(torch.tensor(slot_ints, dtype=torch.long))
                    slot_ints = []
                    slot_parts.append(self.cache.slots_of(seq.block_table, start, end))
            span_slots = slot_parts[-1] if by_sdpa else None
            if (n == 1 or self.ops is not None) and not by_sdpa:
                rows.append(row)
                lens.append(n)
                ctxs.append(end)
                tables.append(seq.block_table[: -(-end // bs)])
            elif start == 0:  # on the native path its keys are read back from the cache
                meta.prefills.append(PrefillSpan(row, row + n, fresh=True, slots=span_slots))
            else:  # a chunk after its cached prefix: gather both
                slots = self.cache.slots_of(seq.block_table, 0, end)
                if by_sdpa:  # two flash calls: 1.0x-1.5x the masked rectangle, never slower
                    meta.prefills.append(PrefillSpan(row, row + n, fresh=False, slots=slots, prefix=start))
                else:  # the reference path: SDPA with the chunk's mask
                    meta.prefills.append(PrefillSpan(row, row + n, fresh=False, slots=slots,
                                                     mask=chunk_mask(start, end)))
            row += n
            if sample_mask[i]:
                logit_rows.append(row - 1)
                logit_chunks.append(i)
        host = {"ids": torch.tensor(ids, dtype=torch.long), "pos": torch.tensor(pos, dtype=torch.long),
                "logit_rows": torch.tensor(logit_rows, dtype=torch.long),
                "slot_mapping": torch.cat([*slot_parts, torch.tensor(slot_ints, dtype=torch.long)]) if slot_parts
                else torch.tensor(slot_ints, dtype=torch.long)}
        if rows:
            width = max(map(len, tables))
            table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)
            self._span_inputs(host, meta, torch.tensor(rows, dtype=torch.long), torch.tensor(lens, dtype=torch.long),
                              torch.tensor(ctxs, dtype=torch.long), table)
        return host, meta, logit_chunks


def _carried_rows(chunks: list[tuple[Sequence, int]], carry) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The step's rows whose input token is in flight (`carry.chosen`), and where in it:
    every one-token chunk of a sequence the last step sampled. Such chunks are rows
    0, 1, ... in chunk order on both input paths (one-token chunks come first)."""
    rows, src, row = [], [], 0
    where = carry.row
    for seq, n in chunks:
        if n == 1:
            j = where.get(seq)
            if j is not None:
                rows.append(row)
                src.append(j)
            row += 1
    return (torch.tensor(rows, dtype=torch.long), torch.tensor(src, dtype=torch.long)) if rows else None


def stage(host: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A step's host tensors on `device`: on a GPU one pinned buffer and one copy that does
    not wait for the host (the step's kernels queue behind it on the same stream); on the
    CPU the tensors as they are."""
    if device.type == "cpu":
        return host
    names = list(host)
    flat = torch.cat([host[k].reshape(-1).to(torch.long) for k in names])
    if device.type == "cuda":
        flat = flat.pin_memory()
    moved = flat.to(device, non_blocking=True).split([host[k].numel() for k in names])
    return {k: m.view(host[k].shape).to(host[k].dtype) for k, m in zip(names, moved)}
