"""Sampling parameters of one Generate operation (no torch: the SDK uses this too)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


class RequestError(ValueError):
    """A request the engine refuses; the message names the problem and the sequence."""


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 64
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # Record what the shared output comparator needs to tell a real divergence from
    # rounding: the top-1 minus top-2 logit of every position and, when sampling, each
    # draw (its uniform and the chosen token's CDF interval).
    return_margins: bool = False

    def __post_init__(self):
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))

    def validate(self) -> None:
        for name, kinds in (("temperature", (int, float)), ("top_p", (int, float)), ("top_k", int), ("seed", int)):
            value = getattr(self, name)
            if not isinstance(value, kinds) or isinstance(value, bool):
                raise RequestError(f"{name} must be a number, got {value!r}")
        if not all(isinstance(s, str) for s in self.stop):
            raise RequestError(f"stop must be a list of strings, got {list(self.stop)!r}")
        if not all(isinstance(t, int) for t in self.stop_token_ids):
            raise RequestError(f"stop_token_ids must be a list of integers, got {list(self.stop_token_ids)!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise RequestError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise RequestError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise RequestError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if any(not s for s in self.stop):
            raise RequestError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop"] = list(self.stop)
        d["stop_token_ids"] = list(self.stop_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingParams":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})
