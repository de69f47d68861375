"""Compiled grammars for one tokenizer, and the token masks of a step's constrained rows.

A constraint compiles once per engine (the tokenizer is the engine's): the cache keeps
a matcher in its start state per distinct constraint, and each sequence gets a copy of
it. A matcher is rebuilt from the sequence's generated tokens wherever the sequence
resumes (imported after a move, a drain or a checkpoint), so a constrained sequence
carries no grammar state of its own on the wire: its tokens are its state.

Masks are filled by llguidance's executor (Rust threads, the GIL released) on a thread
of the cache's own, started before the step's forward pass and joined after it, so the
grammar's work runs beside the model rather than after it.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from shoal.constraint import Constraint, ConstraintError

log = logging.getLogger(__name__)


class GrammarCache:
    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_token_ids: list[int], capacity: int = 256):
        self.tokenizer_json, self.vocab_size, self.eos = Path(tokenizer_json), vocab_size, list(eos_token_ids)
        self.capacity = capacity
        self._tokenizer = None  # built on the first constrained sequence: most jobs have none
        self._executor = None
        self._thread: ThreadPoolExecutor | None = None
        self._compiled: OrderedDict[str, object] = OrderedDict()
        self.hits = self.misses = 0
        self.compile_seconds = 0.0
        self.fill_seconds = 0.0  # filling masks, on the cache's thread (beside the model)

    @property
    def words(self) -> int:
        """int32 words of one row's bitmask."""
        return (self.vocab_size + 31) // 32

    def _llg(self):
        if self._tokenizer is None:
            import llguidance

            t0 = time.perf_counter()
            self._tokenizer = llguidance.LLTokenizer(self.tokenizer_json.read_text(), n_vocab=self.vocab_size,
                                                     eos_token=self.eos or None)
            self._executor = llguidance.LLExecutor()
            log.info("[grammar] tokenizer of %d tokens read for constrained decoding in %.2fs",
                     self.vocab_size, time.perf_counter() - t0)
        return self._tokenizer

    def matcher(self, constraint: Constraint, tokens: list[int] = ()):
        """A matcher in the state after `tokens` (the sequence's generated ones). Raises
        ConstraintError if the grammar does not compile or the tokens do not follow it."""
        import llguidance

        start = self._compiled.get(constraint.key)
        if start is None:
            self.misses += 1
            t0 = time.perf_counter()
            start = llguidance.LLMatcher(self._llg(), constraint.grammar(), log_level=0)
            self.compile_seconds += time.perf_counter() - t0
            if start.is_error():
                raise ConstraintError(f"{constraint.kind} does not compile: {start.get_error()}")
            self._compiled[constraint.key] = start
            if len(self._compiled) > self.capacity:
                self._compiled.popitem(last=False)
        else:
            self.hits += 1
            self._compiled.move_to_end(constraint.key)
        m = start.deep_copy()
        if tokens and not m.consume_tokens(list(tokens)):
            raise ConstraintError(f"the generated tokens do not follow the {constraint.kind} "
                                  f"constraint: {m.get_error()}")
        return m

    def fill(self, matchers: list) -> np.ndarray:
        """The next-token bitmasks of the matchers, [len, words] int32 (bit t of a row set
        when token t is allowed)."""
        from llguidance.numpy import fill_next_token_bitmask_par

        t0 = time.perf_counter()
        mask = np.zeros((len(matchers), self.words), dtype=np.int32)
        if matchers:
            fill_next_token_bitmask_par(self._executor, [(m, i) for i, m in enumerate(matchers)], mask)
        self.fill_seconds += time.perf_counter() - t0
        return mask

    def fill_async(self, matchers: list) -> Future:
        """`fill` on the cache's thread: what a step starts before its forward pass."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        return self._thread.submit(self.fill, matchers)

    def stats(self) -> dict:
        return {"grammars": len(self._compiled), "hits": self.hits, "misses": self.misses,
                "compile_seconds": round(self.compile_seconds, 4), "fill_seconds": round(self.fill_seconds, 4)}
