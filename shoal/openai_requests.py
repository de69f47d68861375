"""Lines of an OpenAI Batch API input file, read into items of the `openai_request` program.

Each line is `{"custom_id", "method": "POST", "url", "body"}`, the url one of
/v1/chat/completions, /v1/completions and /v1/embeddings (the format hosted batch APIs
and `vllm run-batch` share). A line that cannot run raises `RequestLineError` naming
its problem; the other lines are not affected by it.

Where the body is silent the API's defaults hold: temperature 1, top_p 1, 16 tokens for
a completion; a chat's max_tokens, which the API leaves to the context, is the job's
default (`shoal batch --max-tokens`). Structured outputs come as the API asks for them
(`response_format` json_object or json_schema) or as vLLM's extensions name them
(`structured_outputs` {json, regex, choice}, and the older `guided_json`, `guided_regex`,
`guided_choice`); logprobs, n, penalties, logit_bias and seed as the API defines them.
Parameters that would change the output in ways Shoal does not implement (tools, echo,
best_of > 1, ...) are refused by name, never ignored; metadata the API takes (user,
metadata, store, ...) is.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.protocol.errors import ShoalError

URL_KINDS = {"/v1/chat/completions": "chat", "/v1/completions": "completion", "/v1/embeddings": "embedding"}

# Accepted and without effect on the output.
IGNORED = frozenset({"model", "user", "metadata", "store", "service_tier", "stream", "stream_options",
                     "parallel_tool_calls", "prompt_cache_key", "safety_identifier"})
# Sampling parameters of every generation request, taken as they are (from top_k on,
# vLLM's extensions).
SAMPLING = ("temperature", "top_p", "seed", "stop", "presence_penalty", "frequency_penalty", "n",
            "top_k", "stop_token_ids", "ignore_eos", "min_tokens", "repetition_penalty")
# The structured-output fields: the API's and vLLM's (see _structured).
STRUCTURED = ("response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice")
# Parameters taken only at their no-op values.
NO_OP_VALUES = {"best_of": (1,), "echo": (False,), "suffix": (None, ""),
                "tools": (None, []), "tool_choice": (None, "none")}
CHAT_FIELDS = frozenset({"messages", "max_tokens", "max_completion_tokens", "logprobs", "top_logprobs", "logit_bias",
                         *SAMPLING, *STRUCTURED})
COMPLETION_FIELDS = frozenset({"prompt", "max_tokens", "logprobs", "logit_bias", *SAMPLING, *STRUCTURED})
EMBEDDING_FIELDS = frozenset({"input", "encoding_format", "dimensions"})
COMPLETION_DEFAULT_MAX_TOKENS = 16  # the API's default for /v1/completions


class RequestLineError(ShoalError, ValueError):
    """A line that cannot run: `code` as the Batch API's errors name them, `param` the
    field at fault, `custom_id` where the line has one."""

    def __init__(self, message: str, code: str = "invalid_request", param: str | None = None, custom_id=None):
        super().__init__(message)
        self.code, self.param, self.custom_id = code, param, custom_id


@dataclass(frozen=True)
class BatchRequest:
    line: int
    custom_id: str
    kind: str  # "chat" | "completion" | "embedding"
    model: str
    item: dict  # the openai_request program's item
    encoding_format: str = "float"


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_request(rec, line: int, seen: dict[str, int] | None = None, embedding_dim: int | None = None,
                  limits: tuple[int, int] | None = None) -> BatchRequest:
    """The line's request, or RequestLineError. `seen` (custom_id -> line) refuses a
    repeated custom_id; `embedding_dim` is the encoder's, checked against `dimensions`;
    `limits` the decoder's (context, vocabulary size): a generation line is held to them
    as `shoal generate` holds an item (empty prompts, token ids, max_tokens)."""
    if not isinstance(rec, dict):
        raise RequestLineError(f"line {line}: a request must be a JSON object", "invalid_json")
    custom_id = rec.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise RequestLineError(f"line {line}: custom_id must be a non-empty string", param="custom_id")

    def fail(message: str, param: str | None = None, code: str = "invalid_request"):
        raise RequestLineError(f"line {line} ({custom_id}): {message}", code, param, custom_id)

    if seen is not None and custom_id in seen:
        fail(f"duplicate custom_id (first on line {seen[custom_id]})", "custom_id", "duplicate_custom_id")
    if rec.get("method", "POST") != "POST":
        fail(f"method must be POST, got {rec.get('method')!r}", "method")
    kind = URL_KINDS.get(rec.get("url"))
    if kind is None:
        fail(f"url {rec.get('url')!r} is not one of {', '.join(URL_KINDS)}", "url", "invalid_url")
    body = rec.get("body")
    if not isinstance(body, dict):
        fail("body must be a JSON object", "body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        fail("body.model must be a non-empty string", "body.model")
    known = {"chat": CHAT_FIELDS, "completion": COMPLETION_FIELDS, "embedding": EMBEDDING_FIELDS}[kind]
    for key, value in body.items():
        if key in known or key in IGNORED:
            continue
        if key in NO_OP_VALUES:
            if value not in NO_OP_VALUES[key]:
                fail(f"{key}={value!r} is not supported (only {NO_OP_VALUES[key][0]!r})", f"body.{key}")
            continue
        fail(f"unsupported parameter {key!r} for {rec['url']}", f"body.{key}")
    try:
        if kind == "embedding":
            texts, encoding = _embedding(body, embedding_dim)
            request = BatchRequest(line, custom_id, kind, model, {"id": custom_id, "kind": kind, "input": texts}, encoding)
        else:
            request = BatchRequest(line, custom_id, kind, model, _generation_item(custom_id, kind, body, limits))
    except RequestLineError as e:
        fail(str(e), e.param)
    if seen is not None:
        seen[custom_id] = line
    return request


def _generation_item(custom_id: str, kind: str, body: dict, limits: tuple[int, int] | None = None) -> dict:
    """A chat's or completion's item: its prompt(s), max_tokens and sampling."""
    item = {"id": custom_id, "kind": kind, **_sampling(body), **_structured(body), **_logprobs(kind, body)}
    if body.get("logit_bias"):
        item["logit_bias"] = body["logit_bias"]
    if kind == "chat":
        item["messages"] = _messages(body.get("messages"))
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
    else:
        item["prompts"] = _prompts(body.get("prompt"))
        limit = body.get("max_tokens", COMPLETION_DEFAULT_MAX_TOKENS)
    if limit is not None:
        if not _is_int(limit) or limit <= 0:
            raise RequestLineError(f"max_tokens must be a positive integer, got {limit!r}", param="body.max_tokens")
        item["max_tokens"] = limit
    _check_sampling(item)
    if limits is not None:
        _check_limits(item, *limits)
    return item


def _check_limits(item: dict, context: int, vocab: int) -> None:
    """What the worker would fail: an empty prompt, a token id outside the vocabulary, a
    max_tokens that cannot fit the context (after the prompt, where its length is known)."""
    from shoal.generate_input import prompt_problem
    from shoal.request_settings import SettingsError, check_fits

    for p in item.get("prompts", []):
        problem = prompt_problem(p.get("prompt"), p.get("prompt_token_ids"), vocab)
        if problem:
            raise RequestLineError(problem, param="body.prompt")
    longest = max((len(p.get("prompt_token_ids") or ()) for p in item.get("prompts", [])), default=0)
    try:
        check_fits(item.get("max_tokens", 1), longest, context)
    except SettingsError as e:
        raise RequestLineError(str(e), param="body.max_tokens") from None


def _sampling(body: dict) -> dict:
    """The body's sampling parameters as a generate item's fields, with the API's
    defaults (temperature and top_p 1) where it gives none."""
    out = {"temperature": 1.0, "top_p": 1.0}
    for key in SAMPLING:
        value = body.get(key)
        if value is None:
            continue
        if key == "stop" and isinstance(value, str):
            value = [value]
        out[key] = value
    temperature = out["temperature"]
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise RequestLineError(f"temperature must be a number from 0 to 2, got {temperature!r}", param="body.temperature")
    if "stop" in out and not (isinstance(out["stop"], list) and all(isinstance(s, str) for s in out["stop"])):
        raise RequestLineError(f"stop must be a string or a list of strings, got {out['stop']!r}", param="body.stop")
    return out


def _structured(body: dict) -> dict:
    """The request's constraint as a generate item's json_schema, regex or choice."""
    found = {}
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_object":
            found["json_schema"] = {"type": "object"}
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, dict) else None
            if not isinstance(schema, dict):
                raise RequestLineError("response_format json_schema needs json_schema.schema, a JSON object",
                                       param="body.response_format")
            found["json_schema"] = schema
        elif kind != "text":
            raise RequestLineError(f"response_format type {kind!r} is not one of text, json_object, json_schema",
                                   param="body.response_format")
    vllm = body.get("structured_outputs") or {}
    if not isinstance(vllm, dict):
        raise RequestLineError("structured_outputs must be an object", param="body.structured_outputs")
    unknown = sorted(set(vllm) - {"json", "regex", "choice"})
    if unknown:
        raise RequestLineError(f"structured_outputs.{unknown[0]} is not supported (json, regex, choice are)",
                               param="body.structured_outputs")
    for name, value in (("json_schema", vllm.get("json", body.get("guided_json"))),
                        ("regex", vllm.get("regex", body.get("guided_regex"))),
                        ("choice", vllm.get("choice", body.get("guided_choice")))):
        if value is not None:
            if found:
                raise RequestLineError(f"give one structured output, not {next(iter(found))} and {name}",
                                       param="body.structured_outputs")
            found[name] = value
    return found


def _logprobs(kind: str, body: dict) -> dict:
    """A chat's `logprobs` (true/false) with `top_logprobs` (0-20), or a completion's
    `logprobs` (the number of alternatives), as the item's `logprobs`."""
    value = body.get("logprobs")
    if kind == "chat":
        top = body.get("top_logprobs")
        if top is not None and not value:
            raise RequestLineError("top_logprobs needs logprobs: true", param="body.top_logprobs")
        if value in (None, False):
            return {}
        if value is not True:
            raise RequestLineError(f"logprobs must be true or false, got {value!r}", param="body.logprobs")
        return {"logprobs": 0 if top is None else top}
    if value is None or value is False:
        return {}
    return {"logprobs": value}


