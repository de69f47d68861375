"""Turns a step's chunks into tensors, runs the model, and returns logits.

Decode-like chunks (one token) come first in the flat batch and share one batched
attention call; each longer chunk is a prefill span.
"""

from __future__ import annotations

import torch

from shoal.nodes.worker.attention import AttentionMetadata, PrefillSpan
from shoal.nodes.worker.kv_cache import KVCache
from shoal.nodes.worker.models.decoder import DecoderLM
from shoal.nodes.worker.sequence import Sequence


class ModelRunner:
    def __init__(self, model: DecoderLM, cache: KVCache, decode_kernel=None):
        self.model = model
        self.cache = cache
        self.bs = cache.block_size
        self.decode_kernel = decode_kernel

    def run(self, chunks: list[tuple[Sequence, int]], sample_mask: list[bool]) -> tuple[torch.Tensor, list[int]]:
        """Computes `n` tokens of each sequence from its `num_computed`; returns logits of
        the last token of every chunk whose `sample_mask` is set, with their chunk index."""
        bs = self.bs
        order = sorted(range(len(chunks)), key=lambda i: chunks[i][1] != 1)
        ids: list[int] = []
        pos: list[int] = []
        slot_rows: list[torch.Tensor] = []
        logit_rows: list[int] = []
        logit_chunks: list[int] = []
        decodes = [i for i in order if chunks[i][1] == 1]
        meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long), block_size=bs,
                                 decode_kernel=self.decode_kernel)
        row = 0
        if decodes:
            b = len(decodes)
            ctx = [chunks[i][0].num_computed + 1 for i in decodes]
            L = max(ctx)
            nblk = -(-L // bs)
            table = torch.zeros(b, nblk, dtype=torch.long)
            for r, i in enumerate(decodes):
                seq = chunks[i][0]
                bt = seq.block_table[: -(-ctx[r] // bs)]
                table[r, : len(bt)] = torch.tensor(bt)
                ids.append(seq.token(seq.num_computed))
                pos.append(seq.num_computed)
                if sample_mask[i]:
                    logit_rows.append(r)
                    logit_chunks.append(i)
            ctx_t = torch.tensor(ctx)
            last = ctx_t - 1
            slot_rows.append(table[torch.arange(b), last // bs] * bs + last % bs)
            meta.num_decodes = b
            meta.decode_tables = table
            meta.decode_ctx = ctx_t
            if self.decode_kernel is None:
                slots = (table.unsqueeze(2) * bs + torch.arange(bs)).view(b, -1)[:, :L]
                meta.decode_len = L
                meta.decode_slots = slots.reshape(-1)
                meta.decode_mask = (torch.arange(L).unsqueeze(0) < ctx_t.unsqueeze(1)).view(b, 1, 1, L)
            row = b
        for i in order[len(decodes):]:
            seq, n = chunks[i]
            start = seq.num_computed
            ids.extend(seq.tokens(start, start + n))
            pos.extend(range(start, start + n))
            all_slots = self.cache.slots_of(seq.block_table, 0, start + n)
            slot_rows.append(all_slots[start:])
            if start == 0:
                span = PrefillSpan(row, row + n, fresh=True)
            else:
                q_pos = torch.arange(start, start + n).unsqueeze(1)
                mask = torch.arange(start + n).unsqueeze(0) <= q_pos
                span = PrefillSpan(row, row + n, fresh=False, slots=all_slots, mask=mask)
            meta.prefills.append(span)
            row += n
            if sample_mask[i]:
                logit_rows.append(row - 1)
                logit_chunks.append(i)
        meta.slot_mapping = torch.cat(slot_rows)
        logits = self.model(
            torch.tensor(ids, dtype=torch.long),
            torch.tensor(pos, dtype=torch.long),
            self.cache.layers,
            meta,
            torch.tensor(logit_rows, dtype=torch.long),
        )
        return logits, logit_chunks
