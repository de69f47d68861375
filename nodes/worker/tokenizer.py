"""The model folder's `tokenizer.json`, through the `tokenizers` library."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from shoal.nodes.worker.models.config import ModelError


class TextTokenizer:
    def __init__(self, model_dir: str | Path):
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise ModelError(f"model folder {model_dir} has no tokenizer.json")
        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as e:
            raise ModelError(f"cannot read {path}: {e}") from None
        # Plain text in, plain ids out: no padding or truncation a checkpoint may carry.
        self.tok.no_padding()
        self.tok.no_truncation()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)
