"""The step cost model every policy and prediction uses (EB+).

One object for a (model, dtype, device): a prefill step of L tokens costs
`α_p + β_p·L`, a decode step of k sequences `α_d + β_d·k`, and MB's effective cost per
token at decode share r is `β_MB(r) = a + b·r + c·r²`. The encoder's terms (a per
micro-batch, c per padded token, t_call per SuperBatch) are calibrated per encoder and
live in `embed_prediction.EncoderCost`, since a worker may host an encoder without a
decoder; `encode_planner.plan_encode` weighs them against `step_time` to decide how
much encoder work joins each engine step. The serialized form (`to_dict`) is what workers publish and
cache; `validate` rejects fits that cannot be trusted.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from shoal.protocol.errors import ShoalError

R2_FLOOR = 0.9  # a fit explaining less than this of the variance is noise


class CalibrationError(ShoalError, ValueError):
    """A calibration that must not drive scheduling; the message says why."""


@dataclass(frozen=True)
class CostModel:
    alpha_p: float  # s per prefill step
    beta_p: float  # s per prefill token
    alpha_d: float  # s per decode step
    beta_d: float  # s per decoding sequence
    mb_a: float  # β_MB(r) = a + b·r + c·r², s per token
    mb_b: float
    mb_c: float
    model: str = ""  # fingerprint of the model it was measured with
    dtype: str = ""
    device: str = ""
    r2: dict = field(default_factory=dict)  # {"prefill": R², "decode": R², "mb": R²}
    # Steps of many short prompts at growing token budgets: [[tokens, seconds], ...].
    budget_probe: list = field(default_factory=list)

    def prefill_time(self, tokens: int) -> float:
        return self.alpha_p + self.beta_p * tokens

    def decode_time(self, seqs: int) -> float:
        return self.alpha_d + self.beta_d * seqs

    def step_time(self, prefill_tokens: int, decode_seqs: int) -> float:
        """A step's predicted time from its work: the step overhead of its kind (a mixed
        step pays the larger, decode's), then each token and each decoding sequence."""
        if not (prefill_tokens or decode_seqs):
            return 0.0
        alpha = self.alpha_d if decode_seqs else self.alpha_p
        return alpha + self.beta_p * prefill_tokens + self.beta_d * decode_seqs

    def beta_mb(self, r: float) -> float:
        return self.mb_a + self.mb_b * r + self.mb_c * r * r

    def step_budget(self, share: float = 0.9) -> int | None:
        """The largest probed step budget whose prefill throughput (tokens/s) is within
        `share` of the best probed one; None without a probe. Up to there a bigger step
        costs nothing per token and admits waiting prompts sooner (fuller decode batches);
        past it, steps get slower per token (activations fall out of cache)."""
        points = [(int(n), float(s)) for n, s in self.budget_probe if n > 0 and s > 0]
        if not points:
            return None
        best = max(n / s for n, s in points)
        return max(n for n, s in points if n / s >= share * best)

    def validate(self, model: str | None = None, dtype: str | None = None, device: str | None = None) -> None:
        for name in ("alpha_p", "beta_p", "alpha_d", "beta_d"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise CalibrationError(f"calibration {name} = {v:.3g} is negative or not finite")
        if self.beta_p == 0 or self.beta_d == 0:
            raise CalibrationError("calibration has a zero slope: prefill or decode cost does not grow with work")
        if any(not math.isfinite(self.beta_mb(r)) or self.beta_mb(r) <= 0 for r in (0.0, 0.5, 1.0)):
            raise CalibrationError("calibration β_MB(r) is not positive on [0, 1]")
        for fit, r2 in self.r2.items():
            if r2 < R2_FLOOR:
                raise CalibrationError(f"calibration {fit} fit has R² {r2:.3f} below {R2_FLOOR}")
        for what, want, have in (("model", model, self.model), ("dtype", dtype, self.dtype), ("device", device, self.device)):
            if want is not None and want != have:
                raise CalibrationError(f"calibration was measured for {what} {have!r}, not {want!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        try:
            return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})
        except TypeError as e:
            raise CalibrationError(f"calibration record is incomplete: {e}") from None


# Published calibrations of Qwen3-8B (EB+).
H200_QWEN3_8B = CostModel(1.28e-3, 2.49e-5, 8.92e-3, 4.59e-5, 2.49e-5, 5.19e-5, 1.48e-5, model="Qwen3-8B", device="H200")
RTX6000_QWEN3_8B = CostModel(4.69e-3, 5.01e-5, 10.4e-3, 1.04e-4, 6.29e-5, 19.69e-5, 0.99e-5, model="Qwen3-8B", device="RTX PRO 6000")
