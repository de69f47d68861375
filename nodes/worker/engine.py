"""The worker's LLM engine: continuous batching over a paged KV cache.

A step is: plan (a `scheduler/` policy picks chunks under a token budget and the free
KV blocks), apply the plan to the block manager, run the model once over the flat batch,
then sample and retire finished sequences.
"""

from __future__ import annotations

import bisect
import logging
import time
from pathlib import Path

import torch

from shoal.constraint import ConstraintError
from shoal.nodes.process_memory import heap_frozen_while
from shoal.nodes.worker import logits_processing as lp
from shoal.nodes.worker.device_copy import to_device
from shoal.nodes.worker.engine_config import EngineConfig, EngineStats, RequestOutput
from shoal.nodes.worker.grammar_cache import GrammarCache
from shoal.nodes.worker.host_kv_pool import HostKVPool
from shoal.nodes.worker.kv_blob import decode_kv, encode_kv
from shoal.nodes.worker.model_runner import ModelRunner
from shoal.nodes.worker.models.row_buckets import rows_pad_free
from shoal.nodes.worker.pending_tokens import PendingTokens, logprob_entry
from shoal.nodes.worker.sampler import draws_of
from shoal.nodes.worker.sampling_launch import launch_sampling
from shoal.nodes.worker.sequence import SeqStatus, Sequence
from shoal.nodes.worker.step_buffers import keep_step_buffers
from shoal.nodes.worker.step_clock import StepClock
from shoal.nodes.worker.tokenizer import TextTokenizer
from shoal.protocol.sequence_state import SequenceState, StateError
from shoal.sampling import RequestError, SamplingParams
from shoal.scheduler.step_planner import MixedBatchPlanner, PlannerConfig, SeqView

log = logging.getLogger(__name__)

_INT_TYPES = {int, bool}  # what isinstance(t, int) takes among a prompt's token ids


def queue_order(seq: Sequence) -> tuple:
    """Where a sequence waits: programs under way first, then by arrival."""
    return (not seq.under_way, seq.arrival)


