"""A checkpoint's chat template: chat messages rendered to the model's prompt text.

Rendered with jinja2 the way transformers' `apply_chat_template` renders it (a sandboxed
environment with trim_blocks and lstrip_blocks, loop controls, a `tojson` that does not
escape HTML, `raise_exception`, `strftime_now`, the `{% generation %}` tag, the named
special tokens as variables), so that the same messages give the same text, and the
text tokenized without special tokens gives the same ids: a template writes its own.

The template comes from the model folder's `chat_template.jinja`, else from
`tokenizer_config.json`'s `chat_template` (a string, or a list of named templates of which
"default" is taken).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path

from shoal.protocol.errors import ShoalError

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Older names of a message's reasoning, filled in under each other's names as transformers does.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ShoalError, ValueError):
    """A template that cannot be read or rendered, or messages it cannot take."""


def check_messages(messages, where: str = "messages") -> str | None:
    """What is wrong with a chat's messages, or None: a non-empty list of objects, each
    with a string "role". Their content is the template's to interpret."""
    if not isinstance(messages, list) or not messages:
        return f"{where}: messages must be a non-empty list of {{\"role\", \"content\"}} objects"
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"{where}: messages[{i}] must be an object, got {type(m).__name__}"
        if not isinstance(m.get("role"), str):
            return f"{where}: messages[{i}] needs a string \"role\""
    return None


def _template_environment():
    import jinja2
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        """`{% generation %}...{% endgeneration %}` marks assistant text for training
        masks; for rendering a prompt it is its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes <, > and & for HTML; templates expect plain JSON.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@lru_cache(maxsize=16)
def _compiled(source: str):
    import jinja2

    try:
        return _template_environment().from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template does not parse: {e.message} (template line {e.lineno})") from None


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken object."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _normalized(messages: list[dict]) -> list[dict]:
    """As transformers hands messages to a template: keys whose value is None dropped
    (templates test for presence), reasoning under each of its names."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


class ChatTemplate:
    def __init__(self, source: str, special_tokens: dict[str, str] | None = None):
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.template = _compiled(source)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> "ChatTemplate | None":
        """The folder's template, or None when it has none."""
        model_dir = Path(model_dir)
        config_path = model_dir / "tokenizer_config.json"
        config = {}
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text())
            except (OSError, ValueError) as e:
                raise ChatTemplateError(f"cannot read {config_path}: {e}") from None
        special = {name: text for name in SPECIAL_TOKEN_NAMES if (text := _token_text(config.get(name))) is not None}
        jinja_file = model_dir / "chat_template.jinja"
        if jinja_file.is_file():
            return cls(jinja_file.read_text(), special)
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: the default one renders chats
            source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"), None)
        if source is None:
            return None
        if not isinstance(source, str):
            raise ChatTemplateError(f"{config_path}: chat_template must be a string or a list of named templates")
        return cls(source, special)

    def render(self, messages: list[dict], add_generation_prompt: bool = True, tools: list[dict] | None = None,
               documents: list[dict] | None = None, **kwargs) -> str:
        """The prompt text for `messages`; with `add_generation_prompt` it ends where the
        assistant's reply begins. `kwargs` reach the template (e.g. enable_thinking)."""
        import jinja2

        problem = check_messages(messages)
        if problem:
            raise ChatTemplateError(problem)
        try:
            return self.template.render(messages=_normalized(messages), tools=tools, documents=documents,
                                        add_generation_prompt=add_generation_prompt,
                                        **{**self.special_tokens, **kwargs})
        except jinja2.exceptions.TemplateError as e:  # raise_exception, or a template's own error
            raise ChatTemplateError(f"chat template: {e}") from None
