"""What the IO thread hands the compute thread: typed commands on one queue, taken in
order between engine steps."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Admit:
    """Sequences to run: assigned by the scheduler, imported from a peer (with its KV
    by seq id), or taken back after a failed move."""
    job_id: str
    program: str
    args: dict
    sequences: list  # [{seq_id, item, state?}]
    kv: dict = field(default_factory=dict)  # seq_id -> KV blob


@dataclass
class Drop:
    """A cancelled job: its sequences stop where they are and are let go."""
    job_id: str


@dataclass
class Export:
    """Sequences to move to another worker: the listed ones, or `count` of the worker's
    choosing (queued first; count < 0: all)."""
    job_id: str
    seq_ids: list
    count: int
    to_node: str
    to_address: str
