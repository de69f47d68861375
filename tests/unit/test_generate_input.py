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


def test_a_refused_line_does_not_claim_its_id(tmp_path):
    from shoal.generate_input import read_generate_items_skipping

    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "x", "prompt": "a", "temperature": -1}\n{"id": "x", "prompt": "b"}\n'
                    '{"id": "x", "prompt": "c"}\n')
    items, errors = read_generate_items_skipping(path)
    assert [it.prompt for it in items] == ["b"]
    assert [e["line"] for e in errors] == [1, 3]
    assert "temperature" in errors[0]["error"] and "duplicate id 'x' (first on line 2)" in errors[1]["error"]