def _check_sampling(item: dict) -> None:
    """Refuses what the workers' sampler would (as `shoal generate` refuses an item)."""
    from shoal.request_settings import GenerationSettings, SettingsError, own_settings

    try:  # the line carries all of its settings: checked whole, relations included
        GenerationSettings.from_wire(own_settings(item))
    except SettingsError as e:
        raise RequestLineError(f"body: {e}", param=f"body.{e.field}" if e.field else None) from None


def _messages(messages) -> list[dict]:
    """The chat, each content part list made one string (text parts only: the models
    Shoal serves read text)."""
    if not isinstance(messages, list) or not messages:
        raise RequestLineError("messages must be a non-empty list", param="body.messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestLineError(f"messages[{i}] must be an object with a string role", param=f"body.messages[{i}]")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise RequestLineError(f"messages[{i}]: content part of type {kind!r} is not supported (text only)",
                                           param=f"body.messages[{i}].content")
                texts.append(part["text"])
            m = {**m, "content": "\n".join(texts)}
        elif content is not None and not isinstance(content, str):
            raise RequestLineError(f"messages[{i}].content must be a string or a list of text parts",
                                   param=f"body.messages[{i}].content")
        out.append(m)
    return out


def _prompts(prompt) -> list[dict]:
    """A completion's prompts: a string, token ids, or a list of either (one choice each)."""
    def one(p, where: str) -> dict:
        if isinstance(p, str):
            return {"prompt": p}
        if isinstance(p, list) and p and all(_is_int(t) and t >= 0 for t in p):
            return {"prompt_token_ids": p}
        raise RequestLineError(f"{where} must be a string or a non-empty list of token ids", param="body.prompt")

    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return [one(p, f"prompt[{i}]") for i, p in enumerate(prompt)]
    return [one(prompt, "prompt")]


def _embedding(body: dict, dim: int | None) -> tuple[list[str], str]:
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        raise RequestLineError("input must be a string or a non-empty list of strings", param="body.input")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise RequestLineError(f"input[{i}] must be a string (token-id input is not supported)", param="body.input")
        if not t:
            raise RequestLineError(f"input[{i}] is empty", param="body.input")
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise RequestLineError(f"encoding_format must be float or base64, got {encoding!r}", param="body.encoding_format")
    dims = body.get("dimensions")
    if dims is not None and dims != dim:
        raise RequestLineError(f"dimensions={dims!r} is not supported: the encoder's vectors have {dim}",
                               param="body.dimensions")
    return texts, encoding
