"""Chat templates render as transformers renders them: the same token ids from
`TextTokenizer.encode_chat` as from `apply_chat_template(..., tokenize=True)` on the same
folder, for templates in the styles of the common model families, written here."""

from __future__ import annotations

import json
import shutil

import pytest

from shoal.chat_template import ChatTemplate, ChatTemplateError

# Llama 3 style: BOS from the special tokens, headers, trimmed content, a dated system turn.
LLAMA3 = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Today Date: " + strftime_now("%d %b %Y") + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Mistral style: roles must alternate (raise_exception), EOS after each answer.
MISTRAL = """{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"""

# Tools as JSON (tojson must not escape HTML), a namespace, loop controls, {% generation %}.
TOOLS = """{%- set ns = namespace(turns=0) %}
{%- if tools %}
<tools>
{%- for tool in tools %}
{{ tool | tojson(indent=2) }}
{%- endfor %}
</tools>
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'tool' %}{% continue %}{% endif %}
    {%- set ns.turns = ns.turns + 1 %}
    {%- if message.role == 'assistant' %}
<|im_start|>assistant
{% generation %}{{ message.content }}{% endgeneration %}<|im_end|>
    {%- else %}
<|im_start|>{{ message.role }} {{ ns.turns }}
{{ message.content }}<|im_end|>
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

# Qwen3 style: reasoning under older names, and a flag the caller passes (enable_thinking).
THINKING = """{%- for message in messages %}
{%- if message.role == 'assistant' and message.reasoning_content is defined %}
<|im_start|>assistant
<think>{{ message.reasoning_content }}</think>{{ message.content }}<|im_end|>
{%- else %}
<|im_start|>{{ message.role }}
{{ message.content if message.content is string else message.content | map(attribute='text') | join('') }}<|im_end|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
<|im_start|>assistant
{%- if enable_thinking is defined and enable_thinking is false %}
<think>

</think>
{%- endif %}
{%- endif %}"""

CHAT = [
    {"role": "system", "content": "  You answer briefly.  "},
    {"role": "user", "content": "Is <b>2 & 2</b> four?"},
    {"role": "assistant", "content": "Yes.", "reasoning": "Two and two make four."},
    {"role": "user", "content": [{"type": "text", "text": "And é "}, {"type": "text", "text": "ünicode?"}]},
]
TOOL_LIST = [{"type": "function", "function": {"name": "search", "description": "Find <passages> & more",
                                               "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}]


def _folder(base, tmp_path, template: str | list, **special) -> str:
    folder = tmp_path / "model"
    shutil.copytree(base, folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(chat_template=template, **special)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if special:  # a real checkpoint's vocabulary holds its named special tokens
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tok.add_special_tokens(list(special.values()))
        tok.save(str(folder / "tokenizer.json"))
    return str(folder)


def _both(folder: str, messages, **kwargs) -> tuple[list[int], list[int]]:
    from transformers import AutoTokenizer

    from shoal.nodes.worker.tokenizer import TextTokenizer

    ref = AutoTokenizer.from_pretrained(folder).apply_chat_template(messages, add_generation_prompt=True, **kwargs)
    ref_ids = list(ref["input_ids"] if hasattr(ref, "keys") else ref)
    return TextTokenizer(folder).encode_chat(messages, **kwargs), ref_ids


@pytest.mark.timeout(120)
def test_chatml_from_make_model_matches_transformers(tiny_chat_model):
    ours, ref = _both(str(tiny_chat_model), CHAT[:2] + [CHAT[3]])
    assert ours == ref
    end_of_turn = json.loads((tiny_chat_model / "config.json").read_text())["eos_token_id"][0]
    assert ours[0] == end_of_turn - 1  # <|im_start|> is one special token, not text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name,template,special,kwargs,messages", [
    ("llama3", LLAMA3, {"bos_token": "<|begin_of_text|>"}, {}, CHAT[:2]),
    ("mistral", MISTRAL, {"bos_token": "<s>", "eos_token": "</s>"}, {}, [CHAT[1], {"role": "assistant", "content": "Yes."},
                                                                         {"role": "user", "content": "Sure?"}]),
    ("tools", TOOLS, {}, {"tools": TOOL_LIST}, CHAT[:3] + [{"role": "tool", "content": "x"}]),
    ("thinking", THINKING, {}, {"enable_thinking": False}, CHAT),
])
def test_family_templates_match_transformers(tiny_chat_model, tmp_path, name, template, special, kwargs, messages):
    ours, ref = _both(_folder(tiny_chat_model, tmp_path, template, **special), messages, **kwargs)
    assert ours == ref, name


@pytest.mark.timeout(120)
def test_named_templates_and_jinja_file(tiny_chat_model, tmp_path):
    named = [{"name": "tool_use", "template": TOOLS}, {"name": "default", "template": MISTRAL}]
    folder = _folder(tiny_chat_model, tmp_path, named, bos_token="<s>", eos_token="</s>")
    assert ChatTemplate.from_model_dir(folder).source == MISTRAL
    (tmp_path / "model" / "chat_template.jinja").write_text(LLAMA3)
    ours, ref = _both(folder, CHAT[:2])
    assert ours == ref and ChatTemplate.from_model_dir(folder).source == LLAMA3


@pytest.mark.timeout(60)
def test_template_errors_name_the_problem(tiny_chat_model, tiny_model, tmp_path):
    from shoal.nodes.worker.tokenizer import TextTokenizer

    folder = _folder(tiny_chat_model, tmp_path, MISTRAL, bos_token="<s>", eos_token="</s>")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        TextTokenizer(folder).encode_chat([CHAT[1], CHAT[1]])
    with pytest.raises(ChatTemplateError, match="has no chat template"):
        TextTokenizer(tiny_model).encode_chat(CHAT[1:2])
    with pytest.raises(ChatTemplateError, match=r"messages\[0\] needs a string \"role\""):
        TextTokenizer(folder).encode_chat([{"content": "hi"}])
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% for m in messages %}")
