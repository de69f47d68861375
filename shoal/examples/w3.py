"""The `w3` program: the iterative-retrieval job Shoal is measured on, as token prompts.

For each hop h < max_hops the sequence thinks, then retrieves:

    prompt = [bos] + tok(question) + ctx[-window:] + tok("\\nThought:")
    thought = greedy, thought_tokens[h] tokens, EOS ignored, stop "\\n"
    ctx += tok(text) of each of the top-k passages for the thought (rank order, repeats kept)

then answers with the same prompt ending in tok("\\nAnswer:") and final_tokens tokens.
`tok` is the decoder's tokenizer without special tokens (a Tokenize operation, answered
on the worker). An item is {"id", "question", "max_hops", "thought_tokens": [one per
hop], "final_tokens"} (`w3_data.questions` writes them).

Each hop's prompt begins with the last one's up to its "Thought:" ids while the context
fits the window, so a worker that keeps the sequence's KV (or its prefix cache) computes
only the new passages.
"""

from __future__ import annotations

from shoal.program import Generate, ProgramError, Retrieve, Tokenize, program


def check_item(rec: dict, where: str) -> str | None:
    """What is wrong with a w3 item, or None."""
    if not isinstance(rec.get("question"), str) or not rec["question"].strip():
        return f"{where}: a w3 item needs a non-empty \"question\" string"
    hops, thoughts, final = rec.get("max_hops"), rec.get("thought_tokens"), rec.get("final_tokens")
    if not isinstance(hops, int) or isinstance(hops, bool) or hops < 0:
        return f"{where}: max_hops must be an integer >= 0, got {hops!r}"
    if not isinstance(thoughts, list) or len(thoughts) < hops or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in thoughts):
        return f"{where}: thought_tokens must list a positive token count for each of the {hops} hops, got {thoughts!r}"
    if not isinstance(final, int) or isinstance(final, bool) or final < 1:
        return f"{where}: final_tokens must be a positive integer, got {final!r}"
    return None


@program("w3", check_item=check_item)
def w3(item: dict, k: int = 4, window: int = 1500, bos: int = 101, index: str = "default"):
    """`bos` is the id the prompt starts with (101: [CLS] of BERT's WordPiece vocabulary,
    which the benchmark's decoder uses); `window`: the context's last tokens kept."""
    why = check_item(item, f"item {item.get('id')!r}")
    if why:
        raise ProgramError(why)
    question, thought_ids, answer_ids = yield Tokenize([item["question"], "\nThought:", "\nAnswer:"])
    head = [bos] + question
    ctx: list[int] = []
    hops, generated = [], 0
    for h in range(item["max_hops"]):
        out = yield Generate(prompt_token_ids=head + ctx[-window:] + thought_ids, max_tokens=item["thought_tokens"][h],
                             temperature=0.0, ignore_eos=True, stop=["\n"])
        generated += len(out.token_ids)
        hits = yield Retrieve(query=out.text, k=k, index=index)
        for ids in (yield Tokenize([hit["text"] for hit in hits])):
            ctx += ids
        hops.append({"thought": out.text, "passages": [hit["id"] for hit in hits]})
    out = yield Generate(prompt_token_ids=head + ctx[-window:] + answer_ids, max_tokens=item["final_tokens"],
                         temperature=0.0, ignore_eos=True, stop=["\n"])
    generated += len(out.token_ids)
    return {"answer": out.text, "hops": hops, "generated_tokens": generated, "retrievals": len(hops),
            "context_tokens": len(ctx)}
