"""Predicting an embedding job's time before it runs (SURGE, our derivation).

An encoder micro-batch of b texts padded to L tokens costs `a + c·b·L`; every call (one
SuperBatch, or one partition in the per-partition pipeline) also needs its messages,
its storage read and write and its scheduling, `t_call`. Shoal keeps two calls in
flight per worker, so a call's overhead overlaps the previous call's encoding and a
call costs max(t_call, t_enc(call)); without that overlap (`overlap=False`, the paper's
form) it costs t_call + t_enc(call). Given the token length of every text (from the
tokenizer, never the encoder), the same packing and micro-batch cutting the workers use
give T_sb (SuperBatches) and T_pp (one call per partition) as sums over their calls.

φ is the share of per-partition time that is not per-token encoder work (call
overheads, and the encoder's `a` of each micro-batch): what batching removes. Batching also sorts
more texts together, so micro-batches pad less: with ρ = padded tokens per partition /
padded tokens in SuperBatches, the gain T_pp / T_sb is at most ρ / (1 − φ). CV is the
coefficient of variation of partition sizes.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from shoal.scheduler.superbatch import DEFAULT_TOKEN_BUDGET, micro_batches, pack


@dataclass(frozen=True)
class EncoderCost:
    a: float  # s per micro-batch
    c: float  # s per padded token
    t_call: float  # s per call (SuperBatch or partition)
    overlap: bool = True  # a call's overhead hides behind the previous call's encoding

    def call(self, lengths: list[int], token_budget: int) -> float:
        enc = self.encode(lengths, token_budget)
        return max(self.t_call, enc) if self.overlap else self.t_call + enc

    def micro_batch(self, b: int, longest: int) -> float:
        return self.a + self.c * b * longest

    def encode(self, lengths: list[int], token_budget: int) -> float:
        """Encoder time of one call's texts: sorted by length, cut by the token budget."""
        s = sorted(lengths)
        return sum(self.micro_batch(len(r), s[r.stop - 1]) for r in micro_batches(s, token_budget))

    @staticmethod
    def padded(lengths: list[int], token_budget: int) -> int:
        s = sorted(lengths)
        return sum(len(r) * s[r.stop - 1] for r in micro_batches(s, token_budget))



@dataclass(frozen=True)
class EmbedPrediction:
    texts: int
    partitions: int
    superbatches: int
    superbatch_s: float
    per_partition_s: float
    phi: float
    cv: float
    padding: float  # ρ: padded tokens per partition / padded tokens in SuperBatches

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.superbatch_s if self.superbatch_s > 0 else 0.0

    @property
    def gain(self) -> float:
        return self.per_partition_s / self.superbatch_s if self.superbatch_s > 0 else 1.0

    def summary(self) -> str:
        pays = "SuperBatching pays off" if self.gain >= 1.1 else "SuperBatching gains little here"
        return (f"{self.texts} texts in {self.partitions} partitions (CV {self.cv:.2f}) -> {self.superbatches} "
                f"SuperBatches: predicted {self.superbatch_s:.1f}s ({self.texts_per_s:.0f} texts/s); per-partition "
                f"{self.per_partition_s:.1f}s; phi {self.phi:.2f} (bound 1/(1-phi) = "
                f"{1 / max(1e-9, 1 - self.phi):.2f}x), padding ratio {self.padding:.2f}, predicted gain "
                f"{self.gain:.2f}x: {pays}")


def predict(lengths: dict[str, list[int]], b_min: int, n_max: int, cost: EncoderCost,
            token_budget: int = DEFAULT_TOKEN_BUDGET) -> EmbedPrediction:
    """`lengths`: partition -> token length of each of its texts, in stored order."""
    names = list(lengths)
    sizes = [len(lengths[n]) for n in names]
    sbs = pack(list(zip(names, sizes)), b_min, n_max)
    sb_lengths = [[x for s in sb.slices for x in lengths[s.partition][s.start:s.end]] for sb in sbs]
    t_sb = sum(cost.call(ls, token_budget) for ls in sb_lengths)
    calls = [n for n in names if lengths[n]]
    t_pp = sum(cost.call(lengths[n], token_budget) for n in calls)
    padded_sb = sum(cost.padded(ls, token_budget) for ls in sb_lengths)
    padded_pp = sum(cost.padded(lengths[n], token_budget) for n in calls)
    padding = padded_pp / padded_sb if padded_sb else 1.0
    phi = 1.0 - cost.c * padded_pp / t_pp if t_pp > 0 else 0.0  # what is not per-token work
    cv = statistics.pstdev(sizes) / statistics.mean(sizes) if sizes and statistics.mean(sizes) > 0 else 0.0
    return EmbedPrediction(sum(sizes), len(names), len(sbs), t_sb, t_pp, phi, cv, padding)
