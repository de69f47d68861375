"""Ship a moving sequence's KV cache, or drop it and let the target prefill again?

Shipping costs the blob's bytes over the link; dropping costs the target one prefill of
the sequence's tokens, α_p + β_p·L, with α_p and β_p from the device calibration (the
EB+ cost model). On loopback shipping always wins; on a GPU with a slow link a short
sequence is cheaper to recompute than to send.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.scheduler.cost_model import CostModel


@dataclass(frozen=True)
class KvDecision:
    ship: bool
    ship_s: float  # estimated seconds to send the KV blob
    reprefill_s: float  # estimated seconds for the target to recompute it

    def describe(self) -> str:
        verdict = "ship the KV" if self.ship else "drop the KV and re-prefill"
        return f"{verdict}: send {self.ship_s * 1e3:.2f} ms vs re-prefill {self.reprefill_s * 1e3:.2f} ms"


def decide_kv(kv_bytes: int, tokens: int, link_bytes_per_s: float, cost: CostModel | None,
              per_transfer_s: float = 0.0) -> KvDecision:
    """Without a calibration, ship (it never loses tokens and needs no guess)."""
    ship_s = per_transfer_s + kv_bytes / max(link_bytes_per_s, 1.0)
    if cost is None or tokens <= 0:
        return KvDecision(True, ship_s, float("inf"))
    reprefill_s = cost.prefill_time(tokens)
    return KvDecision(ship_s <= reprefill_s, ship_s, reprefill_s)
