"""The wire shape of a generation's settings: the params of a `generate` or
`openai_request` job (SubmitJob.params, AssignSequences.args), and the same fields on
each of its items.

This is what every node may know of them without the engine's types: the field names,
the rule that an item's setting wins over the job's (a constraint is one setting, so an
item's `regex` replaces the job's `json_schema`), and the max_tokens the scheduler's KV
estimate reads. `shoal.request_settings` builds the typed, checked settings on top of
it; a test keeps the two field lists equal.
"""

from __future__ import annotations

GENERATION_PROGRAMS = ("generate", "openai_request")  # programs whose params are these settings

# SamplingParams' fields, then n (samples per request).
FIELDS = ("max_tokens", "temperature", "top_k", "top_p", "seed", "stop", "stop_token_ids", "ignore_eos",
          "return_margins", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
          "min_tokens", "logprobs", "json_schema", "regex", "choice", "n")
CONSTRAINT_FIELDS = ("json_schema", "regex", "choice")
DEFAULT_MAX_TOKENS = 64


_FIELD_ORDER = {k: i for i, k in enumerate(FIELDS)}


def own_settings(item: dict) -> dict:
    """The settings an item sets for itself (a null is no setting), in FIELDS' order."""
    present = item.keys() & _FIELD_ORDER.keys()  # an item sets few, if any: look at those alone
    if not present:
        return {}
    return {k: item[k] for k in sorted(present, key=_FIELD_ORDER.__getitem__) if item[k] is not None}


def resolve(item: dict, job: dict) -> dict:
    """The settings an item runs with, as wire data: its own over the job's."""
    own = own_settings(item)
    if not own:
        return dict(job)
    if any(k in own for k in CONSTRAINT_FIELDS):
        job = {k: v for k, v in job.items() if k not in CONSTRAINT_FIELDS}
    return {**job, **own}


def max_tokens_for(item: dict, job: dict) -> int:
    """The max_tokens an item runs with; a bad value (refused at submit) counts as the
    default, which the worker's own admission then has the last word on."""
    value = resolve(item, job).get("max_tokens", DEFAULT_MAX_TOKENS)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else DEFAULT_MAX_TOKENS
