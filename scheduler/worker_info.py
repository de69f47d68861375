"""A worker as the scheduler core sees it: what it published when it registered."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_SEQS = 256


@dataclass(frozen=True)
class WorkerInfo:
    node_id: str
    incarnation: object = None  # the lease it registered under: a new one holds nothing
    max_seqs: int = DEFAULT_MAX_SEQS  # sequences its engine runs at once
    kv_tokens: int = 1 << 30  # free KV tokens
    max_seq_tokens: int | None = None  # the longest sequence it runs
    speed: float | None = None  # decode sequence-steps per second (1/β_d); None: uncalibrated
    encoder: str | None = None  # the fingerprint of the encoder it hosts

    @classmethod
    def from_member(cls, node_id: str, info: dict) -> "WorkerInfo":
        """From the record a worker registers in etcd."""
        beta_d = (info.get("calibration") or {}).get("beta_d") or 0
        return cls(node_id, info.get("incarnation"), int(info.get("max_seqs", DEFAULT_MAX_SEQS)),
                   int(info.get("kv_tokens", 1 << 30)), info.get("max_seq_tokens"),
                   1.0 / beta_d if beta_d > 0 else None, info.get("encoder"))


def filled_speeds(speeds: dict[str, float | None]) -> dict[str, float]:
    """Each worker's speed, an uncalibrated one (None) counted as the mean of the others:
    placement and stealing compare workers by it (all 1.0 when none is calibrated)."""
    known = [v for v in speeds.values() if v]
    typical = sum(known) / len(known) if known else 1.0
    return {w: v or typical for w, v in speeds.items()}
