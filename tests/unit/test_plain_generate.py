"""The generate program's Generate enters the journal copied, not round-tripped through
JSON (`Generate.plain_dict`): what it records must equal the round trip's form exactly,
or a resumed sequence's replay would call its program not deterministic."""

from __future__ import annotations

import pytest

from shoal.coroutine import SequenceCoroutine, _plain
from shoal.program import resolve_program

CASES = [
    ({"ignore_eos": True}, {"id": 1, "prompt_token_ids": [5, 7], "max_tokens": 1}),
    ({"stop": ["a", "b"], "logit_bias": {"5": 2.0}, "n": 2, "temperature": 0.7, "seed": 3}, {"id": 2, "prompt": "hi"}),
    ({"json_schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}, {"id": 3, "prompt_token_ids": [1]}),
    ({"choice": ["yes", "no"], "logprobs": 3}, {"id": 4, "prompt_token_ids": [1, 2], "stop_token_ids": [9]}),
    ({}, {"id": 5, "messages": [{"role": "user", "content": "x"}]}),
]


@pytest.mark.parametrize("params, item", CASES)
def test_the_recorded_operation_equals_its_json_round_trip(params, item):
    co = SequenceCoroutine(resolve_program("generate"), item, params, item["id"])
    op = co.start()
    assert co.current == _plain(op.to_dict())
    assert op.is_plain == ("messages" not in item)  # a chat goes the round trip's way


def test_two_items_records_share_no_mutable_part():
    spec = resolve_program("generate")
    a, b = (SequenceCoroutine(spec, {"id": i, "prompt_token_ids": [1, 2]}, {"stop": ["x"]}, i) for i in (1, 2))
    a.start()
    b.start()
    a.current["params"]["max_tokens"] = 999
    assert b.current["params"]["max_tokens"] != 999
