"""Round trips and golden encodings for every message type; every kind of bad message
is refused with the error code that names it."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import orjson
import pytest

from protocol_examples import EXAMPLES
from shoal.protocol.codec import decode, encode, error_reply
from shoal.protocol.errors import ProtocolError
from shoal.protocol.messages import MESSAGES
from shoal.protocol.version import PROTOCOL_MAJOR, PROTOCOL_MINOR

GOLDEN_ROOT = Path(__file__).with_name("golden")
GOLDEN = GOLDEN_ROOT / f"v{PROTOCOL_MAJOR}.{PROTOCOL_MINOR}"
OLDER = sorted(p for p in GOLDEN_ROOT.glob(f"v{PROTOCOL_MAJOR}.*/*.json") if p.parent != GOLDEN)


def test_every_message_type_has_an_example():
    assert set(EXAMPLES) == set(MESSAGES)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_round_trip(name):
    fields, blobs = EXAMPLES[name]
    msg = decode(encode(name, fields, blobs, msg_id="m-1", reply_to="m-0"))
    assert (msg.type, msg.id, msg.reply_to) == (name, "m-1", "m-0")
    assert msg.fields == MESSAGES[name].fill(fields)
    assert {k: bytes(v) for k, v in msg.blobs.items()} == blobs


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_golden_encoding(name):
    """The bytes on the wire are fixed: a change here breaks compatibility with running
    nodes. Regenerate deliberately with SHOAL_REGEN_GOLDEN=1 (and bump the version)."""
    fields, blobs = EXAMPLES[name]
    frames = encode(name, fields, blobs, msg_id="golden", reply_to=None)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("SHOAL_REGEN_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps([base64.b64encode(bytes(f)).decode() for f in frames], indent=1) + "\n")
    stored = [base64.b64decode(f) for f in json.loads(path.read_text())]
    assert [bytes(f) for f in frames] == stored
    assert decode(stored).fields == MESSAGES[name].fill(fields)


@pytest.mark.parametrize("path", OLDER, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_older_minor_versions_still_decode(path):
    """A node of an older minor version keeps working with this one: its messages
    decode, and the fields added since take their defaults."""
    stored = [base64.b64decode(f) for f in json.loads(path.read_text())]
    msg, sent = decode(stored), orjson.loads(stored[0])["f"]
    assert {k: v for k, v in msg.fields.items() if k in sent} == sent
    added = [f for f in MESSAGES[path.stem].fields if f.name not in sent]
    assert all(msg.fields[f.name] == (f.default() if callable(f.default) else f.default) for f in added)


def header(**over):
    h = {"v": [1, 0], "type": "Ping", "id": "x", "re": None, "blobs": [], "f": {"sent_at": 1.0}}
    h.update(over)
    return orjson.dumps(h)


@pytest.mark.parametrize("frames, code, text", [
    ([], "malformed", "no frames"),
    ([b""], "malformed", "empty header"),
    ([b"\xff\x00garbage"], "malformed", "not JSON"),
    ([b"[1, 2]"], "malformed", "not an object"),
    ([header(v=[2, 0])], "bad_version", "2.0 is not compatible"),
    ([header(v="1.0")], "malformed", "version"),
    ([header(type="Teleport")], "unknown_type", "Teleport"),
    ([header(), b"extra"], "blob_count", "names 0 blobs, message has 1"),
    ([header(type="SequenceState", f={"state": {}}, blobs=["kv"])], "blob_count", "names 1 blobs, message has 0"),
    ([header(f={"sent_at": "soon"})], "invalid_field", "Ping.sent_at must be float"),
    ([header(type="JobStatusQuery", f={})], "invalid_field", "lacks required field 'job_id'"),
    ([header(f={"sent_at": 1.0, "bogus": 1})], "invalid_field", "unknown field 'bogus'"),
    ([header(id=5)], "malformed", "id and re must be strings"),
])
def test_bad_messages_get_a_named_error(frames, code, text):
    with pytest.raises(ProtocolError) as info:
        decode(frames)
    assert info.value.code == code and text in str(info.value)
    reply = decode(error_reply(info.value, about="test"))
    assert reply.type == "Error" and reply["code"] == code


def test_oversized_messages_are_refused():
    with pytest.raises(ProtocolError, match="too_large"):
        decode(encode("SequenceState", {"state": {}}, {"kv": b"x" * 2000}), max_bytes=1000)
    with pytest.raises(ProtocolError, match="header of"):
        decode([b"{" + b" " * (1 << 20) + b"}"])


def test_newer_minor_version_fields_are_ignored():
    from shoal.protocol.version import PROTOCOL_MAJOR, PROTOCOL_MINOR

    newer = [PROTOCOL_MAJOR, PROTOCOL_MINOR + 1]
    msg = decode([header(v=newer, f={"sent_at": 2.0, "added_in_a_newer_minor": [1]})])
    assert msg.fields == {"sent_at": 2.0} and msg.version == tuple(newer)


def test_sender_bugs_are_caught_on_encode():
    with pytest.raises(ProtocolError, match="no field 'nope'"):
        encode("Ping", {"nope": 1})
    with pytest.raises(ProtocolError, match="unknown_type"):
        encode("Nope", {})
    with pytest.raises(ProtocolError, match="carries no blob"):
        encode("Ping", {}, {"kv": b"x"})


def test_nested_shapes_are_checked_before_a_handler_sees_them():
    """A sequence without its seq_id, a finished id that is a dict, a moved entry that
    is not a pair: refused by the codec with the place named."""
    import pytest

    from shoal.protocol.codec import decode, encode
    from shoal.protocol.errors import ProtocolError

    good = encode("AssignSequences", {"epoch": 1, "job_id": "j", "sequences": [{"seq_id": 1, "item": {}}]})
    assert decode(good)["sequences"][0]["seq_id"] == 1
    for msg_type, fields, where in (
            ("AssignSequences", {"epoch": 1, "job_id": "j", "sequences": [{"seq_id": 1}, {"item": {}}]}, "sequences[1]"),
            ("ProgressReport", {"node_id": "w", "finished": [{"id": 1}]}, "finished"),
            ("ProgressReport", {"node_id": "w", "moved": [["s1"]]}, "moved"),
            ("ImportSequence", {"transfer_id": "t", "job_id": "j", "program": "p", "sequence": {"seq_id": 1}}, "sequence"),
            ("Holding", {"node_id": "w", "jobs": {"j": 3}}, "jobs")):
        with pytest.raises(ProtocolError, match=rf"{msg_type}\.{where.replace('[', '.').replace(']', '.')}") as e:
            encode(msg_type, fields)
        assert e.value.code == ProtocolError.INVALID_FIELD
