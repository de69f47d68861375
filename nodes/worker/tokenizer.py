"""The model folder's `tokenizer.json`, through the `tokenizers` library, and its chat
template (`shoal/chat_template.py`) for prompts given as messages."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from shoal.nodes.worker.models.config import ModelError


class TextTokenizer:
    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        self._chat_template = None  # read on first use: most jobs never send messages
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

    def token_text(self, token_id: int) -> str:
        """One token's text as it reads in the output (special tokens by name)."""
        return self.tok.decode([token_id], skip_special_tokens=False)

    def encode_chat(self, messages: list[dict], **template_kwargs) -> list[int]:
        """Ids of a chat's prompt: the template writes the special tokens, so the text is
        tokenized without adding any (as transformers' apply_chat_template does)."""
        return self.encode(self.chat_template().render(messages, add_generation_prompt=True, **template_kwargs))

    def chat_template(self):
        from shoal.chat_template import ChatTemplate, ChatTemplateError

        if self._chat_template is None:
            self._chat_template = ChatTemplate.from_model_dir(self.model_dir)
            if self._chat_template is None:
                raise ChatTemplateError(f"model {self.model_dir} has no chat template (chat_template.jinja or "
                                        "tokenizer_config.json's chat_template): give its items a prompt, not messages")
        return self._chat_template
