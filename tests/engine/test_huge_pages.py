"""The KV cache's memory: 2 MB-aligned and advised to use 2 MB pages where Linux has them."""

import mmap
from pathlib import Path

import torch

from shoal.nodes.worker import huge_pages
from shoal.nodes.worker.kv_cache import KVCache
from shoal.nodes.worker.models.config import load_decoder_config


def thp_mode() -> str:
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return path.read_text().split("[")[1].split("]")[0] if path.exists() else "never"


def thp_eligible(address: int) -> bool | None:
    """/proc/self/smaps's THPeligible for the mapping holding `address` (None: no such field)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "THPeligible:":
            return line.split()[1] == "1"
    return None


def test_empty_is_aligned_writable_and_advised():
    t = huge_pages.empty((2, 4096, 4, 64), torch.bfloat16)
    assert t.shape == (2, 4096, 4, 64) and t.dtype == torch.bfloat16 and t.is_contiguous()
    if getattr(mmap, "MADV_HUGEPAGE", None) is None:
        return  # not Linux: a plain torch.empty, checked above
    assert t.data_ptr() % huge_pages.HUGE_PAGE == 0
    t.fill_(1.5)
    t[1, 4095, 3, 63] = -2.0
    assert t.float().sum().item() == 1.5 * (t.numel() - 1) - 2.0
    if thp_mode() != "never":
        assert thp_eligible(t.data_ptr()) is not False


def test_small_tensors_are_plain():
    t = huge_pages.empty((16, 64), torch.float32)
    assert t.shape == (16, 64) and t.dtype == torch.float32


def test_kv_cache_round_trips_on_its_pages(tiny_model):
    cfg = load_decoder_config(tiny_model)
    cache = KVCache(cfg, num_blocks=2048, block_size=16, dtype=torch.float32)
    shape = (2, 2048 * 16, cfg.num_kv_heads, cfg.head_dim)
    assert [tuple(layer.shape) for layer in cache.layers] == [shape] * cfg.num_layers
    kv = torch.randn(cfg.num_layers, 2, 20, cfg.num_kv_heads, cfg.head_dim)
    cache.write([7, 3], kv)
    assert torch.equal(cache.read([7, 3], 20), kv)


def resident_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * mmap.PAGESIZE


def test_prefault_commits_the_cache_at_start_and_only_when_asked(tiny_model):
    cfg = load_decoder_config(tiny_model)
    blocks = 8192  # the tiny model's fp32 K/V: 512 bytes a token, 64 MiB in all
    before = resident_bytes()
    lazy = KVCache(cfg, num_blocks=blocks, block_size=16, dtype=torch.float32)
    assert resident_bytes() - before < lazy.nbytes // 4  # nothing written: nothing committed
    before = resident_bytes()
    eager = KVCache(cfg, num_blocks=blocks, block_size=16, dtype=torch.float32, prefault_bytes=1 << 40)
    assert eager.nbytes == 64 << 20
    assert resident_bytes() - before >= 0.9 * eager.nbytes
    kv = torch.randn(cfg.num_layers, 2, 20, cfg.num_kv_heads, cfg.head_dim)
    eager.write([5, 9], kv)
    assert torch.equal(eager.read([5, 9], 20), kv)


def test_prefault_commits_only_the_lowest_blocks_up_to_its_bytes(tiny_model):
    """A cache larger than the prefault: the first 16 MiB of its 64 MiB are committed (the
    blocks the block manager hands out first), and the blocks above still work."""
    cfg = load_decoder_config(tiny_model)
    before = resident_bytes()
    cache = KVCache(cfg, num_blocks=8192, block_size=16, dtype=torch.float32, prefault_bytes=16 << 20)
    grown = resident_bytes() - before
    assert 0.9 * (16 << 20) <= grown < 0.5 * cache.nbytes
    kv = torch.randn(cfg.num_layers, 2, 20, cfg.num_kv_heads, cfg.head_dim)
    cache.write([8191, 0], kv)
    assert torch.equal(cache.read([8191, 0], 20), kv)


def test_engine_prefault_default_follows_the_environment(monkeypatch):
    from shoal.nodes.worker.engine_config import EngineConfig

    monkeypatch.setenv("SHOAL_KV_PREFAULT", "0")
    assert EngineConfig().kv_prefault is False
    monkeypatch.setenv("SHOAL_KV_PREFAULT", "1")
    assert EngineConfig().kv_prefault is True
    monkeypatch.delenv("SHOAL_KV_PREFAULT")
    assert EngineConfig().kv_prefault is True and EngineConfig(kv_prefault=False).kv_prefault is False


def test_an_engine_with_its_cache_committed_generates_the_same(tiny_model):
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    outs = []
    for prefault in (True, False):
        eng = LLMEngine(tiny_model, EngineConfig(kv_prefault=prefault, kv_cache_bytes=64 << 20, policy="mb"))
        for i, n in enumerate((5, 40, 130)):
            eng.add_request(i, prompt_token_ids=list(range(1, n + 1)), params=SamplingParams(max_tokens=12, ignore_eos=True))
        done = []
        while eng.has_unfinished():
            done += eng.step()
        outs.append(sorted((o.seq_id, o.token_ids) for o in done))
    assert outs[0] == outs[1] and all(len(t) == 12 for _, t in outs[0])
