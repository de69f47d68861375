"""Item ids seen, each with the place (input line) it was first seen, in little memory:
what checking a job's input for repeated ids and a running job's result log keep per item.

Items' ids are strings or integers, and jobs mostly number them 0, 1, 2, ... in input
order: such an id is a bit in a bitmap (a million cost 125 KB where a dict of them costs
~100 MB), and its place is the id plus the one offset the numbering has (the first id's
place minus the id). The bitmap grows to cover the largest id while it stays within
BITMAP_BYTES_PER_ID bytes per id it holds; any other id (a string, a negative or far-off
number, one off the numbering) is kept in a dict with its place, at a dict's price.

Keys are the ids themselves, so 1 and "1" stay apart, as on the wire; not their JSON
bytes from orjson, each of which holds on to a ~1 KB output buffer.
"""

from __future__ import annotations

import orjson

BITMAP_BYTES_PER_ID = 8  # a sparse numbering may cost this much per id before ids go to the dict
BITMAP_SLACK_BYTES = 64 << 10


def item_key(item_id):
    """An id as a set member or dict key: itself if a string or an integer, else its JSON text."""
    if type(item_id) is str or type(item_id) is int:
        return item_id
    return ("json", orjson.dumps(item_id).decode())


class SeenIds:
    def __init__(self):
        self.bits = bytearray()
        self.in_bits = 0
        self.delta: int | None = None  # place - id of the ids in the bitmap
        self.others: dict = {}  # item_key -> place

    def __len__(self) -> int:
        return self.in_bits + len(self.others)

    def _bit(self, key) -> bool:
        return type(key) is int and 0 <= key < 8 * len(self.bits) and bool(self.bits[key >> 3] >> (key & 7) & 1)

    def __contains__(self, item_id) -> bool:
        key = item_key(item_id)
        return self._bit(key) or key in self.others

    def place(self, item_id) -> int | None:
        """Where the id was first seen (None if it was not)."""
        key = item_key(item_id)
        if self._bit(key):
            return key + self.delta
        return self.others.get(key)

    def _room_for(self, key) -> bool:
        need = (key >> 3) + 1
        if need <= len(self.bits):
            return True
        if need > BITMAP_BYTES_PER_ID * (self.in_bits + 1) + BITMAP_SLACK_BYTES:
            return False
        self.bits.extend(bytes(max(need, 2 * len(self.bits)) - len(self.bits)))
        return True

    def add(self, item_id, place: int | None = None) -> bool:
        """Records the id as first seen at `place` (None: a set of ids, no places kept);
        False (and nothing changes) if it was seen."""
        key = item_key(item_id)
        if self._bit(key) or key in self.others:
            return False
        numbered = type(key) is int and key >= 0
        delta = self.delta if place is None or not numbered else place - key
        if numbered and (self.delta is None or delta == self.delta) and self._room_for(key):
            self.delta = 0 if delta is None else delta
            self.bits[key >> 3] |= 1 << (key & 7)
            self.in_bits += 1
        else:
            self.others[key] = 0 if place is None else place
        return True

    def discard(self, item_id) -> None:
        key = item_key(item_id)
        if self._bit(key):
            self.bits[key >> 3] &= ~(1 << (key & 7)) & 0xFF
            self.in_bits -= 1
        else:
            self.others.pop(key, None)
