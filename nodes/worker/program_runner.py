"""The worker's coroutine runtime: every resident sequence is a program coroutine waiting
on one operation, and each operation goes to the executor of its kind.

Generate operations go to the engine, which batches them across all sequences; a
finished one resumes its coroutine, which yields its next operation or returns. Embed
and Retrieve travel the same path to executors of their own (a worker without one fails
the sequence with an error that says what is missing); Tokenize is answered on the spot
with the decoder's tokenizer. The runtime lives on the compute thread: nothing here is
shared with the IO thread.

Checkpoints: after each completed operation of a program that goes on, and every
`checkpoint_tokens` tokens inside a Generate, the runner emits the sequence's state
without KV (program, version, journal, current operation, tokens generated so far in
it, model fingerprint). A sequence admitted with such a state replays its journal and
continues the current operation from its tokens (re-prefilling them), so a worker's
death costs only what was generated since.
"""

from __future__ import annotations

import logging

import time
from collections import Counter

from shoal.coroutine import Finished, SequenceCoroutine
from shoal.program import Generate, GenerateResult, ProgramError, Tokenize, resolve_program
from shoal.protocol.coroutine_state import check_coroutine_state, coroutine_state
from shoal.protocol.sequence_state import SequenceState, StateError
from shoal.nodes.worker.step_failures import DeviceLost, FailSequence, Leave, StepFailures
from shoal.sampling import RequestError

log = logging.getLogger(__name__)


class MissingExecutor:
    """Stands where a kind of operation has no executor on this worker yet."""

    def __init__(self, kind: str, reason: str):
        self.kind, self.reason = kind, reason
        self._failed: list = []

    def submit(self, key, op) -> None:
        self._failed.append((key, ProgramError(f"sequence {key[1]!r}: this worker cannot run {self.kind} "
                                               f"operations: {self.reason}")))

    def poll(self) -> list:
        out, self._failed = self._failed, []
        return out

    def abort(self, key) -> None:
        self._failed = [(k, e) for k, e in self._failed if k != key]


def _record(sid, value) -> dict:
    """The item's result: a dict the program returned is the record (with the item's id)."""
    return {**value, "id": sid} if isinstance(value, dict) else {"id": sid, "output": value}


def _message(sid, e: Exception) -> str:
    """An error for a sequence's record: ours name the sequence already."""
    if isinstance(e, (ProgramError, RequestError, StateError)):
        return str(e)
    return f"sequence {sid!r}: {type(e).__name__}: {e}"


def _result(o) -> GenerateResult:
    """The program's view of an engine output."""
    return GenerateResult(o.text, o.token_ids, o.finish_reason, o.margins, o.draws, o.num_prompt_tokens, o.logprobs)


def error_record(sid, message: str) -> dict:
    return {"id": sid, "error": message, "finish_reason": "error"}


