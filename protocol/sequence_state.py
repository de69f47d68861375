"""The exported state of a sequence: plain data plus an optional KV blob.

The KV blob is a safetensors file in the canonical unpaged layout: one tensor per layer,
`layer.{i}` of shape `[2, tokens, kv_heads, head_dim]`, with metadata naming the model
fingerprint and token count. `kv_blob_metadata` reads that metadata without torch, so
any node can refuse state from another model before it touches the tensors.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

from shoal.protocol.errors import ShoalError


class StateError(ShoalError, ValueError):
    """A sequence state that cannot be imported here; the message says why."""


@dataclass
class SequenceState:
    seq_id: object
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: dict
    op_index: int
    num_computed: int  # tokens covered by the KV blob (0 without one)
    model_fingerprint: str
    margins: list[float] = field(default_factory=list)
    kv: bytes | None = None
    sampling_id: object = None  # what its sampling is keyed by, if not seq_id
    draws: list[list] = field(default_factory=list)  # [u, lo, hi, cut] of its sampled tokens so far
    logprobs: list[list] = field(default_factory=list)  # [logprob, [[id, logprob], ...]] per token, if asked

    def header(self) -> dict:
        """Everything but the KV blob, as JSON-able data."""
        return {
            "seq_id": self.seq_id,
            "prompt_token_ids": self.prompt_token_ids,
            "output_token_ids": self.output_token_ids,
            "params": self.params,
            "op_index": self.op_index,
            "num_computed": self.num_computed,
            "model_fingerprint": self.model_fingerprint,
            "margins": self.margins,
            "sampling_id": self.sampling_id,
            "draws": self.draws,
            # (only where asked for: states of sequences that never ask read as before)
            **({"logprobs": self.logprobs} if self.logprobs else {}),
        }

    @classmethod
    def from_header(cls, header: dict, kv: bytes | None = None) -> "SequenceState":
        try:
            return cls(kv=kv, **{k: header[k] for k in (
                "seq_id", "prompt_token_ids", "output_token_ids", "params", "op_index",
                "num_computed", "model_fingerprint")}, margins=header.get("margins", []),
                sampling_id=header.get("sampling_id"), draws=header.get("draws", []),
                logprobs=header.get("logprobs", []))
        except KeyError as e:
            raise StateError(f"sequence state lacks field {e.args[0]!r}") from None


def kv_blob_metadata(blob: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors blob; raises StateError if it is not one."""
    if len(blob) < 8:
        raise StateError(f"KV blob of {len(blob)} bytes is truncated")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise StateError(f"KV blob is truncated: header of {n} bytes, {len(blob) - 8} present")
    try:
        header = json.loads(blob[8 : 8 + n])
    except ValueError as e:
        raise StateError(f"KV blob header is not valid JSON: {e}") from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > len(blob):
        raise StateError(f"KV blob is truncated: data needs {end} bytes, {len(blob) - 8 - n} present")
    return header.get("__metadata__", {})
