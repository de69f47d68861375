"""Step planning: which sequences run how many tokens in the next engine step.

Pure: it sees sequences as `SeqView`s and the number of free KV blocks, and returns a
`StepPlan`; the engine applies it. (The engine hands its running sequences over as they
are: they have a SeqView's fields. A planner reads them and never changes them.) This is the MB policy (chunked prefill mixed with
decode under a token budget, as vLLM v1 and Sarathi-Serve do); EB and EB+ plug in here.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)  # not frozen: built for every sequence every step, and frozen costs 4x to build
class SeqView:
    seq_id: Hashable
    num_tokens: int  # prompt + output tokens known
    num_computed: int  # tokens with K/V computed (for a waiting one: its cached prefix)
    num_blocks: int  # blocks it holds (for a waiting one: its cached prefix blocks)
    # Cached prefix blocks that sit in the free list: admitting takes them from it.
    cached_free_blocks: int = 0
    num_prompt_tokens: int = 0  # a running sequence decodes once these are computed

    @property
    def decoding(self) -> bool:
        return self.num_prompt_tokens > 0 and self.num_computed >= self.num_prompt_tokens


@dataclass(frozen=True)
class PlannerConfig:
    block_size: int
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 256
    chunked_prefill: bool = True
    num_blocks: int = 0  # KV capacity, for policies that size their batch by memory


@dataclass
class StepPlan:
    chunks: list[tuple[Hashable, int]] = field(default_factory=list)  # (seq_id, tokens to compute)
    preempted: list[Hashable] = field(default_factory=list)  # running -> waiting, blocks freed

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.chunks)


class MixedBatchPlanner:
    """MB: running sequences oldest first (a decode costs one token, a partial prefill
    continues in chunks), then waiting ones in arrival order, all under one token budget.
    When blocks run out, the newest running sequence is preempted."""

    name = "mb"

    def __init__(self, config: PlannerConfig):
        self.cfg = config

    def observe_finished(self, output_len: int, prompt_len: int) -> None:
        """MB needs no statistics; EB and EB+ learn the output-length hazard here."""

    def stats(self) -> dict:
        return {"policy": self.name, "mode": "mb"}

    def _blocks_after(self, v: SeqView, n: int) -> int:
        return -(-(v.num_computed + n) // self.cfg.block_size)

    def plan(self, running: Sequence[SeqView], waiting: Sequence[SeqView], free_blocks: int) -> StepPlan:
        cfg = self.cfg
        plan = StepPlan()
        budget = cfg.max_num_batched_tokens
        queue = list(running)
        i = 0
        while i < len(queue) and budget > 0:
            v = queue[i]
            n = min(v.num_tokens - v.num_computed, budget)
            need = max(0, self._blocks_after(v, n) - v.num_blocks)
            while need > free_blocks and len(queue) > i + 1:
                victim = queue.pop()
                plan.preempted.append(victim.seq_id)
                free_blocks += victim.num_blocks
            if need > free_blocks:
                # Even alone it does not fit: it yields its own blocks and waits.
                queue.pop(i)
                plan.preempted.append(v.seq_id)
                free_blocks += v.num_blocks
                continue
            free_blocks -= need
            budget -= n
            plan.chunks.append((v.seq_id, n))
            i += 1
        if plan.preempted:
            return plan  # memory is short: admit nothing new this step
        num_seqs = len(queue)
        for v in waiting:
            if budget <= 0 or num_seqs >= cfg.max_num_seqs:
                break
            remaining = v.num_tokens - v.num_computed
            if not cfg.chunked_prefill and remaining > budget:
                # Whole prompts only; one too big for the budget still runs when the step
                # is otherwise empty, or it would never run.
                if plan.chunks:
                    break
                n = remaining
            else:
                n = min(remaining, budget)
            need = v.cached_free_blocks + self._blocks_after(v, n) - v.num_blocks
            if need > free_blocks:
                break
            free_blocks -= need
            budget -= n
            num_seqs += 1
            plan.chunks.append((v.seq_id, n))
        return plan
