"""The engine of a worker that hosts only an encoder: no KV, no sequences.

It publishes zero capacity, so the scheduler places no sequences on it; a Generate that
reaches it anyway (a program's sequence moved by hand) fails that sequence with an
error that says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from shoal.sampling import RequestError


@dataclass(frozen=True)
class _Config:
    block_size: int = 16
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    chunked_prefill: bool = False
    policy: str = "none"


@dataclass(frozen=True)
class _Blocks:
    num_blocks: int = 0
    num_used: int = 0


class NoDecoder:
    fingerprint = ""
    cost_model = None
    planner = None
    config = _Config()
    blocks = _Blocks()
    max_total_tokens = 0

    def __init__(self):
        self.seqs: dict = {}
        self.waiting: list = []
        self.parked: dict = {}

    def has_unfinished(self) -> bool:
        return False

    def step(self) -> list:
        return []

    def add_request(self, *args, **kw) -> None:
        raise RequestError("this worker hosts no decoder (it was started with --encoder only): it cannot run Generate")

    def import_sequence(self, *args, **kw) -> None:
        self.add_request()

    def abort(self, key) -> None:
        pass

    def stats_snapshot(self) -> dict:
        return {"running": 0, "waiting": 0, "kv_blocks_used": 0, "kv_blocks_total": 0, "generated_tokens": 0,
                "planner": {"mode": "none"}}
