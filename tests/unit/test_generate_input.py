import pytest

from shoal.generate_input import InputError, read_generate_items


def write(tmp_path, text):
    p = tmp_path / "in.jsonl"
    p.write_text(text)
    return p


def test_reads_prompts_and_token_ids(tmp_path):
    items = read_generate_items(write(tmp_path, '{"id": 1, "prompt": "hi"}\n\n{"id": "b", "prompt_token_ids": [1, 2], "max_tokens": 3}\n'))
    assert [(i.id, i.prompt, i.prompt_token_ids, i.max_tokens) for i in items] == [(1, "hi", None, None), ("b", None, [1, 2], 3)]


@pytest.mark.parametrize("text, message", [
    ('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n', r"in.jsonl:2: duplicate id 1 \(first on line 1\)"),
    ('{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": \n', r"in.jsonl:2: not valid JSON"),
    ('{"prompt": "a"}\n', r"in.jsonl:1: .*\"id\""),
    ('{"id": 1}\n', r"exactly one of"),
    ('{"id": 1, "prompt_token_ids": [1, "x"]}\n', r"list of integers"),
    ('{"id": 1, "prompt": "a", "max_tokens": 0}\n', r"max_tokens must be a positive integer"),
    ('{"id": [1], "prompt": "a"}\n', r"id must be a string or an integer"),
])
def test_bad_lines_name_file_and_line(tmp_path, text, message):
    with pytest.raises(InputError, match=message):
        read_generate_items(write(tmp_path, text))


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_generate_items(tmp_path / "nope.jsonl")
