"""A streamed layer's host copy (`host_layer.py`): one allocation holding every weight
at a page boundary, equal to the weights it copied; locked once when asked, and unlocked
(before its memory is freed) when the layer is dropped; a lock that fails leaves it
pageable and working."""

from __future__ import annotations

import gc

import torch

from shoal.nodes.worker.host_layer import ALIGN, HostLayer


def weights():
    g = torch.Generator().manual_seed(0)
    return [("attn.qkv", torch.randn(96, 64, generator=g).to(torch.bfloat16)),
            ("norm", torch.randn(64, generator=g)),
            ("mlp.gate_up", torch.randn(4, 32, 64, generator=g).to(torch.bfloat16))]


def test_one_allocation_holds_every_weight_page_aligned():
    params = weights()
    layer = HostLayer(params)
    base = layer.buffer.data_ptr()
    for name, t in params:
        view = layer.views[name]
        assert view.dtype == t.dtype and view.shape == t.shape and view.is_contiguous()
        assert torch.equal(view, t)
        assert view.untyped_storage().data_ptr() == layer.buffer.untyped_storage().data_ptr()  # the one allocation
        assert (view.data_ptr() - base) % ALIGN == 0
        assert view.data_ptr() != t.data_ptr()  # a copy: the loaded weight can be freed
    # No rounding beyond a page per weight (torch's pinned allocator would round each to a power of two).
    assert layer.nbytes < sum(t.numel() * t.element_size() for _, t in params) + len(params) * ALIGN
    assert torch.equal(layer.views["mlp.gate_up"][2], params[2][1][2])  # an expert's rows, as the streamer copies them


def test_layers_lock_pages_of_their_own():
    """The driver locks whole pages and refuses a range sharing a page with one already
    locked: every layer's locked range starts on a page and covers whole pages, so two
    layers malloc placed side by side never share one."""
    locked = []
    layers = [HostLayer(weights()[i:i + 1], lock=lambda ptr, size: locked.append((ptr, size)), unlock=lambda p: None)
              for i in range(3)]
    assert all(layer.locked for layer in layers)
    pages = [set(range(ptr // 4096, (ptr + size) // 4096)) for ptr, size in locked]
    assert all(ptr % 4096 == 0 and size % 4096 == 0 for ptr, size in locked), locked
    assert not (pages[0] & pages[1]) and not (pages[1] & pages[2]) and not (pages[0] & pages[2])


def test_locked_once_and_unlocked_when_dropped():
    locked, unlocked = [], []
    layer = HostLayer(weights(), lock=lambda ptr, size: locked.append((ptr, size)), unlock=unlocked.append)
    assert layer.locked and locked == [(layer.buffer.data_ptr(), layer.buffer.numel())]
    ptr = layer.buffer.data_ptr()
    del layer
    gc.collect()
    assert unlocked == [ptr]


def test_a_lock_that_fails_leaves_the_copy_pageable_and_right():
    params = weights()
    layer = HostLayer(params, lock=lambda ptr, size: "cudaHostRegister returned CUDA error 1",
                      unlock=lambda ptr: (_ for _ in ()).throw(AssertionError("never locked: never unlocked")))
    assert not layer.locked
    assert all(torch.equal(layer.views[n], t) for n, t in params)
    del layer
    gc.collect()


def test_lock_for_life_unlocks_before_the_memory_goes():
    from shoal.nodes.worker.page_lock import lock_for_life

    class Owner:
        pass

    events = []
    owner, arena = Owner(), torch.empty(1 << 16, dtype=torch.bfloat16)
    ptr = arena.data_ptr()
    assert lock_for_life(owner, arena, lock=lambda p, n: events.append(("lock", p, n)),
                         unlock=lambda p: events.append(("unlock", p))) is None
    del arena  # the owner's finalizer keeps the memory while it is registered
    assert events == [("lock", ptr, 1 << 17)]
    del owner
    gc.collect()
    assert events == [("lock", ptr, 1 << 17), ("unlock", ptr)]
    assert lock_for_life(Owner(), torch.empty(8), lock=lambda p, n: "refused") == "refused"


def test_the_real_lock_without_a_gpu_says_why_and_raises_nothing():
    from shoal.nodes.worker.page_lock import page_lock, page_unlock

    t = torch.empty(1 << 12, dtype=torch.uint8)
    why = page_lock(t.data_ptr(), t.numel())
    assert isinstance(why, str) and why
    page_unlock(t.data_ptr())
    layer = HostLayer(weights(), lock=page_lock)  # the streamer's call on a machine whose CUDA is missing
    assert not layer.locked
