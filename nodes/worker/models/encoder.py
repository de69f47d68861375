"""BERT-style sentence encoders in torch (all-MiniLM-L6-v2, bge-base shapes), loaded
from a sentence-transformers folder: `config.json` + `model.safetensors`, the pooling
mode from `1_Pooling/config.json`, normalization if `modules.json` lists a Normalize
module, the length cap from `sentence_bert_config.json`, and `tokenizer.json`.

Texts are tokenized with `tokenizers`, padding and truncation set here (the file's own
settings are not trusted: MiniLM's pads and truncates to 128), run as one padded
batch with an attention mask, pooled over real tokens only, so a text's embedding
does not depend on what it was batched with beyond rounding.
"""

from __future__ import annotations

import math
from itertools import chain
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from shoal.nodes.worker.device_copy import host_to_device
from shoal.scheduler.superbatch import check_token_budget, default_token_budget, micro_batches
from shoal.encoder_config import EncoderConfig, EncoderError, encoder_fingerprint  # noqa: F401


def padded_ids(batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, longest] token ids (0 past a text's end) and the mask of real tokens, filled
    in one vectorized assignment: a tensor per text costs ~13 µs of host time, 3.4 ms
    for 256 texts, longer than a GPU takes to encode them."""
    lens = np.fromiter(map(len, batch), dtype=np.int64, count=len(batch))
    mask = np.arange(int(lens.max()))[None, :] < lens[:, None]
    ids = np.zeros(mask.shape, dtype=np.int64)
    ids[mask] = np.fromiter(chain.from_iterable(batch), dtype=np.int64, count=int(lens.sum()))
    return torch.from_numpy(ids), torch.from_numpy(mask)


class Encoder:
    def __init__(self, folder: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 token_budget: int | None = None):
        from safetensors.torch import load_file
        from tokenizers import Tokenizer

        self.folder = Path(folder)
        self.config = cfg = EncoderConfig.from_folder(self.folder)
        weights = self.folder / "model.safetensors"
        if not weights.exists():
            raise EncoderError(f"encoder folder {self.folder}: missing model.safetensors")
        self.device = torch.device(device)
        # Padded tokens per micro-batch: the device's default unless given (`--encoder-token-budget`).
        try:
            self.token_budget = check_token_budget(
                default_token_budget(self.device.type == "cuda") if token_budget is None else token_budget)
        except ValueError as e:
            raise EncoderError(str(e)) from None
        # On a GPU the encoder runs on a stream of its own: its batch's read back then
        # waits for its own kernels only, not for a decode step queued on the default
        # stream (with async scheduling one always is), and the two overlap. Its time per
        # batch, which the encode planner learns from, is then the encoder's.
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        w = {k.removeprefix("bert."): v.to(self.device, dtype) for k, v in load_file(str(weights)).items()}
        need = ["embeddings.word_embeddings.weight"] + [f"encoder.layer.{i}.output.dense.weight" for i in range(cfg.num_layers)]
        missing = [k for k in need if k not in w]
        if missing:
            raise EncoderError(f"{weights}: missing tensors {missing[:3]} for a {cfg.num_layers}-layer BERT encoder")
        self.w = w
        if self.stream is not None:  # its first batch reads weights copied on the current stream
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        self.dim = cfg.hidden_size
        self.fingerprint = encoder_fingerprint(self.folder)
        self.tokenizer = Tokenizer.from_file(str(self.folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=min(cfg.max_seq_length, cfg.max_positions))

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def tokenize_counted(self, texts: list[str]) -> tuple[list[list[int]], int]:
        """Token ids, and how many texts were cut to the encoder's length cap."""
        enc = self.tokenizer.encode_batch(list(texts))
        return [e.ids for e in enc], sum(1 for e in enc if e.overflowing)

    def encode_ids(self, batch: list[list[int]]) -> torch.Tensor:
        """[len(batch), dim] float32 embeddings of already tokenized texts, one padded batch,
        on the host (on a GPU: the batch's ids go over in one copy, its vectors come back
        in one, on the encoder's stream)."""
        if self.stream is None:
            return self._encode_ids(batch)
        with torch.cuda.stream(self.stream):
            return self._encode_ids(batch)

    @torch.inference_mode()
    def _encode_ids(self, batch: list[list[int]]) -> torch.Tensor:
        cfg, w = self.config, self.w
        ids, mask = padded_ids(batch)
        n = ids.shape[1]
        ids, mask = host_to_device(ids, self.device), host_to_device(mask, self.device)
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = F.layer_norm(x, (self.dim,), w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], cfg.layer_norm_eps)
        heads, hd = cfg.num_heads, self.dim // cfg.num_heads
        bias = torch.zeros(len(batch), 1, 1, n, dtype=x.dtype, device=self.device).masked_fill(~mask[:, None, None, :], -math.inf)
        for i in range(cfg.num_layers):
            p = f"encoder.layer.{i}."

            def lin(t, name):
                return F.linear(t, w[p + name + ".weight"], w[p + name + ".bias"])

            q, k, v = (lin(x, f"attention.self.{m}").view(len(batch), n, heads, hd).transpose(1, 2)
                       for m in ("query", "key", "value"))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias).transpose(1, 2).reshape(len(batch), n, self.dim)
            x = F.layer_norm(x + lin(a, "attention.output.dense"), (self.dim,), w[p + "attention.output.LayerNorm.weight"],
                             w[p + "attention.output.LayerNorm.bias"], cfg.layer_norm_eps)
            h = lin(F.gelu(lin(x, "intermediate.dense")), "output.dense")
            x = F.layer_norm(x + h, (self.dim,), w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"],
                             cfg.layer_norm_eps)
        if cfg.pooling == "cls":
            out = x[:, 0]
        else:
            m = mask[..., None].to(x.dtype)
            out = (x * m).sum(1) / m.sum(1).clamp(min=1)
        out = out.float()
        return (F.normalize(out, dim=-1) if cfg.normalize else out).cpu()

    def encode(self, texts: list[str], token_budget: int | None = None) -> torch.Tensor:
        """Embeddings in input order. Texts are sorted by length and cut into
        micro-batches of at most `token_budget` padded tokens (the encoder's own unless
        given), then put back in order."""
        return self.encode_tokenized(self.tokenize(texts), token_budget)

    def encode_tokenized(self, ids: list[list[int]], token_budget: int | None = None) -> torch.Tensor:
        """`encode` of texts already tokenized."""
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out = torch.empty(len(ids), self.dim)
        for chunk in micro_batches([len(ids[i]) for i in order], token_budget or self.token_budget):
            rows = order[chunk.start:chunk.stop]
            out[rows] = self.encode_ids([ids[i] for i in rows])
        return out

