import pytest

from shoal.nodes.worker.block_manager import BlockManager, OutOfBlocks, block_hash


def hashes(tokens, bs):
    out, parent = [], None
    for i in range(len(tokens) // bs):
        parent = block_hash(parent, tokens[i * bs : (i + 1) * bs])
        out.append(parent)
    return out


def test_allocate_and_release_count_blocks():
    bm = BlockManager(8, 4)
    a = bm.allocate(3)
    assert len(set(a)) == 3 and bm.num_free == 5 and bm.num_used == 3
    bm.release(a)
    assert bm.num_free == 8
    with pytest.raises(OutOfBlocks, match="need 9 KV blocks, 8 free"):
        bm.allocate(9)


def test_double_release_is_an_error():
    bm = BlockManager(2, 4)
    a = bm.allocate(1)
    bm.release(a)
    with pytest.raises(RuntimeError):
        bm.release(a)


def test_hash_chains_over_the_prefix():
    assert hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)[1] != hashes([9, 9, 9, 9, 5, 6, 7, 8], 4)[1]
    assert hashes([1, 2, 3, 4], 4) == hashes([1, 2, 3, 4, 0], 4)


def test_prefix_sharing_with_reference_counts():
    bm = BlockManager(8, 4)
    toks = list(range(10))
    blocks = bm.allocate(3)
    for b, h in zip(blocks, hashes(toks, 4)):
        bm.register_full_block(b, h)
    hs = hashes(toks + [77], 4)
    cached = [bm.cached.get(h) for h in hs]
    assert cached == blocks[:2]
    assert bm.free_blocks_needed(cached) == 0  # in use by the first sequence
    bm.take_cached(cached)
    assert bm.ref[blocks[0]] == 2
    bm.release(blocks)
    assert bm.ref[blocks[0]] == 1 and bm.num_free == 6
    bm.release(cached)
    assert bm.num_free == 8
    # Freed, yet still cached until the space is needed; reusing costs a free block.
    assert bm.cached.get(hs[0]) == blocks[0]
    assert bm.free_blocks_needed([blocks[0]]) == 1


def test_reuse_evicts_least_recently_freed_and_drops_its_hash():
    bm = BlockManager(3, 2)
    a = bm.allocate(3)
    for i, b in enumerate(a):
        bm.register_full_block(b, bytes([i]) * 16)
    bm.release([a[0]])
    bm.release([a[1]])
    (b,) = bm.allocate(1)
    assert b == a[0] and bytes([0]) * 16 not in bm.cached and bytes([1]) * 16 in bm.cached


def test_duplicate_content_keeps_first_cached_entry():
    bm = BlockManager(4, 2)
    a, b = bm.allocate(2)
    h = b"h" * 16
    bm.register_full_block(a, h)
    bm.register_full_block(b, h)
    assert bm.cached[h] == a
    bm.release([b])
    bm.allocate(3)  # recycles b among others; a's entry must survive
    assert bm.cached[h] == a
