"""One request contract: the settings of a generation, the job's and each item's.

A job of the `generate` or `openai_request` program carries its settings as its params,
and every item may set its own. This module is the one place that knows their fields
(`SamplingParams`' and `n`), checks them, decides that an item's setting wins over the
job's, and writes their one wire form:

- `GenerationSettings.from_wire(d)` refuses an unknown key (naming it, with the known
  ones) and any bad value (naming its field), so a misspelt setting is never dropped;
- `to_wire()` writes only what `from_wire` reads: the two round-trip exactly;
- `resolve(item)` applies the item's own fields over the job's (a constraint is one
  setting: an item's `regex` replaces the job's `json_schema`).

Who uses it: the CLI and the SDK before a job is sent, the scheduler when it accepts
one (whoever sent it), storage when it checks the items, the scheduler's KV estimate
(`max_tokens_for`), the built-in programs on the worker and the checkpoints they write.
No torch, no tokenizer here.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.protocol.generation_settings import CONSTRAINT_FIELDS, FIELDS, max_tokens_for, own_settings, resolve
from shoal.sampling import RequestError, SamplingParams

__all__ = ["CONSTRAINT_FIELDS", "FIELDS", "MAX_SAMPLES", "GenerationSettings", "SettingsError", "check_item",
           "check_fits", "max_tokens_for", "own_settings"]

MAX_SAMPLES = 128  # n of one request


class SettingsError(RequestError):
    """A setting refused; `field` names it where one is at fault."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def _check_n(n) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_SAMPLES:
        raise SettingsError(f"n must be an integer from 1 to {MAX_SAMPLES}, got {n!r}", "n")
    return n


@dataclass(frozen=True)
class GenerationSettings:
    sampling: SamplingParams = SamplingParams()
    n: int = 1

    @classmethod
    def from_wire(cls, d: dict | None) -> "GenerationSettings":
        """The settings of a wire dict, checked; raises SettingsError naming the field."""
        d = dict(d or {})
        unknown = sorted(set(d) - set(FIELDS))
        if unknown:
            raise SettingsError(f"unknown setting {unknown[0]!r} (a generation takes {', '.join(FIELDS)})", unknown[0])
        n = _check_n(d.pop("n", 1))
        try:
            sampling = SamplingParams(**d)
            sampling.validate()
        except SettingsError:
            raise
        except (RequestError, TypeError, ValueError) as e:
            raise SettingsError(str(e), _field_named(str(e), d)) from None
        return cls(sampling, n)

    def to_wire(self) -> dict:
        return {**self.sampling.to_dict(), **({"n": self.n} if self.n != 1 else {})}

    def resolve(self, item: dict) -> "GenerationSettings":
        """These settings under an item's own: each field the item sets wins."""
        own = own_settings(item)
        return self if not own else GenerationSettings.from_wire(resolve(item, self.to_wire()))


def check_item(item: dict) -> dict:
    """An item's own settings, checked alone (storage checks items without the job's
    params): a relation with a job's setting (min_tokens within max_tokens) is checked
    where both meet, the CLI and the worker. Raises SettingsError."""
    own = own_settings(item)
    if own:
        alone = dict(own)
        if "min_tokens" in alone and "max_tokens" not in alone and isinstance(alone["min_tokens"], int):
            alone["max_tokens"] = max(alone["min_tokens"], 1)
        GenerationSettings.from_wire(alone)
    return own


def check_fits(max_tokens: int, prompt_tokens: int, context: int) -> None:
    """A sequence of this prompt and max_tokens fits the model's context, or SettingsError.
    (Where the prompt's length is not known yet, prompt_tokens is 0: the worker ends such
    a sequence at the context, as "length".)"""
    if max_tokens + prompt_tokens >= context:
        after = f" after a prompt of {prompt_tokens} tokens" if prompt_tokens else ""
        raise SettingsError(f"max_tokens {max_tokens}{after} does not fit the model's context of {context} tokens",
                            "max_tokens")


def _field_named(message: str, d: dict) -> str | None:
    """The field a SamplingParams message is about: the first word that is one."""
    head = message.split(" ", 1)[0]
    return head if head in FIELDS else next((k for k in d if message.startswith(k)), None)
