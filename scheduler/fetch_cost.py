"""The weight-fetch term of a step's cost, when the device cannot hold the model.

With weight streaming (`--device-memory`), every step copies the streamed layers'
weights into the device before they run: the dense part of each streamed layer, and of
a mixture-of-experts layer the experts some token of the step routes to. The copy is
paid once per step whatever the step carries, so the bytes per generated token fall as
the step grows; the step keeps compute ahead of the copies (and the copies hidden behind
it) once its compute takes at least as long as its fetch.

Routing is taken as uniform: a token picks k of E experts, so with `rows` tokens an
expert is picked by none with probability (1 - k/E)^rows and a step fetches
E·(1 - (1 - k/E)^rows) experts of each streamed MoE layer. Real routers are skewed,
which only lowers that count; the estimate errs towards fetching.

Used by the engine to size its steps (`rows_to_cover`: the fewest tokens, or decoding
sequences, whose compute covers the fetch) and by the streamer to decide whether to copy
a MoE layer's experts ahead of use with its dense part (`prefetch_all_experts`).
"""

from __future__ import annotations

from dataclasses import dataclass

# Copy every expert of the next layer ahead of use, overlapped with compute, when a step
# is expected to use at least this share of them: the few bytes copied for nothing cost
# less than waiting for the used ones after the router chose.
PREFETCH_SHARE = 0.75


@dataclass(frozen=True)
class FetchCost:
    dense_bytes: int  # per step: the streamed layers' weights other than their experts
    expert_bytes: int = 0  # one expert of one streamed layer
    moe_layers: int = 0  # streamed layers that have experts
    num_experts: int = 0
    top_k: int = 0
    bandwidth: float = 0.0  # bytes/s from host memory into the device, measured

    def expert_share(self, rows: int) -> float:
        """The expected share of a layer's experts that `rows` tokens route to."""
        if not self.num_experts or rows <= 0:
            return 0.0
        return 1.0 - (1.0 - min(self.top_k, self.num_experts) / self.num_experts) ** rows

    def bytes_per_step(self, rows: int) -> float:
        experts = self.num_experts * self.expert_share(rows)
        return self.dense_bytes + self.moe_layers * experts * self.expert_bytes

    def bytes_per_token(self, rows: int) -> float:
        return self.bytes_per_step(rows) / max(1, rows)

    def fetch_time(self, rows: int) -> float:
        if self.bandwidth <= 0:
            raise ValueError("the fetch cost has no measured copy bandwidth")
        return self.bytes_per_step(rows) / self.bandwidth

    def rows_to_cover(self, seconds_per_row: float, most: int) -> int:
        """The fewest rows (tokens, or decoding sequences) per step whose compute, at
        `seconds_per_row`, takes at least the step's fetch; `most` if none up to it does."""
        if seconds_per_row <= 0:
            return most
        lo, hi = 1, max(1, most)
        # compute - fetch is convex in rows and not positive at 0 (the fetch's growth
        # slows as experts saturate; compute grows linearly): once non-negative it stays
        # so, and the first row count where it is comes by bisection.
        if seconds_per_row * hi < self.fetch_time(hi):
            return hi
        while lo < hi:
            mid = (lo + hi) // 2
            if seconds_per_row * mid >= self.fetch_time(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def prefetch_all_experts(self, rows: int) -> bool:
        return self.expert_share(rows) >= PREFETCH_SHARE

    def to_dict(self) -> dict:
        return {"dense_bytes": self.dense_bytes, "expert_bytes": self.expert_bytes, "moe_layers": self.moe_layers,
                "num_experts": self.num_experts, "top_k": self.top_k, "bandwidth": self.bandwidth}
