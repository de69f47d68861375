"""The native paged attention kernel against the SDPA reference, span by span.

Random head shapes, block tables with holes (blocks scattered over a cache with unused
blocks between them), contexts from 1 to several thousand tokens, decode spans (one row)
mixed with cached-prefix prefill spans (many rows, causal), fp32 and bf16 caches.
"""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from native_builds import builds, load

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", params=builds())
def kernel(request):
    return load(request.param)


def reference(q, k_cache, v_cache, tables, rows, lens, ctx, bs, scale):
    """Each span gathered from the cache, then SDPA with the causal mask of its rows."""
    out = torch.full(q.shape, float("nan"))
    H, KVH = q.shape[1], k_cache.shape[1]
    for s in range(len(rows)):
        r, n, c = int(rows[s]), int(lens[s]), int(ctx[s])
        pos = torch.arange(c)
        slots = tables[s][pos // bs] * bs + pos % bs
        k = k_cache[slots].float().transpose(0, 1).unsqueeze(0)  # [1, KVH, c, D]
        v = v_cache[slots].float().transpose(0, 1).unsqueeze(0)
        qs = q[r : r + n].float().transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        mask = pos.unsqueeze(0) <= torch.arange(c - n, c).unsqueeze(1)  # row i sees c - n + i + 1
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale, enable_gqa=H != KVH)
        out[r : r + n] = o[0].transpose(0, 1)
    return out


