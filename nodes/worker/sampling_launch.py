"""A step's sampling, launched on the logits' device: everything between a step's
(masked) logits and its tokens in flight, reading nothing back to the host.

In order: the log-probabilities of the rows that ask for them (before bias and
penalties: `logits_processing` says why), the logit bias, `min_tokens` and the
penalties, each row's uniform, the draw, and the figures that come back with the
tokens (logprobs, margins, draws). The engine runs it for every step; the KV sizing on a
GPU (`gpu_memory.profile_step`) runs it for a step whose every row asks for all of it,
so what a step's sampling allocates is what the sizing measured.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from shoal.nodes.worker import logits_processing as lp
from shoal.nodes.worker.device_copy import to_device
from shoal.nodes.worker.pending_tokens import PendingTokens, logprob_tensors
from shoal.nodes.worker.sampler import pick, uniform
from shoal.sampling import SamplingParams


def process_logits(seqs: list, logits: torch.Tensor, end_ids: Callable[[SamplingParams], list[int]]) -> None:
    """Logit bias, min_tokens and penalties, in place, on the rows that ask for them.
    `end_ids`: a request's end tokens (its stop ids, and the model's unless ignored)."""
    biased = [i for i, s in enumerate(seqs) if s.params.logit_bias]
    lp.apply_logit_bias(logits, biased, [seqs[i].params.logit_bias for i in biased])
    short = [i for i, s in enumerate(seqs) if len(s.output_token_ids) + s.pending < s.params.min_tokens]
    lp.mask_ends(logits, short, [end_ids(seqs[i].params) for i in short])
    penalized = [i for i, s in enumerate(seqs) if s.params.penalized]
    lp.apply_penalties(logits, penalized, [seqs[i] for i in penalized])


def launch_sampling(seqs: list, logits: torch.Tensor, row_top2, end_ids: Callable[[SamplingParams], list[int]]
                    ) -> PendingTokens:
    """The tokens of `seqs` (logits' rows, in order; grammar masks applied already) in
    flight, with the figures their rows ask for. Each draw's position counts the tokens
    already in flight. `row_top2`: the native backend's fused top-2 op, or None."""
    want_lp = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
    log_probs = lp.log_probs(logits, want_lp) if want_lp else None
    process_logits(seqs, logits, end_ids)
    us = [0.0 if s.params.greedy else uniform(s.params.seed, s.key, s.op_index, len(s.output_token_ids) + s.pending)
          for s in seqs]
    params = [s.params for s in seqs]
    chosen, margins, sampled = pick(logits, params, us, row_top2)
    figures, rows = {}, {}
    if log_probs is not None:
        k = max(seqs[i].params.logprobs for i in want_lp)
        figures["lp_picked"], figures["lp_values"], figures["lp_ids"] = logprob_tensors(
            log_probs, chosen[to_device(want_lp, chosen.device)], k)
        rows["logprob_rows"] = want_lp
    if margins is not None:
        figures["margins"] = margins
        if sampled is not None and any(params[i].return_margins for i in sampled[0]):
            rows["sampled_rows"], figures["lo"], figures["hi"], figures["cut"] = sampled
            rows["uniforms"] = us
    return PendingTokens(seqs, chosen, figures, rows)
