"""Lines of an OpenAI Batch API output file, from the results of `openai_request` items.

A request that ran: `{"id", "custom_id", "response": {"status_code": 200, "request_id",
"body"}, "error": null}`, the body shaped as the API shapes a chat completion, a
completion or an embedding list. A request that did not (a bad line, or one that failed
on a worker): `"response": null` and `"error": {"code", "message", "line", "param"}`.
"""

from __future__ import annotations

import base64

import numpy as np

from shoal.openai_requests import BatchRequest

FINISH_REASONS = {"stop": "stop", "length": "length"}


class OutputLines:
    """Output lines of one batch job; ids are the job's tag and the input line."""

    def __init__(self, tag: str, created: int):
        self.tag, self.created = tag, created

    def _ids(self, line: int) -> tuple[str, str]:
        return f"batch_req_{self.tag}_{line}", f"req_{self.tag}_{line}"

    def error(self, line: int, custom_id, code: str, message: str, param: str | None = None) -> dict:
        return {"id": self._ids(line)[0], "custom_id": custom_id, "response": None,
                "error": {"code": code, "message": message, "line": line, "param": param}}

    def result(self, req: BatchRequest, record: dict, count_tokens=None) -> dict:
        """The output line of a request from its result record. `count_tokens(texts)`
        gives an embedding request's input tokens (its usage)."""
        if record.get("finish_reason") == "error" or "error" in record:
            return self.error(req.line, req.custom_id, "request_failed",
                              f"line {req.line} ({req.custom_id}): {record.get('error')}")
        line_id, request_id = self._ids(req.line)
        if req.kind == "embedding":
            body = self._embeddings(req, record["embeddings"], count_tokens)
        else:
            body = self._completion(req, record["choices"], request_id)
        return {"id": line_id, "custom_id": req.custom_id,
                "response": {"status_code": 200, "request_id": request_id, "body": body}, "error": None}

    def _completion(self, req: BatchRequest, outs: list[dict], request_id: str) -> dict:
        chat = req.kind == "chat"
        choices = []
        for i, out in enumerate(outs):
            lp = out.get("logprobs")
            choice = {"index": i, "finish_reason": FINISH_REASONS.get(out["finish_reason"], "stop"),
                      "logprobs": None if lp is None else (chat_logprobs(lp) if chat else completion_logprobs(lp))}
            if chat:
                choice["message"] = {"role": "assistant", "content": out["text"]}
            else:
                choice["text"] = out["text"]
            choices.append(choice)
        # (the API counts a prompt once however many samples it has)
        n = max(1, len(outs) // max(1, len(req.item.get("prompts") or [{}])))
        prompt = sum(int(o.get("prompt_tokens", 0)) for o in outs[::n])
        completion = sum(len(o["token_ids"]) for o in outs)
        return {"id": ("chatcmpl-" if chat else "cmpl-") + request_id, "object": "chat.completion" if chat else "text_completion",
                "created": self.created, "model": req.model, "choices": choices,
                "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}

    def _embeddings(self, req: BatchRequest, vectors: list, count_tokens) -> dict:
        data = []
        for i, v in enumerate(vectors):
            if req.encoding_format == "base64":  # the API's: float32 little-endian bytes, base64
                v = base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode()
            data.append({"object": "embedding", "index": i, "embedding": v})
        tokens = count_tokens(req.item["input"]) if count_tokens else 0
        return {"object": "list", "data": data, "model": req.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def chat_logprobs(entries: list[dict]) -> dict:
    """A chat choice's `logprobs`: content[] of {token, logprob, bytes, top_logprobs}."""
    def one(e: dict) -> dict:
        return {"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"]}

    return {"content": [{**one(e), "top_logprobs": [one(t) for t in e["top_logprobs"]]} for e in entries],
            "refusal": None}


def completion_logprobs(entries: list[dict]) -> dict:
    """A completion choice's `logprobs`: tokens, token_logprobs, top_logprobs (a token ->
    logprob map per position) and text_offset (where each token starts in the text)."""
    offsets, at = [], 0
    for e in entries:
        offsets.append(at)
        at += len(e["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets}
