"""Sampling parameters of one Generate operation (no torch: the SDK uses this too)."""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from shoal.constraint import Constraint, ConstraintError, check_compiles, constraint_of
from shoal.protocol.errors import ShoalError

MAX_LOGPROBS = 20  # alternatives per token, as OpenAI's top_logprobs allows


class RequestError(ShoalError, ValueError):
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
    # Penalties act on the sequence's own tokens (OpenAI's presence and frequency on its
    # generated ones; the repetition penalty, as transformers and vLLM apply it, on the
    # prompt's too), so a sequence moved to another worker is penalized the same.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias) pairs; a dict is taken too
    min_tokens: int = 0  # end-of-sequence and stop_token_ids are masked until this many are generated
    # The log-probability of each sampled token and of this many alternatives (None: off).
    logprobs: int | None = None
    # One constraint at most (shoal/constraint.py): the output validates against the JSON
    # schema, matches the regex, or is one of the choices.
    json_schema: dict | str | None = field(default=None, hash=False)
    regex: str | None = None
    choice: tuple[str, ...] | None = None

    def __post_init__(self):
        for name in ("stop", "stop_token_ids"):  # (a lone string or number is refused by validate)
            value = getattr(self, name)
            if isinstance(value, (list, tuple)):
                object.__setattr__(self, name, tuple(value))
        if self.choice is not None and isinstance(self.choice, list):
            object.__setattr__(self, "choice", tuple(self.choice))
        bias = self.logit_bias
        if isinstance(bias, dict):
            try:
                bias = tuple(sorted((int(k), v) for k, v in bias.items()))
            except (TypeError, ValueError):
                raise RequestError(f"logit_bias keys must be token ids, got {list(bias)!r}") from None
        object.__setattr__(self, "logit_bias", tuple(tuple(x) for x in bias))

    def validate(self) -> None:
        if self.__dict__.get("_validated"):  # frozen: what passed once passes again (settings shared by many items)
            return
        for name, kinds in (("temperature", (int, float)), ("top_p", (int, float)), ("top_k", int), ("seed", int)):
            value = getattr(self, name)
            if not isinstance(value, kinds) or isinstance(value, bool):
                raise RequestError(f"{name} must be a number, got {value!r}")
        for name in ("stop", "stop_token_ids"):
            if not isinstance(getattr(self, name), tuple):
                raise RequestError(f"{name} must be a list, got {getattr(self, name)!r}")
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
        for name, lo, hi in (("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo <= value <= hi:
                raise RequestError(f"{name} must be a number from {lo:g} to {hi:g}, got {value!r}")
        r = self.repetition_penalty
        if not isinstance(r, (int, float)) or isinstance(r, bool) or not 0 < r <= 10:
            raise RequestError(f"repetition_penalty must be a number in (0, 10] (1 = off), got {r!r}")
        for tok, bias in self.logit_bias:
            if tok < 0 or not isinstance(bias, (int, float)) or isinstance(bias, bool) or not -100 <= bias <= 100:
                raise RequestError(f"logit_bias maps token ids to numbers from -100 to 100, got {tok!r}: {bias!r}")
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) or self.min_tokens < 0:
            raise RequestError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_tokens:
            raise RequestError(f"min_tokens ({self.min_tokens}) exceeds max_tokens ({self.max_tokens})")
        lp = self.logprobs
        if lp is not None and (not isinstance(lp, int) or isinstance(lp, bool) or not 0 <= lp <= MAX_LOGPROBS):
            raise RequestError(f"logprobs must be an integer from 0 to {MAX_LOGPROBS} (alternatives per token), got {lp!r}")
        try:
            constraint = self.constraint
            if constraint is not None:
                check_compiles(constraint)
        except ConstraintError as e:
            raise RequestError(str(e)) from None
        object.__setattr__(self, "_validated", True)

    @property
    def constraint(self) -> Constraint | None:
        """The output's constraint, if any (raises ConstraintError for a malformed one)."""
        return constraint_of(self.json_schema, self.regex, self.choice)

    @property
    def penalized(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict:
        # Field by field, not dataclasses.asdict: its deep copy of every value made this a
        # quarter of a worker's time on one-token items. Only a schema is mutable.
        d = {name: getattr(self, name) for name in self.__dataclass_fields__}
        if isinstance(self.json_schema, dict):
            d["json_schema"] = orjson.loads(orjson.dumps(self.json_schema))
        d["stop"] = list(self.stop)
        d["stop_token_ids"] = list(self.stop_token_ids)
        d["logit_bias"] = {str(t): b for t, b in self.logit_bias}
        if self.choice is not None:
            d["choice"] = list(self.choice)
        # Fields added since checkpoints were first written appear only where set, so a
        # journal of plain requests reads as it always did.
        for name in ADDED_FIELDS:
            if d[name] == _DEFAULTS[name]:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "SamplingParams":
        """The settings of a checkpoint or a moved sequence; a key this version does not
        know is refused, never dropped (dropped, it would change the output silently)."""
        unknown = sorted(set(d) - set(cls.__dataclass_fields__))
        if unknown:
            raise RequestError(f"unknown sampling setting(s) {', '.join(unknown)}")
        return cls(**d)


# Fields added after checkpoints were first written, with their defaults' wire form.
_DEFAULTS = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "logit_bias": {},
             "min_tokens": 0, "logprobs": None, "json_schema": None, "regex": None, "choice": None}
ADDED_FIELDS = tuple(_DEFAULTS)
