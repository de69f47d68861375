"""The one request contract: fields, checks, "the item's setting wins", an exact wire form."""

from __future__ import annotations

from dataclasses import fields

import pytest

from shoal.protocol.generation_settings import FIELDS as WIRE_FIELDS, max_tokens_for, resolve
from shoal.request_settings import GenerationSettings, SettingsError, check_item
from shoal.sampling import SamplingParams


def test_the_protocol_s_fields_are_the_settings_fields():
    assert WIRE_FIELDS == (*(f.name for f in fields(SamplingParams)), "n")


@pytest.mark.parametrize("wire", [
    {},
    {"max_tokens": 9, "temperature": 0.5, "top_p": 0.9, "top_k": 4, "seed": 3, "stop": ["x"], "stop_token_ids": [2]},
    {"json_schema": {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}, "n": 3},
    {"regex": "[a-z]+", "logprobs": 5, "logit_bias": {"7": -1.5}, "min_tokens": 2, "presence_penalty": 0.1},
    {"choice": ["yes", "no"], "repetition_penalty": 1.2, "frequency_penalty": -0.3, "return_margins": True},
])
def test_the_wire_form_round_trips_exactly(wire):
    settings = GenerationSettings.from_wire(wire)
    again = GenerationSettings.from_wire(settings.to_wire())
    assert again == settings and again.to_wire() == settings.to_wire()
    for k, v in wire.items():
        assert settings.to_wire()[k] == v, k


@pytest.mark.parametrize("wire, field", [
    ({"temprature": 0.5}, "temprature"), ({"temperature": "hot"}, "temperature"), ({"max_tokens": 0}, "max_tokens"),
    ({"top_p": 2}, "top_p"), ({"n": 500}, "n"), ({"logprobs": 30}, "logprobs"),
    ({"regex": "(?=x)"}, "regex"), ({"min_tokens": 80}, "min_tokens"), ({"stop": "x"}, "stop"),
])
def test_a_bad_setting_is_refused_naming_it(wire, field):
    with pytest.raises(SettingsError) as e:
        GenerationSettings.from_wire(wire)
    assert e.value.field == field
    if field:
        assert field in str(e.value)


def test_the_item_s_setting_wins_and_a_constraint_is_one_setting():
    job = GenerationSettings.from_wire({"max_tokens": 20, "temperature": 0.7, "json_schema": {"type": "object"}, "n": 2})
    item = {"id": 1, "prompt": "hi", "max_tokens": 5, "regex": "[0-9]+", "temperature": None}
    got = job.resolve(item)
    assert got.sampling.max_tokens == 5 and got.sampling.regex == "[0-9]+" and got.sampling.json_schema is None
    assert got.sampling.temperature == 0.7 and got.n == 2  # a null is no setting: the job's stays
    assert job.resolve({"id": 2}) is job
    assert resolve(item, job.to_wire())["max_tokens"] == 5
    assert max_tokens_for({"id": 1}, {"max_tokens": 12}) == 12 and max_tokens_for({"max_tokens": 3}, {}) == 3
    assert max_tokens_for({"id": 1}, {"max_tokens": "lots"}) == SamplingParams.max_tokens


def test_an_item_is_checked_alone_and_its_relations_where_they_meet():
    assert check_item({"id": 1, "min_tokens": 100}) == {"min_tokens": 100}  # the job may allow 100
    with pytest.raises(SettingsError, match="exceeds max_tokens"):
        GenerationSettings.from_wire({"max_tokens": 50}).resolve({"min_tokens": 100})
    with pytest.raises(SettingsError, match="unknown setting"):
        GenerationSettings.from_wire({"temprature": 1})


def test_checkpoints_refuse_settings_they_do_not_know():
    with pytest.raises(ValueError, match="unknown sampling setting"):
        SamplingParams.from_dict({"max_tokens": 3, "bogus": 1})
