"""Everything one sequence is, as plain data: tokens, sampling position, KV blocks.

Nothing here lives only in a generator frame or a CUDA graph, so a sequence can be
exported mid-generation and continued elsewhere.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass, field

from shoal.nodes.worker.block_manager import block_hash
from shoal.nodes.worker.sampler import sequence_key
from shoal.sampling import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"  # holds no KV blocks; (re)prefills when admitted
    RUNNING = "running"  # holds KV blocks for its computed tokens
    FINISHED = "finished"


@dataclass(eq=False)  # one sequence is one object: removing it from a queue compares identities, not 24 fields
class Sequence:
    seq_id: object
    prompt_token_ids: list[int]
    params: SamplingParams
    op_index: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0  # tokens whose K/V are in this sequence's blocks
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # of every full block of tokens
    arrival: int = 0
    under_way: bool = False  # its program has generated before (or moved here): admitted before new ones
    finish_reason: str | None = None
    margins: list[float] = field(default_factory=list)
    draws: list[list] = field(default_factory=list)  # [u, lo, hi, cut] per sampled token (sampler.Draw)
    max_total_tokens: int = 0  # the model's context: generation stops there
    text_offset: int = 0  # how far stop-string search has looked
    # What sampling is keyed by: the item's id, so a sequence draws the same tokens in
    # any job, on any worker, after any move. None: the seq_id itself.
    sampling_id: object = None
    host_kv: object = None  # [layers, 2, tokens, kvh, d] in host memory while preempted
    # Per sampled token when params.logprobs is set: [its logprob, [[id, logprob], ...]].
    logprobs: list[list] = field(default_factory=list)
    # The grammar's state when params carry a constraint (grammar_cache.py): never sent
    # anywhere, rebuilt from output_token_ids wherever the sequence resumes.
    matcher: object = None
    # Another sample of the same prompt that prefills it first (engine.add_request).
    prefill_after: "Sequence | None" = None
    # Tokens sampled on the device and not read back yet (`pending_tokens.py`): counted in
    # its length, so the planner sees it as it will be; never in its output or a hash.
    pending: int = 0
    # Its sampling needs its last token on the host first (a grammar's mask, penalties).
    needs_last_token: bool = False

    @functools.cached_property
    def key(self) -> int:
        """Its draws' key (`sampler.uniform`): computed when it first samples at a temperature."""
        return sequence_key(self.key_id)

    @property
    def key_id(self):
        """What the sequence's draws are keyed by: its item's id."""
        return self.seq_id if self.sampling_id is None else self.sampling_id

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.pending

    @property
    def num_known_tokens(self) -> int:
        """Tokens the host holds: all but those still in flight."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    # A running sequence as the step planner sees it (`scheduler.step_planner.SeqView`):
    # handed over as it is, since a view of each of a thousand sequences built every step
    # was a sixth of the host's time per decode step.
    cached_free_blocks = 0  # it holds its blocks

    @property
    def num_blocks(self) -> int:
        return len(self.block_table)

    @property
    def decoding(self) -> bool:
        return bool(self.prompt_token_ids) and self.num_computed >= len(self.prompt_token_ids)

    def token(self, i: int) -> int:
        """Token `i`; 0 for one in flight (the step's input is then taken from the device)."""
        p = len(self.prompt_token_ids)
        if i < p:
            return self.prompt_token_ids[i]
        j, out = i - p, self.output_token_ids
        if j < len(out):
            return out[j]
        if j < len(out) + self.pending:
            return 0
        raise IndexError(f"sequence {self.seq_id!r} has no token {i}")

    def tokens(self, start: int, end: int) -> list[int]:
        p = self.prompt_token_ids
        if end <= len(p):
            return p[start:end]
        return (p + self.output_token_ids)[start:end]

    def update_block_hashes(self, block_size: int) -> None:
        """Extend the chained hashes to every full block of the known tokens."""
        full = self.num_known_tokens // block_size
        while len(self.block_hashes) < full:
            i = len(self.block_hashes)
            parent = self.block_hashes[-1] if self.block_hashes else None
            self.block_hashes.append(block_hash(parent, self.tokens(i * block_size, (i + 1) * block_size)))
