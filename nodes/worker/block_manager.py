"""KV block bookkeeping: allocation, reference counts and prefix sharing. Pure Python.

Blocks hold `block_size` tokens. A full block is identified by a hash chained over its
tokens and its predecessor's hash, so two sequences with a common prefix map the same
prefix to the same blocks. Freed blocks keep their content (and hash) until a new
allocation needs the space, least recently freed first, so a sequence that comes back
(preempted, or a re-sent growing context) usually finds its prefix still cached.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Sequence

from shoal.protocol.errors import ShoalError


class OutOfBlocks(ShoalError, RuntimeError):
    """No free KV block; the caller preempts or waits."""


def block_hash(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    h = hashlib.blake2b(parent or b"", digest_size=16)
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    return h.digest()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref = [0] * num_blocks
        self.hash_of: list[bytes | None] = [None] * num_blocks
        self.cached: dict[bytes, int] = {}  # hash -> block holding those tokens
        # Free blocks in the order they should be reused: never-used ones first, then
        # least recently freed. Cached content survives until its block is reused.
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))

    # -- queries -------------------------------------------------------------------

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, tokens: Sequence[int]) -> tuple[list[int], list[bytes]]:
        """Cached blocks covering a prefix of `tokens`, and their hashes. At least one
        token is always left uncached, since the step that samples needs its logits."""
        bs = self.block_size
        blocks, hashes, parent = [], [], None
        for i in range((len(tokens) - 1) // bs):
            h = block_hash(parent, tokens[i * bs : (i + 1) * bs])
            b = self.cached.get(h)
            if b is None:
                break
            blocks.append(b)
            hashes.append(h)
            parent = h
        return blocks, hashes

    def free_blocks_needed(self, cached_blocks: Sequence[int]) -> int:
        """How many free-list blocks taking these cached blocks would consume."""
        return sum(1 for b in cached_blocks if self.ref[b] == 0)

    # -- mutations -----------------------------------------------------------------

    def take_cached(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free):
            raise OutOfBlocks(f"need {n} KV blocks, {len(self.free)} free")
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            old = self.hash_of[b]
            if old is not None:
                if self.cached.get(old) == b:
                    del self.cached[old]
                self.hash_of[b] = None
            self.ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        # Freed back to front: the tail of a sequence is the least likely to be shared,
        # so it is reused before the prefix.
        for b in reversed(blocks):
            if self.ref[b] <= 0:
                raise RuntimeError(f"block {b} released more often than taken")
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None

    def register_full_block(self, block: int, h: bytes) -> None:
        """Record that `block` now holds the full content hashed as `h`. If another block
        already caches it, the first keeps the entry (both hold the same tokens)."""
        if self.hash_of[block] is None:
            self.hash_of[block] = h
            self.cached.setdefault(h, block)
