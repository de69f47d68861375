"""A step's sampled tokens on their way back to the host, while the next step runs.

On a GPU the host's work for a step (planning, the runner's inputs, sampling's
bookkeeping: about 1.3 ms at 256 sequences, measured by `scripts/bench_step_host.py`)
runs while the device waits, if every step reads its tokens back before the next is
planned. With async scheduling (vLLM's term) the engine plans and launches step N+1
first, and reads step N's tokens after: N+1's rows that continue a sequence sampled in N
take their input token from N's chosen ids on the device (`ModelRunner.run`'s `carry`),
and the host's work hides behind the device's.

Rows that ask for logprobs or margins go ahead too: their figures (the chosen token's
logprob and the top alternatives; the top-2 gap and each draw's interval) are computed on
the device with the draw and come back with the tokens, in the same copy's wait.

A sequence counts its tokens in flight (`Sequence.pending`), so the planner sees its
length as it will be. One that N's token ends (an end token, a stop string) has already
run its row of N+1: that row is wasted and its token dropped, as vLLM does (one that
ends by its length is known to, and is left out of N+1). Rows whose sampling needs the
last token on the host (a grammar's mask, penalties: `Sequence.needs_last_token`) sample
after N's tokens are read, with N+1's model already queued.
"""

from __future__ import annotations

import torch


class PendingTokens:
    def __init__(self, seqs: list, chosen: torch.Tensor, figures: dict[str, torch.Tensor] | None = None,
                 rows: dict | None = None):
        """`seqs`: the step's sampling sequences, in the order of `chosen` ([R] token ids
        on the step's device, still being computed there). `figures`: more of the step's
        device tensors that come back with the tokens (logprobs, margins, draws), by name;
        `rows`: what the host knows of them (which rows they are, the uniforms), by name,
        for whoever reads them."""
        self.seqs = seqs
        self.chosen = chosen.to(torch.long)
        figures = figures or {}
        if self.chosen.device.type == "cuda":
            # Pinned, so the copies do not wait for the host; the event says when they landed.
            self._host = _to_host(self.chosen)
            self._figures = {name: _to_host(t) for name, t in figures.items()}
            self._landed = torch.cuda.Event()
            self._landed.record()
        else:  # computed already
            self._host, self._figures, self._landed = self.chosen, dict(figures), None
        self.rows = rows or {}
        self.row = {seq: i for i, seq in enumerate(seqs)}  # (a Sequence hashes by identity)
        self.ending: set = set()  # sequences these tokens end whatever they are (the engine says)
        for seq in seqs:
            seq.pending += 1

    def read(self) -> list[int]:
        """The tokens, in `seqs` order: waits for the copy (for the step, on a GPU)."""
        if self._landed is not None:
            self._landed.synchronize()
        for seq in self.seqs:
            seq.pending -= 1
        return self._host.tolist()

    def figures(self) -> dict[str, list]:
        """After `read`: the figures that came back with the tokens, as lists."""
        return {name: t.tolist() for name, t in self._figures.items()}


def logprob_entry(n: int, picked: float, values: list[float], ids: list[int]) -> list:
    """A token's logprobs as a sequence records them: its own, then its top `n`
    alternatives as [id, logprob] pairs."""
    return [picked, [[t, v] for t, v in zip(ids[:n], values[:n])]]


def logprob_tensors(log_probs: torch.Tensor, chosen: torch.Tensor, k: int):
    """On the device: each row's chosen token's logprob [W] and its top `k` values and ids
    [W, k]. A token the grammar forbids has -inf: written as -9999, as vLLM's server
    writes it (JSON has no infinity, and OpenAI's types want a number)."""
    log_probs = log_probs.clamp_(min=-9999.0)  # (in place: the [W, V] tensor is this call's to spend)
    picked = log_probs.gather(1, chosen.to(torch.long).unsqueeze(1)).squeeze(1)
    top = torch.topk(log_probs, k, dim=-1)
    return picked, top.values, top.indices


def _to_host(t: torch.Tensor) -> torch.Tensor:
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
