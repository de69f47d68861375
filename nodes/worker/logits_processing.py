"""What a step does to its logits between the model and the sampler, on their device.

In order: the grammar's mask (a constrained row keeps only the tokens its grammar allows),
then, after the log-probabilities are read (`log_probs`), the logit bias, `min_tokens`
and the penalties. Log-probabilities therefore describe the model's distribution under
the grammar, before bias, penalties, temperature and top-k/top-p: vLLM's default
(`raw_logprobs`), which is also what an evaluation of the model wants.

Every function takes the rows it acts on, so a batch whose sequences ask for nothing
pays nothing, and none reads a value back to the host.
"""

from __future__ import annotations

from itertools import chain

import numpy as np
import torch

from shoal.nodes.worker.device_copy import host_to_device, to_device

_NEG_INF = float("-inf")


def unpack_bitmask(mask: np.ndarray, vocab: int, device) -> torch.Tensor:
    """[R, words] int32 bitmasks (llguidance's layout: bit t%32 of word t//32) as
    [R, vocab] bools on the device. The packed form is what crosses to the device."""
    if torch.device(device).type == "cpu":  # numpy unpacks bytes to bits in one C loop
        bits = np.unpackbits(mask.view(np.uint8), axis=1, count=vocab, bitorder="little")
        return torch.from_numpy(bits).view(torch.bool)
    return unpack_words(host_to_device(torch.from_numpy(mask), device), vocab)


def unpack_words(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """The device's unpacking: [R, words] int32 on the device to [R, vocab] bools."""
    shifts = torch.arange(32, device=words.device, dtype=torch.int32)
    bits = (words.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab].bool()


def apply_bitmask(logits: torch.Tensor, rows: list[int], mask: np.ndarray) -> None:
    """Sets the disallowed tokens of `rows` to -inf, in place; mask[k] is rows[k]'s."""
    if not rows:
        return
    allowed = unpack_bitmask(mask, logits.shape[1], logits.device)
    idx = to_device(rows, logits.device)
    logits[idx] = logits[idx].masked_fill(~allowed, _NEG_INF)


def log_probs(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """fp32 log-softmax of `rows`, [len(rows), V]."""
    return torch.log_softmax(logits[to_device(rows, logits.device)].float(), dim=-1)


def _padded(token_lists: list[list[int]], pad: int, device) -> torch.Tensor:
    width = max(1, max(map(len, token_lists)))
    out = torch.full((len(token_lists), width), pad, dtype=torch.long)
    for i, toks in enumerate(token_lists):
        if toks:
            out[i, : len(toks)] = torch.tensor(toks, dtype=torch.long)
    return host_to_device(out, device)


def _counts(rows: list[tuple[list[int], ...]], vocab: int, device) -> torch.Tensor:
    """[R, V] counts of each row's tokens (a row: one or more lists of ids, counted
    together). The ids go over flat, with their row beside each: padded to the longest
    row they would take R x longest, and one long context among a thousand short ones
    would make that hundreds of MB. (fp32 sums of ones are exact in any order.)"""
    lens = np.fromiter((sum(map(len, parts)) for parts in rows), dtype=np.int64, count=len(rows))
    total = int(lens.sum())
    counts = torch.zeros(len(rows), vocab, device=device)
    if total:
        flat = np.fromiter(chain.from_iterable(chain.from_iterable(rows)), dtype=np.int64, count=total)
        row_of = np.repeat(np.arange(len(rows), dtype=np.int64), lens)
        index = (host_to_device(torch.from_numpy(row_of), device), host_to_device(torch.from_numpy(flat), device))
        counts.index_put_(index, torch.ones(total, device=device), accumulate=True)
    return counts


def apply_penalties(logits: torch.Tensor, rows: list[int], seqs: list) -> None:
    """OpenAI's presence and frequency penalties over each sequence's generated tokens,
    and the repetition penalty over its prompt and generated tokens (a positive logit
    divided by it, a negative one multiplied, as transformers and vLLM apply it)."""
    if not rows:
        return
    dev, vocab = logits.device, logits.shape[1]
    idx = to_device(rows, dev)
    x = logits[idx].float()
    params = [s.params for s in seqs]
    if any(p.presence_penalty or p.frequency_penalty for p in params):
        counts = _counts([(s.output_token_ids,) for s in seqs], vocab, dev)
        freq = to_device([p.frequency_penalty for p in params], dev).unsqueeze(1)
        pres = to_device([p.presence_penalty for p in params], dev).unsqueeze(1)
        x = x - freq * counts - pres * (counts > 0)
    if any(p.repetition_penalty != 1.0 for p in params):
        seen = _counts([(s.prompt_token_ids, s.output_token_ids) for s in seqs], vocab, dev) > 0
        r = to_device([p.repetition_penalty for p in params], dev).unsqueeze(1)
        x = torch.where(seen, torch.where(x > 0, x / r, x * r), x)
    logits[idx] = x.to(logits.dtype)


def apply_logit_bias(logits: torch.Tensor, rows: list[int], biases: list[tuple]) -> None:
    """Adds each row's (token id, bias) pairs; ids past the vocabulary were refused when
    the request came in."""
    if not rows:
        return
    r, t, b = [], [], []
    for row, pairs in zip(rows, biases):
        for tok, bias in pairs:
            r.append(row), t.append(tok), b.append(bias)
    dev = logits.device
    logits.index_put_((to_device(r, dev), to_device(t, dev)), to_device(b, dev, logits.dtype), accumulate=True)


def mask_ends(logits: torch.Tensor, rows: list[int], end_ids: list[list[int]]) -> None:
    """`min_tokens`: the rows' end tokens set to -inf, except in a row where nothing else
    is allowed (a grammar that can only end): there the grammar wins."""
    if not rows:
        return
    dev = logits.device
    idx = to_device(rows, dev)
    x = logits[idx]
    ends = _padded(end_ids, logits.shape[1], dev)
    keep = torch.ones(len(rows), logits.shape[1] + 1, dtype=torch.bool, device=dev)
    keep.scatter_(1, ends, False)
    masked = x.masked_fill(~keep[:, :-1], _NEG_INF)
    ok = torch.isfinite(masked.amax(dim=-1, keepdim=True))
    logits[idx] = torch.where(ok, masked, x)
