"""The built-in `ircot` program: IRCoT (Trivedi et al., 2023), retrieval interleaved with
chain-of-thought, one sentence of thought per hop.

    hop 1: retrieve top-k for the question; generate one thought
    hop h: retrieve top-k for the previous thought; new passages join the context;
           generate the next thought
    stop:  a thought containing the answer marker, or `max_hops` hops

The context only grows (question, then passages and thoughts appended in order), so
each hop's prompt starts with the previous one and prefix caching reuses its KV.
An item is {"id", "question"} and may set its own "max_hops" and "thought_tokens"
(one number, or one per hop): a random-weight model never writes the marker, so tests
and benchmarks fix the shape of each item's work this way.
"""

from __future__ import annotations

from shoal.program import Generate, ProgramError, Retrieve, program

ANSWER_MARKER = "So the answer is"
INSTRUCTION = "Answer the question by reasoning step by step over the passages, one sentence at a time.\n"


def check_item(rec: dict, where: str) -> str | None:
    """What is wrong with an ircot item, or None (checked when the job is submitted)."""
    q = rec.get("question")
    if not isinstance(q, str) or not q.strip():
        return f"{where}: an ircot item needs a non-empty \"question\" string"
    hops = rec.get("max_hops")
    if hops is not None and (not isinstance(hops, int) or isinstance(hops, bool) or hops < 1):
        return f"{where}: max_hops must be a positive integer, got {hops!r}"
    t = rec.get("thought_tokens")
    lengths = t if isinstance(t, list) else [t] if t is not None else []
    if t is not None and (not lengths or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths)):
        return f"{where}: thought_tokens must be a positive integer or a list of them, got {t!r}"
    return None


def _thought_tokens(lengths, hop: int) -> int:
    return lengths[min(hop, len(lengths) - 1)] if isinstance(lengths, list) else lengths


@program("ircot", check_item=check_item)
def ircot(item: dict, max_hops: int = 3, k: int = 4, thought_tokens: int = 32, index: str = "default",
          marker: str = ANSWER_MARKER, passage_chars: int = 300, max_context_chars: int = 3000, stop=("\n", ". "),
          ignore_eos: bool = False, trace: bool = False):
    """Passages join the context while it stays under `max_context_chars` (keep it
    within the model's context: about 2 characters a token for the test models'
    tokenizer, 4 for real ones); each hop still records every passage it retrieved.
    `trace` adds each hop's scores, token ids and margins: what tests compare with
    `shoal.output_compare.compare_rag`."""
    question = item.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ProgramError(f"item {item.get('id')!r} has no question")
    hops = int(item.get("max_hops", max_hops))
    lengths = item.get("thought_tokens", thought_tokens)
    context = f"{INSTRUCTION}Question: {question.strip()}\n"
    seen: set = set()
    record, query, answer = [], question, None
    for hop in range(hops):
        hits = yield Retrieve(query=query, k=k, index=index)
        for h in hits:
            line = f"Passage [{h['id']}]: {' '.join(h['text'].split())[:passage_chars]}\n"
            if h["id"] not in seen and len(context) + len(line) <= max_context_chars:
                seen.add(h["id"])
                context += line
        context += "Thought:"
        out = yield Generate(prompt=context, max_tokens=_thought_tokens(lengths, hop), stop=list(stop),
                             temperature=0.0, ignore_eos=ignore_eos, return_margins=trace)
        context += out.text + "\n"
        thought = out.text.strip()
        record.append({"query": query, "passages": [h["id"] for h in hits], "thought": thought})
        if trace:
            record[-1].update(scores=[h["score"] for h in hits], token_ids=out.token_ids, margins=out.margins)
        if marker in thought:
            answer = thought.split(marker, 1)[1].strip(" :.")
            break
        query = thought or question  # an empty thought asks the question again
    return {"question": question, "answer": answer if answer is not None else record[-1]["thought"],
            "answered": answer is not None, "hops": record}