class ProgramRunner:
    def __init__(self, engine, executors: dict | None = None, checkpoint_tokens: int = 0,
                 counters: Counter | None = None):
        self.engine = engine
        self.checkpoint_tokens = checkpoint_tokens  # 0: only between operations
        self.counters = counters if counters is not None else Counter()
        self.checkpoints: list[tuple[str, dict]] = []  # (job_id, {"id", "state"}) to send to storage
        self._marks: dict[tuple, int] = {}  # tokens of the current Generate at its last checkpoint
        self.checkpoint_seconds = 0.0  # compute-thread time spent taking checkpoints
        self.allowed_programs: tuple[str, ...] | None = None  # user programs it may import; None: any
        self.executors = executors or {
            "embed": MissingExecutor("Embed", "it hosts no encoder"),
            "retrieve": MissingExecutor("Retrieve", "no index is reachable from it"),
        }
        self.encode_queue = None  # the worker's EncodeQueue, if it hosts an encoder
        self.coros: dict[tuple, SequenceCoroutine] = {}  # (job_id, seq_id) -> coroutine
        self.tokens: dict[tuple, int] = {}  # tokens generated so far, all operations
        # A Generate of n > 1 samples: its n engine sequences are (job_id, seq_id, j), their
        # results gathered here until all n are in.
        self.samples: dict[tuple, list] = {}
        self.step_failures = StepFailures()

    def __len__(self) -> int:
        return len(self.coros)

    def has_work(self) -> bool:
        return bool(self.coros)

    def admit(self, job_id: str, program: str, args: dict, item: dict, state: dict | None = None,
              kv: bytes | None = None) -> list:
        """Starts a sequence, or restarts it from a checkpoint or migrated `state` (with
        the KV blob of its current Generate, if shipped); returns the records of
        sequences already finished (a program that failed to start, a checkpoint that
        cannot be used)."""
        sid = item.get("id")
        key = (job_id, sid)
        if key in self.coros:  # already here (a re-sent assignment or import): runs once
            return []
        try:
            spec = resolve_program(program, self.allowed_programs)
            journal, generated = check_coroutine_state(state, sid, spec.name, spec.version, self.engine.fingerprint) \
                if state is not None else ([], None)
            args = {**args, **(item.get("args") or {})}
            co = SequenceCoroutine(spec, item, args, sid)
            co.program_ref = program  # as the job names it: how another worker finds it
            out = co.start(journal, state.get("current") if state else None)
        except Exception as e:  # whatever a program or its input does, it fails only itself
            return [(job_id, error_record(sid, _message(sid, e)), 0)]
        self.coros[key] = co
        self.tokens[key] = sum(len(e["result"].get("token_ids", ())) for e in journal
                               if e["op"]["op"] == "generate")
        if state is not None:
            self.counters["sequences.resumed"] += 1
            self.counters["tokens.restored"] += self.tokens[key]
        if generated is not None and isinstance(out, Generate) and out.n == 1:
            return self._continue_generate(key, out, generated, kv, int(state.get("kv_tokens") or 0) if kv else 0)
        return self._dispatch(key, out)

    def _continue_generate(self, key: tuple, op: Generate, generated: dict, kv: bytes | None = None,
                           kv_tokens: int = 0) -> list:
        """Continues a Generate from the tokens it had, on their shipped KV or, without
        it, by prefilling them again."""
        co = self.coros[key]
        try:
            ids = self._prompt_ids(op)
            self.engine.import_sequence(SequenceState(
                seq_id=key, prompt_token_ids=list(ids), output_token_ids=list(generated["output_token_ids"]),
                params=op.params.to_dict(), op_index=co.op_index, num_computed=kv_tokens,
                model_fingerprint=self.engine.fingerprint, margins=list(generated.get("margins", ())), kv=kv,
                sampling_id=key[1], draws=list(generated.get("draws", ())),
                logprobs=list(generated.get("logprobs", ()))))
        except Exception as e:
            return self._fail(key, _message(key[1], e))
        n = len(generated["output_token_ids"])
        self._marks[key] = n  # (reported with the operation's tokens when it finishes)
        self.counters["tokens.restored"] += n
        return []

    def _dispatch(self, key: tuple, out) -> list:
        """Sends the next operation to its executor, or emits the finished record."""
        job_id, sid = key
        self._marks.pop(key, None)
        while isinstance(out, Tokenize):  # answered here and now: no model call to batch
            try:
                out = self.coros[key].advance(self._tokenize(out.texts))
            except Exception as e:
                return self._fail(key, _message(sid, e))
        if isinstance(out, Finished):
            self.coros.pop(key)
            return [(job_id, _record(sid, out.value), self.tokens.pop(key, 0))]
        if isinstance(out, Generate):
            try:
                # A text prompt the engine tokenizes itself; a chat is rendered here.
                ids = out.prompt_token_ids if out.messages is None else self.engine.tokenizer.encode_chat(out.messages)
                if out.n > 1:
                    self._add_samples(key, out, ids)
                else:
                    self.engine.add_request(key, prompt=out.prompt, prompt_token_ids=ids,
                                            params=out.params, op_index=self.coros[key].op_index, sampling_id=sid,
                                            under_way=self.tokens.get(key, 0) > 0)
            except Exception as e:  # bad parameters (wrong types too) fail this sequence only
                self._abort_samples(key)
                return self._fail(key, _message(sid, e))
            return []
        try:
            self.executors[out.kind].submit(key, out)
        except Exception as e:  # an executor's bug or a malformed operation fails this sequence only
            return self._fail(key, _message(sid, e))
        return []

    def _add_samples(self, key: tuple, op: Generate, ids: list[int] | None) -> None:
        """The n samples of one Generate: sample j draws as a single request with seed
        seed + j would (same item, same operation index); samples after the first wait
        until the first has prefilled the prompt, then read its blocks from the prefix
        cache. A move or a drain restarts the samples where they land: they are
        deterministic, so only their compute is lost."""
        from dataclasses import replace

        self.samples[key] = [None] * op.n
        for j in range(op.n):
            self.engine.add_request((*key, j), prompt=op.prompt, prompt_token_ids=ids,
                                    params=replace(op.params, seed=op.params.seed + j),
                                    op_index=self.coros[key].op_index, sampling_id=key[1],
                                    under_way=self.tokens.get(key, 0) > 0,
                                    prefill_after=(*key, 0) if j else None)

    def _sample_done(self, o) -> list:
        """One sample of an n > 1 Generate finished: the operation resumes when all have."""
        key, j = o.seq_id[:2], o.seq_id[2]
        got = self.samples.get(key)
        if got is None:  # aborted meanwhile
            return []
        got[j] = _result(o)
        self.tokens[key] = self.tokens.get(key, 0) + len(o.token_ids)
        if any(r is None for r in got):
            return []
        del self.samples[key]
        return self._resume(key, got)

    def _abort_samples(self, key: tuple) -> None:
        for j in range(len(self.samples.pop(key, ()))):
            self.engine.abort((*key, j))

    def _prompt_ids(self, op: Generate) -> list[int]:
        if op.prompt_token_ids is not None:
            return op.prompt_token_ids
        if op.messages is not None:
            return self.engine.tokenizer.encode_chat(op.messages)
        return self.engine.tokenizer.encode(op.prompt)

    def _tokenize(self, texts: tuple) -> list[list[int]]:
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if bad:
            raise RequestError(f"Tokenize takes texts; item {bad[0]} is a {type(texts[bad[0]]).__name__}")
        tokenizer = getattr(self.engine, "tokenizer", None)
        if tokenizer is None:
            raise ProgramError("Tokenize needs the decoder's tokenizer: this worker hosts no decoder")
        self.counters["tokenize.texts"] += len(texts)
        return [tokenizer.encode(t) for t in texts]

    def _fail(self, key: tuple, message: str) -> list:
        self._abort_samples(key)
        self.coros.pop(key, None)
        self.tokens.pop(key, None)
        self._marks.pop(key, None)
        return [(key[0], error_record(key[1], message), 0)]

    def _resume(self, key: tuple, result) -> list:
        co = self.coros.get(key)
        if co is None:  # aborted while its operation ran
            return []
        try:
            out = co.advance(result)
        except Exception as e:
            return self._fail(key, _message(key[1], e))
        if not isinstance(out, Finished):
            self._checkpoint(key)
        return self._dispatch(key, out)

    def _checkpoint(self, key: tuple, generated: dict | None = None) -> None:
        co = self.coros[key]
        state = coroutine_state(co.spec.name, co.spec.version, co.journal, co.current, self.engine.fingerprint, generated)
        self.checkpoints.append((key[0], {"id": key[1], "state": state}))
        self.counters["checkpoints"] += 1

    def _checkpoint_long_generations(self) -> None:
        for key, seq in self.engine.seqs.items():
            n = len(seq.output_token_ids)
            if n - self._marks.get(key, 0) >= self.checkpoint_tokens and key in self.coros:
                self._marks[key] = n
                self._checkpoint(key, {"output_token_ids": list(seq.output_token_ids), "margins": list(seq.margins),
                                       "draws": list(seq.draws), "logprobs": list(seq.logprobs)})

    def step(self, idle_wait: bool = True) -> list:
        """One engine step, then whatever other executors finished. Returns
        (job_id, record, tokens) for every sequence whose program ended. With
        `idle_wait` and nothing to run, it blocks briefly on an executor; a loop with
        other work (SuperBatches) passes False."""
        done = []
        stepped = self.engine.has_unfinished()
        if stepped:
            failure = None
            try:
                outputs = self.engine.step()
                self.engine.step_cap = self.step_failures.succeeded()
            except DeviceLost:
                raise
            except Exception as e:  # the engine recovered its state; what was read is kept
                outputs, failure = self.engine.take_finished(), e
            for o in outputs:
                if len(o.seq_id) == 3:
                    done += self._sample_done(o)
                    continue
                self.tokens[o.seq_id] = self.tokens.get(o.seq_id, 0) + len(o.token_ids)
                done += self._resume(o.seq_id, _result(o))
            if failure is not None:
                try:
                    done += self._step_failed(failure)
                except DeviceLost as e:
                    e.finished = done + e.finished
                    raise
            if self.checkpoint_tokens:
                t = time.perf_counter()
                self._checkpoint_long_generations()
                self.checkpoint_seconds += time.perf_counter() - t
        if self.encode_queue is not None:
            try:
                self.encode_queue.run()  # Embed texts and Retrieve queries, beside the step just taken
            except DeviceLost as e:  # (what ended before is delivered still)
                e.finished = done + e.finished
                raise
        polled = 0
        for ex in self.executors.values():
            for key, result in ex.poll():
                polled += 1
                done += self._fail(key, _message(key[1], result)) if isinstance(result, Exception) \
                    else self._resume(key, result)
        if idle_wait and not stepped and not polled and self.coros and not self.engine.has_unfinished():
            # Every sequence waits on another executor: block on one briefly instead of
            # spinning a core (new assignments wait at most this long). Not after a step
            # that ran: what it finished may have emptied the engine while the inbox
            # holds the next assignment (a 20 ms wait per step starved one-token jobs).
            for ex in self.executors.values():
                if hasattr(ex, "wait"):
                    ex.wait(0.02)
                    break
        return done

    def _step_failed(self, e: Exception) -> list:
        """An engine step raised: step again with fewer sequences, end the one at fault
        once it is found, or leave if the device is lost (`step_failures.py`)."""
        rows = self.engine.failed_rows
        self.counters["errors.step"] += 1
        verdict = self.step_failures.failed(rows, e)
        if isinstance(verdict, Leave):
            raise DeviceLost(verdict.message) from e
        out = []
        for sid, why in self.engine.unrecoverable:  # (rare: its state could not be put back)
            if sid[:2] not in self.coros:
                continue  # (another of its samples ended it already)
            self.counters["sequences.failed_by_step"] += 1
            self.engine.abort(sid)
            out += self._fail(sid[:2], f"sequence {sid[1]!r}: after a failed step ({type(e).__name__}: {e}), {why}")
        # The first failure of a streak with its traceback; the rest in a line each.
        log.error("[step] failed holding %d sequences: %s: %s; at most %s per step now", len(rows),
                  type(e).__name__, e, self.step_failures.cap, exc_info=self.step_failures.streak == 1)
        self.engine.step_cap = self.step_failures.cap
        if not isinstance(verdict, FailSequence) or verdict.seq_id not in self.engine.seqs:
            return out
        sid, key = verdict.seq_id, verdict.seq_id[:2]  # (a sample's id is its program's key and j)
        self.counters["sequences.failed_by_step"] += 1
        log.error("[step] %s ended with an error: %s", sid, verdict.message)
        self.engine.abort(sid)
        return out + self._fail(key, f"sequence {key[1]!r}: {verdict.message}")

    def describe(self, key: tuple) -> tuple[str, dict, dict]:
        """(program as the job names it, arguments, item) of a resident sequence."""
        co = self.coros[key]
        return co.program_ref, co.args, co.item

    def movable(self, job_id: str, count: int) -> list[tuple]:
        """Up to `count` (all if < 0) of a job's sequences, cheapest to move first:
        those not in the engine (waiting on another operation), then by tokens held."""
        def cost(key):
            if key in self.samples:  # n samples under way: moving restarts them all
                return (2, 0)
            seq = self.engine.seqs.get(key)
            return (0, 0) if seq is None else (1, seq.num_tokens if seq.num_computed else 0)

        keys = sorted((k for k in self.coros if k[0] == job_id), key=cost)
        return keys if count < 0 else keys[:count]

    def export(self, key: tuple, with_kv: bool = True) -> tuple[dict, bytes | None]:
        """Suspends a sequence and takes it out of this runtime: its state (as a
        checkpoint, plus `kv_tokens`) and, mid-Generate, its KV blob in the canonical
        layout. Its Generate's tokens so far travel in the state; an Embed or Retrieve it
        waited on is asked again where it lands."""
        co = self.coros[key]
        state = coroutine_state(co.spec.name, co.spec.version, co.journal, co.current, self.engine.fingerprint)
        kv = None
        if key in self.engine.seqs:
            st = self.engine.export_sequence(key, remove=True)
            state["generated"] = {"output_token_ids": st.output_token_ids, "margins": st.margins, "draws": st.draws,
                                  "logprobs": st.logprobs}
            if with_kv and st.kv is not None:
                kv, state["kv_tokens"] = st.kv, st.num_computed
        self.abort(key)
        return state, kv

    def abort(self, key: tuple) -> None:
        self._abort_samples(key)
        self.coros.pop(key, None)
        self.tokens.pop(key, None)
        self._marks.pop(key, None)
        self.engine.abort(key)
        for ex in self.executors.values():
            ex.abort(key)

    def drop_all(self) -> int:
        n = len(self.coros)
        for key in list(self.coros):
            self.abort(key)
        return n

    def run(self, job_id: str, program: str, items: list[dict], args: dict | None = None) -> list[dict]:
        """Runs a program over items in this process, to the end: the records in item
        order. What a cluster job must equal."""
        out = {}
        for item in items:
            for _, rec, _ in self.admit(job_id, program, args or {}, item):
                out[rec["id"]] = rec
        while self.has_work():
            for _, rec, _ in self.step():
                out[rec["id"]] = rec
        return [out[it["id"]] for it in items]
