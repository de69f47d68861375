"""How much one message may carry in its header, and how to split work to fit.

Fields travel in the JSON header, which the codec caps at 1 MiB (`codec.py`); bulk
bytes travel as blobs. Batches of records, items or sequence states are therefore cut
by their encoded size as well as by count, to at most `BATCH_BYTES` each.
"""

from __future__ import annotations

BATCH_BYTES = 512 << 10
# One result record travels alone at worst, in a WriteResults and in a ResultBatch.
MAX_RECORD_BYTES = BATCH_BYTES
# A checkpoint travels beside its item (at most 512 KiB on storage) in one assignment.
MAX_CHECKPOINT_BYTES = 384 << 10


def by_size(entries: list, size, limit: int = BATCH_BYTES) -> list[list]:
    """Consecutive groups of entries whose sizes add up to at most `limit` (an entry
    larger than that goes alone)."""
    groups, cur, n = [], [], 0
    for e in entries:
        k = size(e)
        if cur and n + k > limit:
            groups.append(cur)
            cur, n = [], 0
        cur.append(e)
        n += k
    if cur:
        groups.append(cur)
    return groups
