"""Programs: what a job runs on each of its items.

A program is a generator function that yields operations and receives their results:

    @program("two_step")
    def two_step(item, max_tokens=16):
        first = yield Generate(prompt=item["prompt"], max_tokens=max_tokens)
        second = yield Generate(prompt=item["prompt"] + first.text, max_tokens=max_tokens)
        return {"first": first.text, "second": second.text}

It is called as `fn(item, **args)`, args being the job's arguments updated by the item's
own `args`. Its return value is the item's result (a dict is merged into the record).
A job names its program by registered name (`generate`) or import path
(`package.module:function`), which must import on every worker. Programs must be
deterministic functions of their operation results: a moved sequence is resumed by
running the program again over the results it already had.

No torch here: the SDK and the scheduler use these types too.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field
from typing import Callable

import orjson

from shoal.protocol.generation_settings import own_settings
from shoal.sampling import RequestError, SamplingParams
from shoal.protocol.errors import ShoalError




class ProgramError(ShoalError, RuntimeError):
    """A program that cannot be found, imported or run; the message names it."""


# -- operations ------------------------------------------------------------------------------


class Generate:
    """Generate tokens from a text prompt, token ids, or chat messages (rendered with the
    model's chat template on the worker); the sampling parameters are those of
    `SamplingParams` (max_tokens, stop, temperature, top_p, top_k, seed, json_schema,
    regex, choice, logprobs, penalties, ...).

    `n` > 1 asks for several samples of the prompt: the result is then a list of n
    results, sample j drawn as a single request with seed `seed + j` draws (the prompt is
    prefilled once, the others reading its KV blocks from the prefix cache)."""

    kind = "generate"

    def __init__(self, prompt: str | None = None, prompt_token_ids: list[int] | None = None,
                 messages: list[dict] | None = None, n: int = 1, **params):
        unknown = sorted(set(params) - set(SamplingParams.__dataclass_fields__))
        if unknown:
            raise RequestError(f"Generate: unknown sampling parameter(s) {', '.join(unknown)}")
        from shoal.request_settings import MAX_SAMPLES

        if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_SAMPLES:
            raise RequestError(f"n must be an integer from 1 to {MAX_SAMPLES}, got {n!r}")
        self._set_prompt(prompt, prompt_token_ids, messages)
        self.n = n
        self.params = SamplingParams(**params)
        self._params_wire = None
        self.is_plain = False

    @classmethod
    def of_settings(cls, settings: "ResolvedSettings", prompt: str | None = None,
                    prompt_token_ids: list[int] | None = None, messages: list[dict] | None = None) -> "Generate":
        """A Generate with settings built and checked once for many items (the generate
        program's): the prompt is checked here, the settings are not again."""
        op = cls.__new__(cls)
        op._set_prompt(prompt, prompt_token_ids, messages)
        op.n, op.params, op._params_wire = settings.n, settings.params, settings.wire
        # Token ids of plain ints and no chat: the op is plain data as it stands.
        op.is_plain = messages is None and (prompt_token_ids is None or set(map(type, op.prompt_token_ids)) <= {int})
        return op

    def plain_dict(self) -> dict:
        """`to_dict()` as fresh plain data, for an op whose parts are plain already."""
        d = self.to_dict()
        d["params"] = orjson.loads(orjson.dumps(d["params"])) if self.params.json_schema is not None else dict(d["params"])
        if d["prompt_token_ids"] is not None:
            d["prompt_token_ids"] = list(d["prompt_token_ids"])
        return d

    def _set_prompt(self, prompt, prompt_token_ids, messages) -> None:
        if sum(x is not None for x in (prompt, prompt_token_ids, messages)) != 1:
            raise RequestError("Generate needs one of prompt, prompt_token_ids and messages")
        if messages is not None:
            from shoal.chat_template import check_messages

            problem = check_messages(messages, "Generate")
            if problem:
                raise RequestError(problem)
        self.prompt = prompt
        self.prompt_token_ids = None if prompt_token_ids is None else list(prompt_token_ids)
        self.messages = messages

    def to_dict(self) -> dict:
        params = self.params.to_dict() if self._params_wire is None else self._params_wire
        d = {"op": self.kind, "prompt": self.prompt, "prompt_token_ids": self.prompt_token_ids, "params": params}
        if self.messages is not None:  # (absent otherwise: journals written before chats stay valid)
            d["messages"] = self.messages
        if self.n != 1:
            d["n"] = self.n
        return d


@dataclass(frozen=True)
class _TextsOperation:
    """An operation on a list of texts (Embed, Tokenize)."""

    texts: tuple[str, ...]
    kind = ""

    def __post_init__(self):
        if isinstance(self.texts, str):
            raise RequestError(f"{type(self).__name__} takes a list of texts, not one string")
        object.__setattr__(self, "texts", tuple(self.texts))

    def to_dict(self) -> dict:
        return {"op": self.kind, "texts": list(self.texts)}


@dataclass(frozen=True)
class Embed(_TextsOperation):
    """Embed texts with the worker's encoder; the result is one vector per text."""

    kind = "embed"


@dataclass(frozen=True)
class Retrieve:
    """Top-k passages of an index for a query text (or vector). On an approximate index,
    `nprobe` (ivf) or `ef` (hnsw) trades speed for recall for this query (default: the
    index's own); an exact index ignores them."""

    query: str | tuple[float, ...]
    k: int = 4
    index: str = "default"
    nprobe: int | None = None
    ef: int | None = None
    kind = "retrieve"

    def search_params(self) -> dict:
        return {name: v for name, v in (("nprobe", self.nprobe), ("ef", self.ef)) if v is not None}

    def to_dict(self) -> dict:
        q = self.query if isinstance(self.query, str) else list(self.query)
        return {"op": self.kind, "query": q, "k": self.k, "index": self.index, **self.search_params()}


@dataclass(frozen=True)
class Tokenize(_TextsOperation):
    """Token ids of texts under the worker's decoder tokenizer, without special tokens:
    what a program needs to build token prompts (cut a context to its last N tokens,
    put ids in front). Answered at once, on the worker, with no model call."""

    kind = "tokenize"


Operation = Generate | Embed | Retrieve | Tokenize


@dataclass(frozen=True)
class GenerateResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    margins: list[float] = field(default_factory=list)
    # Sampled tokens' draws, [u, lo, hi, cut] each: what the comparator judges them by.
    draws: list[list] = field(default_factory=list)
    prompt_tokens: int = 0  # the prompt's length in tokens (a chat's after its template)
    # Where asked for: per token {"token", "token_id", "logprob", "bytes", "top_logprobs"}.
    logprobs: list[dict] | None = None

    def to_dict(self) -> dict:
        d = {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason}
        if self.prompt_tokens:
            d["prompt_tokens"] = self.prompt_tokens
        if self.logprobs is not None:
            d["logprobs"] = self.logprobs
        if self.margins:
            d["margins"] = self.margins
        if self.draws:
            d["draws"] = self.draws
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "GenerateResult":
        return cls(d["text"], list(d["token_ids"]), d["finish_reason"], list(d.get("margins", ())),
                   [list(x) for x in d.get("draws", ())], int(d.get("prompt_tokens", 0)), d.get("logprobs"))


def result_from_dict(kind: str, d):
    """An operation's result as the program receives it, from its journal form (a
    Generate of n > 1 samples: a list of them)."""
    if kind != "generate":
        return d
    return [GenerateResult.from_dict(x) for x in d] if isinstance(d, list) else GenerateResult.from_dict(d)


def result_to_dict(result):
    if isinstance(result, list) and result and isinstance(result[0], GenerateResult):
        return [r.to_dict() for r in result]
    return result.to_dict() if isinstance(result, GenerateResult) else result


# -- programs --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProgramSpec:
    name: str
    fn: Callable
    version: str = "1"
    # check_item(record, where) -> what is wrong with an item, or None: a built-in
    # program's items are refused when the job is submitted, not when a worker runs them.
    check_item: Callable | None = None


_REGISTRY: dict[str, ProgramSpec] = {}


def program(name: str, version: str = "1", check_item: Callable | None = None):
    """Registers a generator function as a program under `name`. Bump `version` when
    its operations change: state recorded by another version is not resumed by it."""

    def register(fn: Callable) -> Callable:
        fn.shoal_program = ProgramSpec(name, fn, version, check_item)
        _REGISTRY[name] = fn.shoal_program
        return fn

    return register


# Built-in programs defined in modules of their own: they register when imported.
BUILT_IN_MODULES = ("shoal.ircot", "shoal.examples.w3", "shoal.openai_program")


_built_ins_loaded = False


def _registry() -> dict[str, ProgramSpec]:
    """Every registered program, the built-in ones loaded on first use: their modules
    import this one, so this one imports them only when asked (no import cycle)."""
    global _built_ins_loaded
    if not _built_ins_loaded:
        for module in BUILT_IN_MODULES:
            importlib.import_module(module)
        _built_ins_loaded = True
    return _REGISTRY


def built_in_item_check(name: str) -> Callable | None:
    """The item check of a built-in program, if it has one."""
    spec = _registry().get(name)
    return spec.check_item if spec else None


def check_program_name(name: str) -> None:
    """What a node that does not run programs can check of a job's program: a built-in
    name, or the form package.module:function (whether it imports, the workers say)."""
    module, _, attr = name.partition(":")
    if name in _registry():
        return
    if not (module and attr.isidentifier() and all(p.isidentifier() for p in module.split("."))):
        raise ProgramError(f"unknown program {name!r}: built-in programs are {sorted(_registry())}; "
                           "give a user program as package.module:function")


def program_allowed(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether `package.module:function` matches a pattern: shell-style, against the
    whole name (`mypkg.*:*`) or, for a pattern without a colon, its module (`mypkg.*`)."""
    from fnmatch import fnmatchcase

    module = name.partition(":")[0]
    return any(fnmatchcase(name if ":" in p else module, p) for p in patterns)


def resolve_program(name: str, allowed: tuple[str, ...] | None = None) -> ProgramSpec:
    """The program a job names: a registered name or `package.module:function`, which
    is imported only if it matches one of the `allowed` patterns (None: any)."""
    if name in _registry():
        return _REGISTRY[name]
    check_program_name(name)
    if allowed is not None and not program_allowed(name, allowed):
        raise ProgramError(f"program {name!r} is not allowed on this worker: it runs built-in programs "
                           f"({', '.join(sorted(_REGISTRY))})"
                           + (f" and those matching {', '.join(allowed)}" if allowed else "")
                           + " (worker option --allow-programs PATTERN)")
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # a broken user module must fail its job, never the worker
        raise ProgramError(f"program {name!r} does not import: {type(e).__name__}: {e}") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise ProgramError(f"program {name!r}: module {module_name!r} has no {attr!r}")
    spec = getattr(fn, "shoal_program", None)
    if spec is None:
        if not callable(fn):
            raise ProgramError(f"program {name!r} is not a function")
        spec = ProgramSpec(name, fn)
    return spec


@dataclass(frozen=True)
class ResolvedSettings:
    """A Generate's settings, built and checked: shared by every item that has them
    (SamplingParams is frozen; `wire` is only read, and copied where it is kept)."""

    n: int
    params: SamplingParams
    wire: dict


@functools.lru_cache(maxsize=256)
def _resolved_settings(params: bytes, own: bytes) -> ResolvedSettings:
    """Generate's settings for a job's settings under an item's own: parsed, checked and
    built once per distinct pair, not per item (the items of a job mostly share them;
    doing it for each took a sixth of a worker's time on one-token items, and building
    each item's SamplingParams a tenth more). A pair that fails raises each time."""
    from shoal.request_settings import GenerationSettings

    settings = GenerationSettings.from_wire(orjson.loads(params)).resolve(orjson.loads(own))
    settings.sampling.validate()
    return ResolvedSettings(settings.n, settings.sampling, settings.sampling.to_dict())


@program("generate")
def generate(item: dict, **params):
    """One Generate per item: the item's prompt (text, token ids or chat messages) with the
    job's settings under the item's own (`shoal/request_settings.py`). With n > 1 the
    record holds the samples as `choices`."""
    settings = _resolved_settings(orjson.dumps(params, option=orjson.OPT_SORT_KEYS),
                                  orjson.dumps(own_settings(item), option=orjson.OPT_SORT_KEYS))
    if item.get("messages") is not None:
        out = yield Generate.of_settings(settings, messages=item["messages"])
    elif item.get("prompt_token_ids") is not None:
        out = yield Generate.of_settings(settings, prompt_token_ids=item["prompt_token_ids"])
    else:
        out = yield Generate.of_settings(settings, prompt=item.get("prompt"))
    return {"choices": [o.to_dict() for o in out]} if isinstance(out, list) else out.to_dict()


