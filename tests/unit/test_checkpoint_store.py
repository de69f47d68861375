"""Checkpoints on storage only move forward, survive a restart, and a torn tail is cut."""

from __future__ import annotations

from shoal.nodes.storage.checkpoint_store import CheckpointStore


def state(ops: int, tokens: int) -> dict:
    return {"journal": [{"op": {}, "result": {}}] * ops, "generated": {"output_token_ids": [1] * tokens}}


def test_only_newer_checkpoints_are_kept_and_survive_a_restart(tmp_path):
    path = tmp_path / "checkpoints.jsonl"
    store = CheckpointStore(path)
    none_done = lambda i: False  # noqa: E731
    assert store.record([{"id": "a", "state": state(0, 8)}, {"id": 7, "state": state(1, 0)}], none_done) == 2
    # Older or equal progress (a late or re-sent checkpoint) never winds a sequence back.
    assert store.record([{"id": "a", "state": state(0, 4)}, {"id": 7, "state": state(0, 90)}], none_done) == 0
    assert store.record([{"id": "a", "state": state(1, 0)}], none_done) == 1
    # A sequence with its result needs no checkpoint.
    assert store.record([{"id": "done", "state": state(3, 0)}], lambda i: i == "done") == 0
    store.commit()
    store.close()
    with open(path, "ab") as fh:
        fh.write(b'{"id": "b", "state": {"jour')  # a crash mid-write
    again = CheckpointStore(path)
    assert again.get("a") == state(1, 0) and again.get(7) == state(1, 0) and again.get("b") is None
    assert path.read_bytes().endswith(b"\n")
    again.forget("a")
    assert again.get("a") is None
    again.close()