def random_case(rng: random.Random, kernel, dtype, spans, bs, H, KVH, D):
    """`spans`: (rows, context) pairs. Blocks are drawn without replacement from a cache
    twice as large as needed, so tables have holes and arbitrary order."""
    need = sum(-(-c // bs) for _, c in spans)
    num_blocks = 2 * need + 3
    free = list(range(num_blocks))
    rng.shuffle(free)
    width = max(-(-c // bs) for _, c in spans)
    tables = torch.zeros(len(spans), width, dtype=torch.long)
    rows, lens, ctx, row = [], [], [], 0
    for s, (n, c) in enumerate(spans):
        nb = -(-c // bs)
        tables[s, :nb] = torch.tensor([free.pop() for _ in range(nb)])
        rows.append(row)
        lens.append(n)
        ctx.append(c)
        row += n
    g = torch.Generator().manual_seed(rng.randrange(1 << 30))
    q = torch.randn(row + 3, H, D, generator=g)  # 3 rows no span covers
    k_cache = (torch.randn(num_blocks * bs, KVH, D, generator=g) * 2).to(dtype)
    v_cache = torch.randn(num_blocks * bs, KVH, D, generator=g).to(dtype)
    rows, lens, ctx = (torch.tensor(x, dtype=torch.long) for x in (rows, lens, ctx))
    scale = D**-0.5
    out = torch.full_like(q, 7.0)
    kernel.paged_attention(q, k_cache, v_cache, tables, rows, lens, ctx, bs, scale, out)
    want = reference(q, k_cache, v_cache, tables, rows, lens, ctx, bs, scale)
    return out, want, row


def span_case(seed, spans, bs, H, KVH, D, dtype):
    """fp32 queries for `spans` ((rows, context) pairs, rows stacked in order) and a cache
    twice as large as they need, each span's blocks drawn from a random permutation:
    (q, k_cache, v_cache, tables, rows, lens, ctx)."""
    g = torch.Generator().manual_seed(seed)
    need = sum(-(-c // bs) for _, c in spans)
    blocks = torch.randperm(2 * need, generator=g)
    tables = torch.zeros(len(spans), max(-(-c // bs) for _, c in spans), dtype=torch.long)
    o = 0
    for s, (_, c) in enumerate(spans):
        tables[s, : -(-c // bs)] = blocks[o : o + -(-c // bs)]
        o += -(-c // bs)
    q = torch.randn(sum(n for n, _ in spans), H, D, generator=g)
    k_cache = torch.randn(2 * need * bs, KVH, D, generator=g).to(dtype)
    v_cache = torch.randn(2 * need * bs, KVH, D, generator=g).to(dtype)
    rows = torch.tensor([sum(n for n, _ in spans[:i]) for i in range(len(spans))])
    lens, ctx = torch.tensor([n for n, _ in spans]), torch.tensor([c for _, c in spans])
    return q, k_cache, v_cache, tables, rows, lens, ctx


# A bf16 cache takes bf16 dot products where the CPU has AVX512_BF16 (prefill_bf16.cpp,
# decode_bf16.cpp): the query and the probabilities are rounded to bf16 there, as
# torch's bf16 attention does, which moves outputs of magnitude ~1-3 by up to ~1e-2. A
# wrong mask or a misplaced pair moves them by ~0.1-1. Everywhere else: fp32 exact.
BF16_DOTS_ATOL = 2e-2


def tolerance(kernel, dtype, D) -> float:
    return BF16_DOTS_ATOL if dtype == torch.bfloat16 and kernel.bf16_dots_available(D) else 2e-5


@pytest.fixture(params=["amx tiles", "bf16 dot products", "fp32 loops"])
def bf16_path(request, kernel):
    """Runs a bf16 test each way this CPU has: prefill tiles by AMX (prefill_amx.cpp),
    by AVX512_BF16 dot products, and the fp32 loops (where the CPU lacks AMX the first
    is the second, and without AVX512_BF16 all three are the loops)."""
    kernel.set_bf16_dots(request.param != "fp32 loops")
    kernel.set_amx(request.param == "amx tiles")
    yield request.param
    kernel.set_bf16_dots(True)
    kernel.set_amx(True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_sdpa_over_random_shapes(kernel, dtype, bf16_path):
    rng = random.Random(0 if dtype == torch.float32 else 1)
    for _ in range(12):
        H_per = rng.choice([1, 2, 3, 4])
        KVH = rng.choice([1, 2, 4])
        D = rng.choice([d for d in (8, 16, 32, 64, 128) if kernel.supports_head_dim(d)])
        bs = rng.choice([1, 4, 16, 32])
        spans = []
        for _ in range(rng.randint(1, 6)):
            c = rng.choice([1, 2, rng.randint(3, 40), rng.randint(40, 600)])
            n = 1 if rng.random() < 0.5 else rng.randint(1, c)
            spans.append((n, c))
        out, want, row = random_case(rng, kernel, dtype, spans, bs, KVH * H_per, KVH, D)
        err = (out[:row] - want[:row]).abs().max().item()
        tol = tolerance(kernel, dtype, D) if bf16_path != "fp32 loops" else 2e-5
        assert err < tol, f"H={KVH * H_per} KVH={KVH} D={D} bs={bs} spans={spans}: max error {err}"
        assert torch.all(out[row:] == 7.0), "the kernel wrote rows outside its spans"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_long_contexts(kernel, dtype):
    """Contexts of several thousand tokens: decodes, a 64-row chunk at the end of one, a
    whole 1500-token prompt."""
    rng = random.Random(2)
    spans = [(1, 1), (1, 4097), (1, 2500), (64, 3000), (1, 17), (1500, 1500)]
    out, want, row = random_case(rng, kernel, dtype, spans, 16, 12, 4, 64)
    err = (out[:row] - want[:row]).abs().max().item()
    assert err < tolerance(kernel, dtype, 64), f"max error {err}"
    decode_rows = [0, 1, 2, 67]  # spans of one row
    assert (out[decode_rows] - want[decode_rows]).abs().max().item() < tolerance(kernel, dtype, 64)


def test_kernel_long_prefill_chunks_at_head_dim_128(kernel):
    """Prefill chunks past one softmax segment (1,024 keys) at head dim 128, whose AMX
    tiles hold Q differently from head dim 64's."""
    rng = random.Random(3)
    out, want, row = random_case(rng, kernel, torch.bfloat16, [(48, 2100), (1100, 1100)], 16, 8, 2, 128)
    assert (out[:row] - want[:row]).abs().max().item() < tolerance(kernel, torch.bfloat16, 128)


def test_kernel_rejects_bad_metadata(kernel):
    q = torch.randn(2, 4, 64)
    cache = torch.randn(32, 2, 64)
    out = torch.empty_like(q)
    one = torch.tensor([1])
    with pytest.raises(RuntimeError, match="block id outside the cache"):
        kernel.paged_attention(q, cache, cache, torch.tensor([[5]]), torch.tensor([0]), one, one, 16, 1.0, out)
    with pytest.raises(RuntimeError, match="context out of range"):
        kernel.paged_attention(q, cache, cache, torch.tensor([[0]]), torch.tensor([0]), one, torch.tensor([17]),
                               16, 1.0, out)
    with pytest.raises(RuntimeError, match="rows out of range"):
        kernel.paged_attention(q, cache, cache, torch.tensor([[0]]), torch.tensor([2]), one, one, 16, 1.0, out)


# Two ulps of bf16 at the tiny model's logit magnitude (~20), as in test_batch_invariance.
BF16_LOGIT_ATOL = 0.25


def test_engine_bf16_native_matches_reference_path(tiny_model):
    """A bf16 engine through the kernel and through gather + SDPA: chunked prefill with a
    small budget and a shared prefix put decodes, cached-prefix chunks and fresh chunks
    in the same steps."""
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.output_compare import compare_results
    from shoal.sampling import SamplingParams

    r = random.Random(4)
    shared = [r.randrange(511) for _ in range(90)]
    prompts = [shared + [r.randrange(511) for _ in range(r.randint(1, 150))] for _ in range(6)]
    prompts += [[r.randrange(511) for _ in range(r.randint(1, 300))] for _ in range(6)]
    params = SamplingParams(max_tokens=12, ignore_eos=True, return_margins=True)
    results, logits = {}, {}
    for attention in ("native", "sdpa"):
        eng = LLMEngine(tiny_model, EngineConfig(dtype="bfloat16", attention=attention, max_num_batched_tokens=64))
        assert (eng.runner.ops is not None) == (attention == "native")
        steps: dict = {}
        eng.on_logits = lambda ids, lg: [steps.setdefault(s, []).append(row.clone()) for s, row in zip(ids, lg)]
        results[attention] = eng.generate(prompts, params)
        logits[attention] = steps
    for i, (a, b) in enumerate(zip(results["native"], results["sdpa"])):
        cmp = compare_results(a, b, tol=BF16_LOGIT_ATOL)
        assert cmp, f"prompt {i}: {cmp.detail}"
        upto = cmp.diverged_at if cmp.diverged_at is not None else len(a.token_ids)
        diff = (torch.stack(logits["native"][i][: upto + 1]) - torch.stack(logits["sdpa"][i][: upto + 1])).abs().max()
        assert diff < BF16_LOGIT_ATOL, f"prompt {i}: logits differ by {diff.item()}"


def test_engine_fp32_over_bf16_cache_native_matches_reference_path(tiny_model):
    """An fp32 model over a bf16 KV cache (what `auto` picks for a bf16 checkpoint on a CPU
    without native bf16): the kernel and gather + SDPA both compute in fp32 over keys and
    values rounded to bf16, through decodes, cached-prefix chunks and fresh chunks. Their
    fp32 keys differ in the last bits (fused vs torch RoPE), which now and then moves a
    key's bf16 rounding by one ulp, so their logits agree to well within what separates
    them from an fp32 cache's (which shows the cache really is bf16)."""
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    r = random.Random(5)
    shared = [r.randrange(511) for _ in range(90)]
    prompts = [shared + [r.randrange(511) for _ in range(r.randint(1, 150))] for _ in range(4)]
    prompts += [[r.randrange(511) for _ in range(r.randint(1, 300))] for _ in range(4)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    logits = {}
    for attention, kv in (("native", "bfloat16"), ("sdpa", "bfloat16"), ("native", "float32")):
        eng = LLMEngine(tiny_model, EngineConfig(dtype="float32", kv_cache_dtype=kv, attention=attention,
                                                 max_num_batched_tokens=64))
        assert eng.cache.layers[0].dtype == getattr(torch, kv) and eng.stats_snapshot()["kv_cache_dtype"] == kv
        steps: dict = {}
        eng.on_logits = lambda ids, lg: [steps.setdefault(s, []).append(row.clone()) for s, row in zip(ids, lg)]
        eng.generate(prompts, params)
        logits[attention, kv] = torch.cat([torch.stack(steps[i]) for i in range(len(prompts))])
    kernel_vs_sdpa = (logits["native", "bfloat16"] - logits["sdpa", "bfloat16"]).abs().max().item()
    bf16_vs_fp32 = (logits["native", "bfloat16"] - logits["native", "float32"]).abs().max().item()
    # Measured: 2.4e-3 and 3.9e-2 (logits up to ~7; an fp32 cache's two paths: 7e-6).
    assert kernel_vs_sdpa < 1e-2, kernel_vs_sdpa
    assert bf16_vs_fp32 > 4 * kernel_vs_sdpa, (bf16_vs_fp32, kernel_vs_sdpa)


def test_fp32_over_bf16_cache_sdpa_chunks_match_the_kernel(small_shaped_model):
    """The same at W1's head dim (64: the vectorized RoPE and cache write, and where the
    CPU has them the bf16 dot products), with large prefill chunks going through gather +
    SDPA on the native path (as an AVX2 build sends W3's long prompts) against the
    kernel's tiles for every chunk. Both read the keys and values the same fused op wrote;
    the first layer's outputs differ by fp32 rounding, which now and then moves one of
    the second layer's keys by a bf16 ulp (measured: 1.9e-3 at logits of ~13 with the
    fp32 loops; a wrong mask or span moves them by ~1). Where the kernel takes bf16 dot
    products it rounds the fp32 queries to bf16 and SDPA does not: 0.071-0.073 on a Xeon
    with AMX, by its AMX and by its AVX512_BF16 tiles alike."""
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    r = random.Random(6)
    prompts = [[r.randrange(32000) for _ in range(r.randint(100, 300))] for _ in range(4)]
    logits = {}
    for work in (0, 1):  # 0: the kernel for every chunk; 1: SDPA for every prefill chunk
        eng = LLMEngine(small_shaped_model, EngineConfig(dtype="float32", kv_cache_dtype="bfloat16",
                                                         sdpa_prefill_work=work, max_num_batched_tokens=128))
        assert eng.runner.sdpa_prefill_work == work and eng.cache.layers[0].dtype == torch.bfloat16
        steps: dict = {}
        eng.on_logits = lambda ids, lg: [steps.setdefault(s, []).append(row.clone()) for s, row in zip(ids, lg)]
        eng.generate(prompts, SamplingParams(max_tokens=4, ignore_eos=True))
        logits[work] = torch.cat([torch.stack(steps[i]) for i in range(len(prompts))])
    bound = 1.5e-1 if eng.runner.ops.bf16_dots_available(64) else 2e-2
    assert (logits[0] - logits[1]).abs().max().item() < bound


def test_unwritten_cache_slots_are_never_read(tiny_model):
    """The cache is allocated uninitialized: filled with NaN first, both paths must give
    the outputs of a clean cache (a read of an unwritten slot would spread the NaN)."""
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    r = random.Random(5)
    prompts = [[r.randrange(511) for _ in range(r.randint(1, 90))] for _ in range(8)]
    params = SamplingParams(max_tokens=10, ignore_eos=True)
    for attention in ("native", "sdpa"):
        clean = LLMEngine(tiny_model, EngineConfig(attention=attention, max_num_batched_tokens=48))
        for layer in clean.cache.layers:
            layer.zero_()
        dirty = LLMEngine(tiny_model, EngineConfig(attention=attention, max_num_batched_tokens=48))
        for layer in dirty.cache.layers:
            layer.fill_(float("nan"))
        want = [o.token_ids for o in clean.generate(prompts, params)]
        got = [o.token_ids for o in dirty.generate(prompts, params)]
        assert got == want, f"{attention}: a NaN from an unwritten slot reached the output"


def test_decode_never_reads_past_its_context(kernel, bf16_path):
    """Decode rows of W1's head shape (12 query heads, 4 KV heads of 64 dims, blocks of
    16: where AMX scores 16 cache rows at a time, the unwritten rows of a sequence's last
    block among them), with NaN in every slot past each context: the outputs are finite
    and those of a cache with zeros there."""
    H, KVH, D, bs = 12, 4, 64, 16
    contexts = [1, 15, 16, 17, 100, 283, 1029]
    tables = torch.tensor([[i * 70 + b for b in range(65)] for i in range(len(contexts))])
    g = torch.Generator().manual_seed(7)
    k_cache = (torch.randn(70 * len(contexts) * bs, KVH, D, generator=g) * 2).to(torch.bfloat16)
    v_cache = torch.randn(70 * len(contexts) * bs, KVH, D, generator=g).to(torch.bfloat16)
    for i, c in enumerate(contexts):  # the slots of each sequence's blocks past its context
        past = torch.arange(i * 70 * bs + c, (i + 1) * 70 * bs)
        k_cache[past] = v_cache[past] = 0
    q = torch.randn(len(contexts), H, D, generator=g)
    rows = torch.arange(len(contexts))
    lens, ctx = torch.ones(len(contexts), dtype=torch.long), torch.tensor(contexts)
    clean = torch.empty_like(q)
    kernel.paged_attention(q, k_cache, v_cache, tables, rows, lens, ctx, bs, D**-0.5, clean)
    for i, c in enumerate(contexts):
        past = torch.arange(i * 70 * bs + c, (i + 1) * 70 * bs)
        k_cache[past] = v_cache[past] = float("nan")
    dirty = torch.empty_like(q)
    kernel.paged_attention(q, k_cache, v_cache, tables, rows, lens, ctx, bs, D**-0.5, dirty)
    assert torch.isfinite(dirty).all(), f"{bf16_path}: a NaN past a context reached the output"
    assert torch.equal(dirty, clean)
    want = reference(q, k_cache, v_cache, tables, rows, lens, ctx, bs, D**-0.5)
    assert (dirty - want).abs().max().item() < tolerance(kernel, torch.bfloat16, D)


def test_bf16_output_is_the_fp32_output_rounded(kernel, bf16_path):
    """The kernel writes a bf16 output (what a bf16 model's o projection takes) as its
    fp32 output rounded to nearest even, element for element, on every path: decode
    rows and cached-prefix prefill chunks, fp32 and bf16 caches."""
    rng = random.Random(8)
    for dtype, (H, KVH, D, bs) in [(torch.bfloat16, (12, 4, 64, 16)), (torch.float32, (8, 2, 32, 4)),
                                   (torch.bfloat16, (8, 2, 128, 16))]:
        if not kernel.supports_head_dim(D):
            continue
        spans = [(1, 300), (1, 17), (40, 700), (130, 130)]
        out32, want, row = random_case(random.Random(rng.randrange(1 << 30)), kernel, dtype, spans, bs, H, KVH, D)
        q, k_cache, v_cache, t, rows, lens, ctx = span_case(rng.randrange(1 << 30), spans, bs, H, KVH, D, dtype)
        f32 = torch.empty_like(q)
        b16 = torch.empty(q.shape, dtype=torch.bfloat16)
        kernel.paged_attention(q, k_cache, v_cache, t, rows, lens, ctx, bs, D**-0.5, f32)
        kernel.paged_attention(q, k_cache, v_cache, t, rows, lens, ctx, bs, D**-0.5, b16)
        assert torch.equal(b16, f32.to(torch.bfloat16)), f"{bf16_path} {dtype} H={H} KVH={KVH} D={D}"
        assert (out32[:row] - want[:row]).abs().max().item() < tolerance(kernel, dtype, D)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        q = torch.randn(1, 2, 32)
        kernel.paged_attention(q, torch.zeros(4, 1, 32), torch.zeros(4, 1, 32), torch.zeros(1, 1, dtype=torch.long),
                               torch.tensor([0]), torch.tensor([1]), torch.tensor([1]), 4, 1.0,
                               torch.empty(1, 2, 32, dtype=torch.float16))


def test_fp32_queries_over_a_bf16_cache(kernel, bf16_path):
    """An fp32 model over a bf16 cache (`--kv-cache-dtype auto` where the CPU lacks native
    bf16) hands the kernel fp32 queries, a bf16 model bf16 ones. The fp32 loops use each
    as it is, exact against SDPA over the widened cache; the bf16 dot products round fp32
    queries to bf16 first, bit for bit the outputs of bf16 queries. Decode rows and prefill
    chunks; a float16 query is refused by name."""
    rng = random.Random(9)
    H, KVH, D, bs = 12, 4, 64, 16
    spans = [(1, 300), (1, 17), (40, 700), (130, 130)]
    q, k_cache, v_cache, tables, rows, lens, ctx = span_case(rng.randrange(1 << 30), spans, bs, H, KVH, D,
                                                             torch.bfloat16)
    from_fp32, from_bf16 = torch.empty(q.shape), torch.empty(q.shape)
    kernel.paged_attention(q, k_cache, v_cache, tables, rows, lens, ctx, bs, D**-0.5, from_fp32)
    kernel.paged_attention(q.to(torch.bfloat16), k_cache, v_cache, tables, rows, lens, ctx, bs, D**-0.5, from_bf16)
    want = reference(q, k_cache, v_cache, tables, rows, lens, ctx, bs, D**-0.5)
    want_rounded = reference(q.to(torch.bfloat16), k_cache, v_cache, tables, rows, lens, ctx, bs, D**-0.5)
    if bf16_path != "fp32 loops" and kernel.bf16_dots_available(D):
        assert torch.equal(from_fp32, from_bf16), bf16_path
        assert (from_bf16 - want).abs().max().item() < BF16_DOTS_ATOL
    else:
        assert (from_fp32 - want).abs().max().item() < 2e-5
        assert (from_bf16 - want_rounded).abs().max().item() < 2e-5
        assert (from_fp32 - from_bf16).abs().max().item() > 1e-4, "fp32 queries were rounded"
    with pytest.raises(RuntimeError, match="q must be contiguous float32 or bfloat16"):
        kernel.paged_attention(q.half(), k_cache, v_cache, tables, rows, lens, ctx, bs, D**-0.5, from_bf16)
