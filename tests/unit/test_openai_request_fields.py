"""The structured-output, logprobs, n and penalty fields of a batch line, read into a
generate item; and logprobs written in OpenAI's shapes."""

from __future__ import annotations

import pytest

from shoal.openai_requests import RequestLineError, parse_request
from shoal.openai_responses import chat_logprobs, completion_logprobs

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def line(url="/v1/chat/completions", **body):
    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}]} if "chat" in url else {"model": "m", "prompt": "x"}
    return {"custom_id": "c", "method": "POST", "url": url, "body": {**base, **body}}


@pytest.mark.parametrize("body, want", [
    ({"response_format": {"type": "json_object"}}, {"json_schema": {"type": "object"}}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "strict": True}}},
     {"json_schema": SCHEMA}),
    ({"response_format": {"type": "text"}}, {}),
    ({"structured_outputs": {"regex": "[0-9]+"}}, {"regex": "[0-9]+"}),
    ({"structured_outputs": {"choice": ["a", "b"]}}, {"choice": ["a", "b"]}),
    ({"structured_outputs": {"json": SCHEMA}}, {"json_schema": SCHEMA}),
    ({"guided_json": SCHEMA}, {"json_schema": SCHEMA}),
    ({"guided_regex": "a+"}, {"regex": "a+"}),
    ({"guided_choice": ["x"]}, {"choice": ["x"]}),
    ({"logprobs": True}, {"logprobs": 0}),
    ({"logprobs": True, "top_logprobs": 5}, {"logprobs": 5}),
    ({"logprobs": False}, {}),
    ({"n": 3, "seed": 9, "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
      "min_tokens": 2, "logit_bias": {"17": -100}},
     {"n": 3, "seed": 9, "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
      "min_tokens": 2, "logit_bias": {"17": -100}}),
    ({"max_completion_tokens": 7}, {"max_tokens": 7}),
])
def test_chat_fields_become_item_fields(body, want):
    item = parse_request(line(**body), 1).item
    for k, v in want.items():
        assert item[k] == v, k
    for k in {"json_schema", "regex", "choice", "logprobs"} - set(want):
        assert k not in item


def test_a_completion_s_logprobs_is_its_count():
    assert parse_request(line("/v1/completions", logprobs=3), 1).item["logprobs"] == 3
    assert "logprobs" not in parse_request(line("/v1/completions", logprobs=None), 1).item


@pytest.mark.parametrize("body, message", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}, "json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "objekt"}}}}, "does not compile"),
    ({"response_format": {"type": "grammar"}}, "response_format type 'grammar'"),
    ({"structured_outputs": {"grammar": "start: x"}}, "structured_outputs.grammar is not supported"),
    ({"guided_json": SCHEMA, "guided_regex": "a"}, "give one structured output"),
    ({"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, "give one structured output"),
    ({"top_logprobs": 2}, "top_logprobs needs logprobs: true"),
    ({"logprobs": 3}, "logprobs must be true or false"),
    ({"logprobs": True, "top_logprobs": 21}, "from 0 to 20"),
    ({"n": 0}, "n must be an integer from 1"),
    ({"presence_penalty": 5}, "presence_penalty must be a number from -2 to 2"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"best_of": 3}, "best_of=3 is not supported"),
    ({"guided_regex": "(?<=a)b"}, "look-around"),
])
def test_bad_fields_are_refused_naming_them(body, message):
    with pytest.raises(RequestLineError) as e:
        parse_request(line(**body), 4)
    assert message in str(e.value) and "line 4 (c)" in str(e.value)


def test_logprobs_in_openai_shapes():
    from openai.types import CompletionChoice
    from openai.types.chat.chat_completion import ChoiceLogprobs

    entries = [{"token": "He", "token_id": 1, "logprob": -0.5, "bytes": [72, 101],
                "top_logprobs": [{"token": "He", "token_id": 1, "logprob": -0.5, "bytes": [72, 101]},
                                 {"token": "A", "token_id": 2, "logprob": -1.5, "bytes": [65]}]},
               {"token": "llo", "token_id": 3, "logprob": -0.1, "bytes": [108, 108, 111], "top_logprobs": []}]
    chat = ChoiceLogprobs.model_validate(chat_logprobs(entries))
    assert [t.token for t in chat.content] == ["He", "llo"] and chat.content[0].top_logprobs[1].logprob == -1.5
    comp = completion_logprobs(entries)
    choice = CompletionChoice.model_validate({"index": 0, "text": "Hello", "finish_reason": "length", "logprobs": comp})
    assert choice.logprobs.text_offset == [0, 2] and choice.logprobs.top_logprobs[0] == {"He": -0.5, "A": -1.5}
    assert choice.logprobs.token_logprobs == [-0.5, -0.1]
