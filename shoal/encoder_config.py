"""What an encoder folder says about the encoder, read without torch: its shape,
pooling and length cap, and a fingerprint of its weights (so an embedding job's output
never mixes vectors of two encoders, and a worker refuses work meant for another)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from shoal.protocol.errors import ShoalError


class EncoderError(ShoalError, ValueError):
    """An encoder folder that cannot be loaded; the message names the file and why."""


@dataclass(frozen=True)
class EncoderConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    layer_norm_eps: float
    pooling: str  # "mean" | "cls"
    normalize: bool
    max_seq_length: int

    @classmethod
    def from_folder(cls, folder: Path) -> "EncoderConfig":
        def read(name: str, required: bool = True):
            path = folder / name
            if not path.exists():
                if required:
                    raise EncoderError(f"encoder folder {folder}: missing {name}")
                return None
            try:
                return json.loads(path.read_text())
            except ValueError as e:
                raise EncoderError(f"{path}: not valid JSON ({e})") from None

        cfg = read("config.json")
        if cfg.get("model_type") not in ("bert", None) and "Bert" not in str(cfg.get("architectures")):
            raise EncoderError(f"{folder}/config.json: model_type {cfg.get('model_type')!r} is not a BERT-style encoder")
        pool = read("1_Pooling/config.json", required=False) or {"pooling_mode_mean_tokens": True}
        modules = read("modules.json", required=False) or []
        st = read("sentence_bert_config.json", required=False) or {}
        return cls(cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["intermediate_size"],
                   cfg["max_position_embeddings"], cfg.get("layer_norm_eps", 1e-12),
                   "cls" if pool.get("pooling_mode_cls_token") else "mean",
                   any(m.get("type", "").endswith("Normalize") for m in modules),
                   int(st.get("max_seq_length", cfg["max_position_embeddings"])))


def encoder_fingerprint(folder: str | Path) -> str:
    """A hash of config.json and the weights file: equal exactly when the encoders are."""
    folder = Path(folder)
    h = hashlib.blake2b(digest_size=12)
    for name in ("config.json", "model.safetensors"):
        path = folder / name
        if not path.exists():
            raise EncoderError(f"encoder folder {folder}: missing {name}")
        with open(path, "rb") as fh:
            while chunk := fh.read(8 << 20):
                h.update(chunk)
    return h.hexdigest()


def describe_encoder(folder: str | Path) -> dict:
    """{name, dim, fingerprint, max_seq_length} of an encoder folder."""
    folder = Path(folder)
    cfg = EncoderConfig.from_folder(folder)
    return {"name": folder.name, "dim": cfg.hidden_size, "fingerprint": encoder_fingerprint(folder),
            "max_seq_length": min(cfg.max_seq_length, cfg.max_positions)}