class LLMEngine:
    def __init__(self, model_dir: str | Path, config: EngineConfig = EngineConfig(), planner=None, cost_model=None):
        from shoal.nodes.worker.cpu_threads import cores_owned

        threads, why = (config.num_threads, "set by the user") if config.num_threads else cores_owned()
        torch.set_num_threads(threads)
        self.threads = threads
        log.info("[engine] %d torch threads (%s)", threads, why)
        from shoal.nodes.worker.engine_setup import set_up

        setup = self.setup = set_up(model_dir, config)
        self.config, self.device = setup.config, torch.device(setup.device.name)
        self.dtype_choice, self.kv_dtype_choice = setup.dtype_choice, setup.kv_dtype_choice
        self.model, self.fingerprint, self.streamer = setup.model, setup.fingerprint, setup.streamer
        self.packed_linears, self.model_cfg = setup.packed_linears, setup.model.cfg
        self.blocks, self.cache, self.kv_cache_reason = setup.blocks, setup.cache, setup.kv_cache_reason
        self.budget_reason, auto_budget = setup.budget_reason, setup.auto_budget
        config = self.config
        self.tokenizer = TextTokenizer(model_dir)
        self.grammars = GrammarCache(Path(model_dir) / "tokenizer.json", self.model_cfg.vocab_size,
                                     list(self.model_cfg.eos_token_ids))
        self.runner = ModelRunner(self.model, self.cache, setup.ops, sdpa_prefill_work=config.sdpa_prefill_work,
                                  graphs=setup.graphs)
        self.clock = StepClock(self.device)
        self.model.pad_rows = config.pad_rows if config.pad_rows is not None else (
            self.packed_linears > 0 and rows_pad_free(config.dtype))
        if self.model.pad_rows and setup.ops is not None:
            log.info("[matmul] step rows rounded up to a few sizes (oneDNN compiles each size once; free on AMX)")
        if self.runner.sdpa_prefill_work:
            log.info("[attention] prefill chunks of %d+ rows x context through SDPA, the rest in the native kernel",
                     self.runner.sdpa_prefill_work)
        # From here on, freed step tensors stay in malloc's heap (after loading: what the
        # load freed goes back to the kernel).
        keep_step_buffers()
        self.planner = MixedBatchPlanner(self.planner_config())
        self.seqs: dict[object, Sequence] = {}
        self.running: list[Sequence] = []  # admission order
        self.waiting: list[Sequence] = []  # in queue_order
        # Fault injection for tests (`SHOAL_FAULTS` park_at): sampling id -> tokens after
        # which a sequence is set aside (kept with its KV, never scheduled) until it is
        # exported or aborted. An imported sequence is parked only at a later position.
        self.park_at: dict = {}
        self.parked: dict[object, Sequence] = {}
        self._arrivals = 0
        # Async scheduling (`pending_tokens.py`): the next step is launched before this
        # one's tokens are read. On a GPU by default: there the host's work hides behind
        # the device's; a CPU computes the step before the host goes on, so nothing hides.
        self.async_scheduling = (config.async_scheduling if config.async_scheduling is not None
                                 else self.device.type == "cuda")
        self._in_flight: PendingTokens | None = None  # the last step's tokens, not read yet
        self._reading: PendingTokens | None = None  # those being read
        self._read_tokens: list = []  # what the read in progress added (`_recover` takes it back)
        self._read_figures: list = []
        self.unrecoverable: list = []  # (sequence id, why) after the last failed step (`_recover`)
        # Finished sequences' outputs, until a step returns them (or, after a step that
        # failed, `take_finished`): what a failed step had read is not lost with it.
        self._outbox: list[RequestOutput] = []
        # At most this many sequences run in a step (None: `max_num_seqs`), set by the
        # worker's answer to failing steps (`step_failures.py`).
        self.step_cap: int | None = None
        self.failed_rows: list = []  # the sequences the last failed step held (`_recover`)
        if self.async_scheduling:
            log.info("[engine] async scheduling: each step is launched before the last one's tokens are read")
        self.stats = EngineStats()
        # Tests and benchmarks may watch every sampling step's logits: fn(seq_ids, logits).
        self.on_logits = None
        self.cost_model = None
        # Host memory for the KV of preempted sequences (`offload_bytes`), allocated once.
        self.host_pool = HostKVPool(self.cache, config.offload_bytes) if config.offload_bytes else None
        self.policy_fallback: str | None = None  # why EB/EB+ was refused, if it was
        if planner is not None:
            self.planner = planner
        elif config.policy != "mb":
            from shoal.nodes.worker.policy import build_planner

            self.planner = build_planner(self, config.policy, cost_model)
        self.fetch_sizing: str | None = None  # how weight streaming sized the steps, if it did
        if planner is None:
            from shoal.nodes.worker.step_sizing import size_steps

            size_steps(self, cost_model, auto_budget)
        log.info("[engine] step budget %d tokens (%s)", self.config.max_num_batched_tokens, self.budget_reason)

    @property
    def max_total_tokens(self) -> int:
        """A sequence ends ("length") at the model's context or at what the whole KV
        cache holds, whichever is less: alone, it always fits."""
        return min(self.model_cfg.max_position_embeddings, self.blocks.num_blocks * self.config.block_size)

    def planner_config(self) -> PlannerConfig:
        c = self.config
        return PlannerConfig(block_size=c.block_size, max_num_batched_tokens=c.max_num_batched_tokens,
                             max_num_seqs=c.max_num_seqs, chunked_prefill=c.chunked_prefill,
                             num_blocks=self.blocks.num_blocks)

    def reset_stats(self) -> None:
        self.stats = EngineStats()

    def stats_snapshot(self) -> dict:
        """Counters, KV use and the planner's state (mode, θ̂, k̂, N̂, both sides of the
        EB+ condition): what a worker reports and `shoal nodes` shows."""
        from dataclasses import asdict

        return {**asdict(self.stats), "running": len(self.running), "waiting": len(self.waiting),
                "kv_blocks_used": self.blocks.num_used, "kv_blocks_total": self.blocks.num_blocks,
                "kv_cache_bytes": self.cache.nbytes, "kv_cache_reason": self.kv_cache_reason,
                "kv_cache_dtype": self.config.kv_cache_dtype, "kv_cache_dtype_reason": self.kv_dtype_choice.reason,
                "grammars": self.grammars.stats(),
                "offloaded": sum(1 for s in self.waiting if s.host_kv is not None),
                "offloaded_bytes": self.offloaded_bytes,
                "planner": self.planner.stats(), "policy_fallback": self.policy_fallback,
                "dtype": self.config.dtype, "dtype_reason": self.dtype_choice.reason,
                "budget": self.config.max_num_batched_tokens, "budget_reason": self.budget_reason,
                "step_cap": self.step_cap,
                "threads": self.threads,
                "device": self.config.device, "device_label": self.setup.device_label,
                "device_reason": self.setup.device.reason,
                "attention": self.runner.ops.name if self.runner.ops is not None else "sdpa",
                "attention_reason": self.setup.ops_reason, "graphs": self.setup.graphs_reason,
                "pad_rows": self.model.pad_rows, "async_scheduling": self.async_scheduling,
                "packed_linears": self.packed_linears,
                "weight_streaming": {**self.streamer.summary(), "sizing": self.fetch_sizing} if self.streamer else None}

    # -- requests --------------------------------------------------------------------

    def add_request(self, seq_id, prompt: str | None = None, prompt_token_ids: list[int] | None = None,
                    params: SamplingParams = SamplingParams(), op_index: int = 0, sampling_id=None,
                    under_way: bool = False, prefill_after=None) -> None:
        """Queues a sequence. Raises RequestError, naming the sequence, for bad input;
        the engine's other sequences are unaffected. `under_way`: the next generation of
        a program that has generated before; it waits ahead of programs not yet started
        (it finishes a program sooner, and its cached prefix is not left to be evicted).
        `prefill_after`: the id of a sequence with the same prompt (another sample of it);
        this one waits until that one has prefilled, then reads the prompt's blocks from
        the prefix cache instead of computing them again."""
        if seq_id in self.seqs:
            raise RequestError(f"sequence {seq_id!r}: already in the engine")
        try:
            params.validate()
        except RequestError as e:
            raise RequestError(f"sequence {seq_id!r}: {e}") from None
        if prompt_token_ids is None:
            if prompt is None:
                raise RequestError(f"sequence {seq_id!r}: give a prompt or prompt_token_ids")
            prompt_token_ids = self.tokenizer.encode(prompt)
        ids = list(prompt_token_ids)
        self._check_prompt(seq_id, ids)
        seq = Sequence(seq_id, ids, params, op_index=op_index, max_total_tokens=self.max_total_tokens,
                       sampling_id=sampling_id, under_way=under_way)
        if prefill_after is not None and self.config.prefix_caching:
            seq.prefill_after = self.seqs.get(prefill_after)
        self._prepare_output_rules(seq)
        self._enqueue(seq)
        self._park_if_asked(seq)

    def _park_if_asked(self, seq: Sequence) -> None:
        if self.park_at and self.park_at.get(seq.key_id) == len(seq.output_token_ids):
            (self.running if seq.status == SeqStatus.RUNNING else self.waiting).remove(seq)
            self.parked[seq.seq_id] = seq
            log.info("[park] %s set aside at token %d", seq.seq_id, len(seq.output_token_ids))

    def _check_prompt(self, seq_id, ids: list[int]) -> None:
        cfg = self.model_cfg
        if not ids:
            raise RequestError(f"sequence {seq_id!r}: empty prompt")
        # The common case in C (a per-token Python check was 4% of a worker's time on short prompts).
        fine = set(map(type, ids)) <= _INT_TYPES and min(ids) >= 0 and max(ids) < cfg.vocab_size
        bad = None if fine else next((t for t in ids if not isinstance(t, int) or not 0 <= t < cfg.vocab_size), None)
        if bad is not None:
            raise RequestError(f"sequence {seq_id!r}: token id {bad!r} outside the vocabulary [0, {cfg.vocab_size})")
        if len(ids) >= cfg.max_position_embeddings:
            raise RequestError(f"sequence {seq_id!r}: prompt of {len(ids)} tokens does not fit the model's context of {cfg.max_position_embeddings}")
        if len(ids) >= self.max_total_tokens:
            raise RequestError(f"sequence {seq_id!r}: prompt of {len(ids)} tokens needs more KV blocks than the cache has ({self.blocks.num_blocks})")

    def _prepare_output_rules(self, seq: Sequence) -> None:
        """Refuses token ids the vocabulary lacks (logit_bias, stop_token_ids) and gives a
        constrained sequence its matcher, in the state after the tokens it generated."""
        p = seq.params
        if not (p.logit_bias or p.stop_token_ids) and p.json_schema is None and p.regex is None and p.choice is None:
            return  # (most sequences: nothing to check or build)
        vocab = self.model_cfg.vocab_size
        bad = next((t for t, _ in p.logit_bias if t >= vocab), None)
        if bad is None:
            bad = next((t for t in p.stop_token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"sequence {seq.seq_id!r}: token id {bad} outside the vocabulary [0, {vocab})")
        try:
            constraint = p.constraint
            if constraint is not None:
                seq.matcher = self.grammars.matcher(constraint, seq.output_token_ids)
        except ConstraintError as e:
            raise RequestError(f"sequence {seq.seq_id!r}: {e}") from None

    def _enqueue(self, seq: Sequence) -> None:
        p = seq.params
        seq.needs_last_token = seq.matcher is not None or p.penalized
        seq.arrival = self._arrivals
        self._arrivals += 1
        self.seqs[seq.seq_id] = seq
        bisect.insort(self.waiting, seq, key=queue_order)

    def abort(self, seq_id) -> None:
        seq = self.seqs.pop(seq_id, None)
        if seq is None:
            return
        self._drop(seq)

    def _drop(self, seq: Sequence) -> None:
        if self.parked.pop(seq.seq_id, None) is not None:
            self.blocks.release(seq.block_table)
        elif seq.status == SeqStatus.RUNNING:
            self.running.remove(seq)
            self.blocks.release(seq.block_table)
        elif seq.status == SeqStatus.WAITING:
            self.waiting.remove(seq)
        self._forget_host_kv(seq)
        seq.block_table = []
        seq.status = SeqStatus.FINISHED

    def has_unfinished(self) -> bool:
        return bool(self.running or self.waiting or self._in_flight is not None or self._outbox)

    def take_finished(self) -> list[RequestOutput]:
        """The outputs of sequences finished and not returned yet."""
        out, self._outbox = self._outbox, []
        return out

    # -- the step --------------------------------------------------------------------

    last_step_work: tuple[int, int] = (0, 0)

    def step(self) -> list[RequestOutput]:
        """One step; returns the outputs of the sequences it finished. A step that raises
        leaves the engine able to step again: see `_recover`."""
        try:
            self._step()
        except Exception:
            self._recover()
            raise
        return self.take_finished()

    def _step(self) -> None:
        t0 = time.perf_counter()
        plan, cached = self._plan()
        chunks = self._apply(plan, cached)
        t1 = time.perf_counter()
        self.stats.time_plan += t1 - t0
        # The last step's tokens, if not read yet. They stay in `_in_flight` until read: a
        # step that fails before leaves them to the next.
        in_flight = self._in_flight
        if not chunks:
            if in_flight is not None:
                self._read_in_flight()
                return
            if self.waiting and not self.running and not plan.preempted:
                # Nothing runs and nothing can be admitted: looping would spin forever.
                raise RuntimeError(f"engine stalled: {len(self.waiting)} waiting sequences, none admissible "
                                   f"with {self.blocks.num_free} free KV blocks")
            return
        sample_mask = [seq.num_computed + n == seq.num_tokens for seq, n in chunks]
        sampled = [seq for (seq, _), s in zip(chunks, sample_mask) if s]
        ahead = self.async_scheduling and self.on_logits is None and not self.park_at
        # Rows whose sampling needs the last token (grammars, penalties) sample after the
        # read, which then waits for the last step while this one's model is queued.
        read_first = in_flight is not None and any(seq.needs_last_token for seq in sampled)
        if in_flight is not None and not ahead:
            # This step's sampling needs its sequences' tokens on the host: read them first,
            # and drop the chunks of sequences they ended.
            self._read_in_flight()
            in_flight = None
            if any(seq.status != SeqStatus.RUNNING for seq, _ in chunks):
                kept = [i for i, (seq, _) in enumerate(chunks) if seq.status == SeqStatus.RUNNING]
                chunks, sample_mask = [chunks[i] for i in kept], [sample_mask[i] for i in kept]
                if not chunks:
                    return
        # The grammar masks of the rows about to sample depend only on tokens already
        # generated: they are filled on another thread while the model runs (after the
        # read, where a token is in flight).
        masks = None if in_flight is not None else self._fill_masks([seq for seq in sampled if seq.status == SeqStatus.RUNNING])
        self.clock.start()
        logits, logit_chunks = self.runner.run(chunks, sample_mask, carry=in_flight)
        self.clock.model_done()
        prefill = 0
        for seq, n in chunks:
            left = len(seq.prompt_token_ids) - seq.num_computed
            if left > 0:
                prefill += min(n, left)
            if in_flight is None:
                self._advance(seq, n)
        self.stats.prompt_tokens_computed += prefill
        # What this step ran, (prefill tokens, decoding sequences): the encode planner
        # predicts the next step's time from it.
        self.last_step_work = (prefill, sum(1 for _, n in chunks if n == 1))
        self.stats.rows_stepped += len(chunks)
        sampling = [chunks[i][0] for i in logit_chunks]
        if ahead:
            launched = self._sample_ahead(sampling, logits, masks) if sampling and not read_first else None
            if in_flight is None:
                self._in_flight = launched
            else:  # now, while this step runs on the device
                self.stats.steps_ahead += 1
                self._read_in_flight()
                self._in_flight = launched
                # Blocks filled by this step are hashed once the tokens in them are known.
                for seq, n in chunks:
                    if seq.status == SeqStatus.RUNNING:
                        self._advance(seq, n)
                if read_first:  # the tokens read, these rows sample (a sequence they ended drops its row)
                    live = [i for i, seq in enumerate(sampling) if seq.status == SeqStatus.RUNNING]
                    if len(live) < len(sampling):
                        sampling, logits = [sampling[i] for i in live], logits[to_device(live, logits.device)]
                    if sampling:
                        self._in_flight = self._sample_ahead(sampling, logits, self._fill_masks(sampling))
        else:
            self._sample(sampling, logits, masks)
        synced = bool(logit_chunks) and not ahead  # (it read its tokens back)
        for model_s, sample_s, work in self.clock.finish(self.last_step_work, synced=synced):
            self.stats.time_model += model_s
            self.stats.time_sample += sample_s
            self._split_model_time(model_s, *work)
        self.stats.steps += 1

    def _recover(self) -> None:
        """After a step raised, whatever it had done: every running sequence computes its
        KV again from its tokens, and tokens in flight are drawn again (at the same
        positions: the same tokens). A read of tokens that did not finish is taken back
        (its tokens and figures; grammar states are rebuilt from the tokens left), so a
        token never counts without its figures or unseen by its stop rules.
        `failed_rows`: the sequences the failed step held (the worker bisects with them);
        `unrecoverable`: (sequence id, why) of those that could not be put back in order
        (the worker ends them with an error)."""
        self.failed_rows = [s.seq_id for s in self.running] or [s.seq_id for s in self.waiting[:1]]
        self.unrecoverable = []
        undo_tokens = self._read_tokens if self._reading is not None else []
        undo_figures = self._read_figures if self._reading is not None else []
        self._in_flight = self._reading = None
        self._read_tokens, self._read_figures = [], []
        for seq in list(self.running):
            self.running.remove(seq)
            self.blocks.release(seq.block_table)
            seq.block_table, seq.num_computed, seq.status = [], 0, SeqStatus.WAITING
            bisect.insort(self.waiting, seq, key=queue_order)
        for seq in self.seqs.values():
            seq.pending = 0
        self.stats.generated_tokens -= sum(1 for seq, _ in undo_tokens if seq.status != SeqStatus.FINISHED)
        for seq, to in undo_figures:
            if seq.status != SeqStatus.FINISHED:
                to.pop()
        bs = self.config.block_size
        for seq, _ in undo_tokens:
            if seq.status == SeqStatus.FINISHED:
                continue  # (its output was made: it stands)
            seq.output_token_ids.pop()
            del seq.block_hashes[seq.num_known_tokens // bs:]
            if seq.matcher is not None:
                try:
                    seq.matcher = self.grammars.matcher(seq.params.constraint, seq.output_token_ids)
                except Exception as e:
                    self.unrecoverable.append((seq.seq_id, f"its grammar state could not be rebuilt: "
                                                           f"{type(e).__name__}: {e}"))
        for seq in self.seqs.values():
            # One preempted with its token in flight (or its read taken back) holds KV of
            # every token it has now: with nothing left to compute it could not sample.
            if seq.host_kv is not None and seq.host_kv.shape[2] >= seq.num_tokens:
                self._forget_host_kv(seq)

    def _split_model_time(self, seconds: float, prefill: int, decoding: int) -> None:
        cm = self.cost_model
        p, d = (prefill * cm.beta_p, decoding * cm.beta_d) if cm is not None else (prefill, decoding)
        share = p / (p + d) if p + d > 0 else 0.0
        self.stats.time_prefill += seconds * share
        self.stats.time_decode += seconds * (1.0 - share)

    def _plan(self):
        bs = self.config.block_size
        running = self.running  # each running Sequence is its own SeqView
        ending = self._in_flight.ending if self._in_flight is not None else None
        if ending:
            running = [s for s in running if s not in ending]
        most = self.config.max_num_seqs if self.step_cap is None else min(self.step_cap, self.config.max_num_seqs)
        room = min(most - len(self.running), self.config.max_num_batched_tokens)
        waiting, cached = [], {}
        for s in self._admissible(max(0, room)):
            if s.host_kv is not None:  # restored by a copy: its tokens count as computed
                waiting.append(SeqView(s.seq_id, s.num_tokens, s.host_kv.shape[2], 0, 0, s.num_prompt_tokens))
                continue
            blocks: list[int] = []
            if self.config.prefix_caching:
                s.update_block_hashes(bs)
                blocks = self._match(s)
            cached[s.seq_id] = blocks
            waiting.append(SeqView(s.seq_id, s.num_tokens, len(blocks) * bs, len(blocks),
                                   self.blocks.free_blocks_needed(blocks), s.num_prompt_tokens))
        return self.planner.plan(running, waiting, self.blocks.num_free), cached

    def _admissible(self, room: int) -> list[Sequence]:
        """The first `room` waiting sequences, less samples whose first sample has not
        prefilled their shared prompt yet (they would only compute it again)."""
        out = []
        for s in self.waiting:
            if len(out) == room:
                break
            first = s.prefill_after
            if first is not None:
                if first.status != SeqStatus.FINISHED and first.num_computed < first.num_prompt_tokens:
                    continue
                s.prefill_after = None
            out.append(s)
        return out

    def _match(self, s: Sequence) -> list[int]:
        out = []
        for i in range(min(len(s.block_hashes), (s.num_tokens - 1) // self.config.block_size)):
            b = self.blocks.cached.get(s.block_hashes[i])
            if b is None:
                break
            out.append(b)
        return out

    def _apply(self, plan, cached) -> list[tuple[Sequence, int]]:
        for sid in plan.preempted:
            self._preempt(self.seqs[sid])
        chunks = [(self.seqs[sid], n) for sid, n in plan.chunks]
        # Cached prefix blocks are taken before anything is allocated, so no allocation
        # in this step can recycle a block another admitted sequence is about to reuse.
        for seq, _ in chunks:
            if seq.status == SeqStatus.WAITING and seq.host_kv is None:
                blocks = cached.get(seq.seq_id, [])
                self.blocks.take_cached(blocks)
                seq.block_table = list(blocks)
                seq.num_computed = len(blocks) * self.config.block_size
                self.stats.prompt_tokens_cached += min(seq.num_computed, seq.num_prompt_tokens)
                self.waiting.remove(seq)
                self.running.append(seq)
                seq.status = SeqStatus.RUNNING
        # Offloaded ones come back by a copy (after the cached blocks above were taken).
        chunks = [(seq, n) for seq, n in chunks if seq.status == SeqStatus.RUNNING or self._restore(seq)]
        out, bs, blocks = [], self.config.block_size, self.blocks
        for seq, n in chunks:
            need = -(-(seq.num_computed + n) // bs) - len(seq.block_table)
            if need > 0:  # (most decode steps: none)
                if need > blocks.num_free:  # planner's estimate missed shared blocks
                    self._preempt(seq)
                    continue
                seq.block_table.extend(blocks.allocate(need))
            out.append((seq, n))
        return out

    def _preempt(self, seq: Sequence) -> None:
        """Frees the sequence's blocks. Its KV goes to host memory if there is room
        (`offload_bytes`) and comes back by a copy; otherwise it re-prefills later (its
        full blocks may still sit in the prefix cache, so less is recomputed)."""
        if seq.num_computed and self.host_pool is not None:
            seq.host_kv = self.host_pool.offload(self.cache, seq.block_table, seq.num_computed)
            if seq.host_kv is not None:
                self.stats.offloads += 1
        self.running.remove(seq)
        self.blocks.release(seq.block_table)
        seq.block_table = []
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        bisect.insort(self.waiting, seq, key=queue_order)
        self.stats.preemptions += 1
        log.debug("[preempt] %s at %d tokens", seq.seq_id, seq.num_tokens)

    def _restore(self, seq: Sequence) -> bool:
        """An offloaded sequence comes back: fresh blocks, its KV copied in. False if
        the blocks are not free after all (it waits for the next step)."""
        kv = seq.host_kv
        need = self.blocks.blocks_for(kv.shape[2])
        if need > self.blocks.num_free:
            return False
        blocks = self.blocks.allocate(need)
        self.host_pool.for_device()  # its copy to the host may still be on the way
        try:
            self.cache.write(blocks, kv)
        except Exception:
            self.blocks.release(blocks)
            raise
        self._forget_host_kv(seq)
        seq.block_table, seq.num_computed = blocks, kv.shape[2]
        self.waiting.remove(seq)
        self.running.append(seq)
        seq.status = SeqStatus.RUNNING
        self.stats.restores += 1
        if self.config.prefix_caching:
            seq.update_block_hashes(self.config.block_size)
            for j in range(seq.num_computed // self.config.block_size):
                self.blocks.register_full_block(seq.block_table[j], seq.block_hashes[j])
        return True

    def _forget_host_kv(self, seq: Sequence) -> None:
        if seq.host_kv is not None:
            self.host_pool.release(seq.host_kv)
            seq.host_kv = None

    @property
    def offloaded_bytes(self) -> int:
        """Host memory held by offloaded KV."""
        return self.host_pool.used_bytes if self.host_pool is not None else 0

    def _advance(self, seq: Sequence, n: int) -> None:
        bs = self.config.block_size
        before = seq.num_computed // bs
        seq.num_computed += n
        if self.config.prefix_caching:
            after = seq.num_computed // bs
            if after > before:
                seq.update_block_hashes(bs)
                for j in range(before, after):
                    self.blocks.register_full_block(seq.block_table[j], seq.block_hashes[j])

    def _fill_masks(self, seqs: list[Sequence]):
        """(constrained sequences, the job filling their grammar masks), or None."""
        constrained = [seq for seq in seqs if seq.matcher is not None]
        return (constrained, self.grammars.fill_async([seq.matcher for seq in constrained])) if constrained else None

    def _apply_masks(self, seqs: list[Sequence], logits: torch.Tensor, masks) -> None:
        if masks is None:
            return
        constrained, job = masks
        order = {id(s): k for k, s in enumerate(constrained)}
        rows = [i for i, s in enumerate(seqs) if id(s) in order]
        t0 = time.perf_counter()
        mask = job.result()
        self.stats.time_grammar_wait += time.perf_counter() - t0
        lp.apply_bitmask(logits, rows, mask[[order[id(seqs[i])] for i in rows]])

    @torch.inference_mode()  # the logits are the model's inference tensors: edited in place
    def _sample_ahead(self, seqs: list[Sequence], logits: torch.Tensor, masks=None) -> PendingTokens:
        """Samples on the logits' device and reads nothing back: the next step reads the
        tokens (`_read_in_flight`). Each draw's position counts the tokens in flight."""
        self._apply_masks(seqs, logits, masks)
        ops = self.runner.ops
        launched = launch_sampling(seqs, logits, ops.row_top2 if ops is not None else None, self._end_ids)
        # Those the tokens in flight end whatever they are: the next step plans without
        # them (a row, and perhaps a block, for a token that would be dropped).
        launched.ending = {s for s in seqs if len(s.output_token_ids) + s.pending >= s.params.max_tokens
                           or s.num_tokens >= s.max_total_tokens}
        return launched

    def _read_in_flight(self) -> None:
        """The last step's tokens, once they are on the host: appended, and the sequences
        they end finished (their outputs to the outbox). A sequence that ended (or was
        aborted) meanwhile drops its token."""
        pending, self._in_flight = self._in_flight, None
        self._reading = pending  # (until the read is done: a failure meanwhile recovers its sequences)
        tokens, figures = pending.read(), pending.figures()  # (what the device can fail at: first)
        live = [(seq, tok) for seq, tok in zip(pending.seqs, tokens) if seq.status != SeqStatus.FINISHED]
        # What the read adds, so that a failure before it is done can take it back
        # (`_recover`): every token, then every figure, each in a loop that cannot fail.
        self._read_tokens, self._read_figures = live, []
        for seq, tok in live:
            seq.output_token_ids.append(tok)
        self._read_figures = self._record_figures(pending, figures)
        self.stats.generated_tokens += len(live)
        for seq, tok in live:
            reason = self._finish_reason(seq, tok)
            if reason:
                self._outbox.append(self._finish(seq, reason))
        self._reading, self._read_tokens, self._read_figures = None, [], []

    def _record_figures(self, pending: PendingTokens, got: dict[str, list]) -> list[tuple[Sequence, list]]:
        """The logprobs, margins and draws that came back with a step's tokens (`got`),
        recorded by the sequences still running: all made first, then appended. Returns
        (sequence, the list it appended to) for each."""
        rows, seqs, adds = pending.rows, pending.seqs, []
        if "lp_picked" in got:
            for i, c, vs, ts in zip(rows["logprob_rows"], got["lp_picked"], got["lp_values"], got["lp_ids"]):
                if seqs[i].status != SeqStatus.FINISHED:
                    adds.append((seqs[i], seqs[i].logprobs, logprob_entry(seqs[i].params.logprobs, c, vs, ts)))
        if "margins" in got:
            draws = (draws_of(rows["sampled_rows"], got["lo"], got["hi"], got["cut"], [s.params for s in seqs],
                              rows["uniforms"]) if "lo" in got else {})
            for i, (seq, margin) in enumerate(zip(seqs, got["margins"])):
                if seq.status != SeqStatus.FINISHED and seq.params.return_margins:
                    adds.append((seq, seq.margins, margin))
                    if i in draws:
                        adds.append((seq, seq.draws, draws[i].to_list()))
        for _, to, value in adds:
            to.append(value)
        return [(seq, to) for seq, to, _ in adds]

    @torch.inference_mode()  # the logits are the model's inference tensors: edited in place
    def _sample(self, seqs: list[Sequence], logits: torch.Tensor, masks=None) -> None:
        """A step in order: its tokens sampled and read back at once, by the async path's
        own launch and read (one path records tokens, logprobs, margins and draws)."""
        if not seqs:
            return
        if self.on_logits is not None:
            # A copy: the logits are edited in place below, and on a GPU they are a decode
            # graph's output, overwritten by its next replay.
            as_float = logits.float()
            self.on_logits([s.seq_id for s in seqs], as_float.clone() if as_float is logits else as_float)
        self._in_flight = self._sample_ahead(seqs, logits, masks)
        self._read_in_flight()
        if self.park_at:
            for seq in seqs:
                if seq.status != SeqStatus.FINISHED:
                    self._park_if_asked(seq)

    def _end_ids(self, p: SamplingParams) -> list[int]:
        return list(p.stop_token_ids) + ([] if p.ignore_eos else list(self.model_cfg.eos_token_ids))

    def _finish_reason(self, seq: Sequence, tok: int) -> str | None:
        p = seq.params
        if (not p.ignore_eos and tok in self.model_cfg.eos_token_ids) or tok in p.stop_token_ids:
            return "stop"
        if seq.matcher is not None:
            if not seq.matcher.consume_token(tok):  # the mask allows only tokens it takes: a bug if seen
                log.warning("[grammar] %s: token %d refused by its grammar (%s); ended", seq.seq_id, tok,
                            seq.matcher.get_error())
                return "stop"
            if seq.matcher.is_stopped():  # the grammar is complete and cannot extend
                return "stop"
        if p.stop and len(seq.output_token_ids) >= p.min_tokens and self._hits_stop_string(seq):
            return "stop"
        if len(seq.output_token_ids) >= p.max_tokens or seq.num_known_tokens >= seq.max_total_tokens:
            return "length"
        return None

    def _hits_stop_string(self, seq: Sequence) -> bool:
        """Only a stop string ending in the newest token can be new, and it spans at most
        one token per character: decode that tail, not the whole output, every step."""
        window = max(map(len, seq.params.stop)) + 4
        text = self.tokenizer.decode(seq.output_token_ids[-window:])
        return any(s in text for s in seq.params.stop)

    def _finish(self, seq: Sequence, reason: str) -> RequestOutput:
        # The output first: if making it fails, the sequence is still here to recover.
        text = self.tokenizer.decode(seq.output_token_ids)
        if reason == "stop" and seq.params.stop:
            cut = min((text.find(s) for s in seq.params.stop if s in text), default=-1)
            if cut >= 0:
                text = text[:cut]
        out = RequestOutput(seq.seq_id, list(seq.output_token_ids), text, reason,
                            seq.num_prompt_tokens, list(seq.margins), list(seq.draws),
                            self._logprob_entries(seq) if seq.params.logprobs is not None else None)
        self.planner.observe_finished(len(seq.output_token_ids), seq.num_prompt_tokens)
        self._drop(seq)
        del self.seqs[seq.seq_id]
        seq.finish_reason = reason
        return out

    def _logprob_entries(self, seq: Sequence) -> list[dict]:
        """The recorded logprobs with each token's text and UTF-8 bytes (OpenAI's shape)."""
        def entry(tok: int, value: float) -> dict:
            text = self.tokenizer.token_text(tok)
            return {"token": text, "token_id": tok, "logprob": value, "bytes": list(text.encode())}

        return [{**entry(tok, c), "top_logprobs": [entry(t, v) for t, v in top]}
                for tok, (c, top) in zip(seq.output_token_ids, seq.logprobs)]

    # -- whole batches -----------------------------------------------------------------

    def generate(self, prompts: list, params: SamplingParams | list[SamplingParams] = SamplingParams(),
                 seq_ids: list | None = None) -> list[RequestOutput]:
        """Runs prompts (text or token-id lists) to completion; outputs in input order."""
        seq_ids = seq_ids if seq_ids is not None else list(range(len(prompts)))
        plist = params if isinstance(params, list) else [params] * len(prompts)
        for sid, prompt, p in zip(seq_ids, prompts, plist):
            if isinstance(prompt, str):
                self.add_request(sid, prompt=prompt, params=p)
            else:
                self.add_request(sid, prompt_token_ids=prompt, params=p)
        done: dict = {}
        with heap_frozen_while():
            while self.has_unfinished():
                for out in self.step():
                    done[out.seq_id] = out
        return [done[sid] for sid in seq_ids]

    # -- sequence state ----------------------------------------------------------------

    def export_sequence(self, seq_id, remove: bool = False) -> SequenceState:
        """The sequence as data, with its computed KV in the canonical layout."""
        seq = self.seqs.get(seq_id)
        if seq is None:
            raise RequestError(f"sequence {seq_id!r}: not in this engine")
        # A token still in flight (async scheduling) is not part of the state: the KV of
        # every known token is, and where it resumes the last step runs again and draws
        # the same token (its draw is keyed by position); here it is dropped.
        kv = None
        if seq.host_kv is not None or (seq.status == SeqStatus.RUNNING and seq.num_computed):
            if seq.host_kv is not None:
                self.host_pool.for_host()
            tensors = seq.host_kv if seq.host_kv is not None else self.cache.read(seq.block_table, seq.num_computed).cpu()
            kv = encode_kv(tensors, self.fingerprint)
        state = SequenceState(
            seq_id=seq.seq_id, prompt_token_ids=list(seq.prompt_token_ids),
            output_token_ids=list(seq.output_token_ids), params=seq.params.to_dict(),
            op_index=seq.op_index, num_computed=tensors.shape[2] if kv else 0,
            model_fingerprint=self.fingerprint, margins=list(seq.margins), kv=kv, sampling_id=seq.sampling_id,
            draws=list(seq.draws), logprobs=list(seq.logprobs))
        if remove:
            self.abort(seq_id)
        return state

    def import_sequence(self, state: SequenceState) -> None:
        """Continues an exported sequence here. State from another model is refused; if
        the cache has no room for its KV, it re-prefills instead."""
        sid = state.seq_id
        if state.model_fingerprint != self.fingerprint:
            raise StateError(f"sequence {sid!r}: state is from model {state.model_fingerprint}, this engine runs {self.fingerprint}")
        if sid in self.seqs:
            raise RequestError(f"sequence {sid!r}: already in the engine")
        params = SamplingParams.from_dict(state.params)
        seq = Sequence(sid, list(state.prompt_token_ids), params, op_index=state.op_index,
                       output_token_ids=list(state.output_token_ids), margins=list(state.margins),
                       draws=list(state.draws), logprobs=[list(x) for x in state.logprobs],
                       max_total_tokens=self.max_total_tokens, sampling_id=state.sampling_id, under_way=True)
        self._check_prompt(sid, seq.prompt_token_ids + seq.output_token_ids)
        self._prepare_output_rules(seq)
        kv = decode_kv(state, self.fingerprint, self.model_cfg) if state.kv is not None and state.num_computed else None
        if kv is not None and state.num_computed >= seq.num_tokens:
            # The last token's KV is recomputed, since that step is the one that samples.
            kv = kv[:, :, : seq.num_tokens - 1]
        num_computed = 0 if kv is None else kv.shape[2]
        self._enqueue(seq)
        if not num_computed:
            return
        need = self.blocks.blocks_for(num_computed)
        if need > self.blocks.num_free:
            log.info("[import] %s: no room for %d KV blocks, will re-prefill", sid, need)
            return
        if self.step_cap is not None and len(self.running) >= self.step_cap:
            # Steps are capped (they failed, perhaps out of memory): it waits its turn.
            log.info("[import] %s: steps hold at most %d sequences, will re-prefill", sid, self.step_cap)
            return
        blocks = self.blocks.allocate(need)
        try:
            self.cache.write(blocks, kv)
        except Exception:
            self.blocks.release(blocks)
            raise
        seq.block_table = blocks
        seq.num_computed = num_computed
        self.waiting.remove(seq)
        self.running.append(seq)
        seq.status = SeqStatus.RUNNING
        if self.config.prefix_caching:
            self._advance(seq, 0)
            seq.update_block_hashes(self.config.block_size)
            for j in range(seq.num_computed // self.config.block_size):
                self.blocks.register_full_block(seq.block_table[j], seq.block_hashes[j])

