"""A step's sampled tokens on their way back to the host, while the next step runs.

On a GPU the host's work for a step (planning, the runner's inputs, sampling's
bookkeeping: about 1.3 ms at 256 sequences, measured by `scripts/bench_step_host.py`)
runs while the device waits, if every step reads its tokens back before the next is
planned. With async scheduling (vLLM's term) the engine plans and launches step N+1
first, and reads step N's tokens after: N+1's rows that continue a sequence sampled in N
take their input token from N's chosen ids on the device (`ModelRunner.run`'s `carry`),
and the host's work hides behind the device's.

A sequence counts its tokens in flight (`Sequence.pending`), so the planner sees its
length as it will be. One that N's token ends (an end token, a stop string) has already
run its row of N+1: that row is wasted and its token dropped, as vLLM does (one that
ends by its length is known to, and is left out of N+1). Rows whose sampling needs the
last token on the host (a grammar's mask, penalties: `Sequence.needs_last_token`) sample
after N's tokens are read, with N+1's model already queued; a step that samples a row
reading more than its token back (logprobs, margins: not `Sequence.sample_ahead`) reads
N's tokens before it runs.
"""

from __future__ import annotations

import torch


class PendingTokens:
    def __init__(self, seqs: list, chosen: torch.Tensor):
        """`seqs`: the step's sampling sequences, in the order of `chosen` ([R] token ids
        on the step's device, still being computed there)."""
        self.seqs = seqs
        self.chosen = chosen.to(torch.long)
        if self.chosen.device.type == "cuda":
            # Pinned, so the copy does not wait for the host; the event says when it landed.
            self._host = torch.empty(self.chosen.shape, dtype=torch.long, pin_memory=True)
            self._host.copy_(self.chosen, non_blocking=True)
            self._landed = torch.cuda.Event()
            self._landed.record()
        else:  # computed already
            self._host, self._landed = self.chosen, None
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
