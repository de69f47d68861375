"""The `openai_request` program: one request of an OpenAI batch file (`shoal batch`).

A chat or completion runs as the `generate` program runs the same prompt, so its tokens
are those `shoal generate` gives (one Generate per prompt of a completion: each is a
choice); an embedding request is one Embed of its texts.
"""

from __future__ import annotations

from shoal.program import Embed, generate, program

KINDS = ("chat", "completion", "embedding")


def check_item(rec: dict, where: str) -> str | None:
    """What is wrong with an item (refused when the job is submitted), or None."""
    kind = rec.get("kind")
    if kind not in KINDS:
        return f"{where}: kind must be one of {', '.join(KINDS)}, got {kind!r}"
    if kind == "embedding":
        texts = rec.get("input")
        if not (isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts)):
            return f"{where}: input must be a non-empty list of texts"
        return None
    if kind == "chat":
        from shoal.chat_template import check_messages

        return check_messages(rec.get("messages"), where)
    prompts = rec.get("prompts")
    if not (isinstance(prompts, list) and prompts and all(isinstance(p, dict) for p in prompts)):
        return f"{where}: prompts must be a non-empty list of {{\"prompt\" | \"prompt_token_ids\"}}"
    return None


@program("openai_request", check_item=check_item)
def openai_request(item: dict, **params):
    if item["kind"] == "embedding":
        vectors = yield Embed(item["input"])
        return {"embeddings": vectors}
    request = {k: v for k, v in item.items() if k not in ("kind", "prompts")}
    choices = []
    for prompt in item.get("prompts") or [{}]:  # n > 1: each prompt's n samples in turn, as the API orders them
        out = yield from generate({**request, **prompt}, **params)
        choices.extend(out["choices"] if "choices" in out else [out])
    return {"choices": choices}
