"""The state of a sequence coroutine as it travels: in checkpoints on storage and in
migrations between workers.

    {"program": name, "version": v,
     "journal": [{"op": {...}, "result": {...}}, ...],   # completed operations
     "current": {...} | None,                            # the operation under way
     "generated": {"output_token_ids": [...], "margins": [...], "draws": [...]} | None,  # its tokens so far
     "fingerprint": "model", "kv_tokens": n}             # KV blob rows, if one travels beside it

The item and the job's arguments are not in it (storage and the scheduler have them);
the KV blob travels beside it in the canonical layout (`sequence_state.py`), never in
it. A resumed sequence replays its journal and must arrive at `current`.
"""

from __future__ import annotations

from shoal.protocol.sequence_state import StateError


def coroutine_state(program: str, version: str, journal: list, current: dict | None, fingerprint: str,
                    generated: dict | None = None, kv_tokens: int = 0) -> dict:
    return {"program": program, "version": version, "journal": list(journal), "current": current,
            "generated": generated, "fingerprint": fingerprint, "kv_tokens": kv_tokens}


def progress(state: dict) -> tuple[int, int]:
    """How far a sequence got: operations done, tokens of the current one. Checkpoints
    only move forward by this order."""
    return len(state.get("journal", ())), len((state.get("generated") or {}).get("output_token_ids", ()))


def check_coroutine_state(state, seq_id, program: str, version: str, fingerprint: str) -> tuple[list, dict | None]:
    """The journal and in-operation progress of a state that this worker can continue;
    a StateError naming the sequence if it cannot."""
    where = f"sequence {seq_id!r}: state"
    if not isinstance(state, dict) or not isinstance(state.get("journal"), list):
        raise StateError(f"{where} is truncated or malformed (no journal)")
    if state.get("program") != program or state.get("version") != version:
        raise StateError(f"{where} was recorded by program {state.get('program')!r} version "
                         f"{state.get('version')!r}; this job runs {program!r} version {version!r}")
    if state.get("fingerprint") != fingerprint:
        raise StateError(f"{where} is from model {state.get('fingerprint')!r}; this worker runs {fingerprint!r}")
    if any(not isinstance(e, dict) or "op" not in e or "result" not in e for e in state["journal"]):
        raise StateError(f"{where} is truncated or malformed (a journal entry lacks its op or result)")
    generated = state.get("generated")
    if generated is not None:
        ids = generated.get("output_token_ids") if isinstance(generated, dict) else None
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise StateError(f"{where} is truncated or malformed (generated tokens)")
    kv_tokens = state.get("kv_tokens", 0)
    if not isinstance(kv_tokens, int) or kv_tokens < 0:
        raise StateError(f"{where} is malformed (kv_tokens {kv_tokens!r})")
    return state["journal"], generated
