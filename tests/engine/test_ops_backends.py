"""The ops backends a GPU worker runs, checked on the CPU.

The Triton paged attention kernel runs under Triton's interpreter (`TRITON_INTERPRET=1`,
set here before Triton is first imported) and the torch backend as it is; both are
compared with a float64 oracle written out span by span over random shapes: decode
spans and prefill chunks after cached prefixes, block tables with holes and out of
order, grouped query heads (a group of 3 pads the kernel's tile), a head dim that is no
power of two, bf16 caches, and a context of 2,000 tokens. A whole engine on each
backend gives the reference forward's tokens; and a whole step on the `meta` device,
under a dispatch mode that rejects any op mixing host and device tensors, proves that
no host tensor reaches a device op except the step's one staged copy.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton decorates the kernel

import random  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from shoal.nodes.worker.attention import AttentionMetadata  # noqa: E402
from shoal.nodes.worker.ops_backend import TorchOps, TritonOps, choose_ops  # noqa: E402

triton = pytest.importorskip("triton", reason="Triton is a dev dependency (pyproject's dev extra)")


def oracle(q, k_cache, v_cache, table, spans, bs, scale):
    """Each span's rows, one at a time, in float64: row i of a span of n rows in a context
    of c attends to positions 0 .. c - n + i through the span's block table."""
    out = torch.zeros(q.shape, dtype=torch.float64)
    H, kvh = q.shape[1], k_cache.shape[1]
    for s, (row, n, c) in enumerate(spans):
        slots = torch.tensor([table[s][p // bs] * bs + p % bs for p in range(c)])
        k, v = k_cache[slots].double(), v_cache[slots].double()  # [c, KVH, D]
        for i in range(n):
            pos = c - n + i
            for h in range(H):
                g = h // (H // kvh)
                w = torch.softmax((k[: pos + 1, g] @ q[row + i, h].double()) * scale, dim=0)
                out[row + i, h] = w @ v[: pos + 1, g]
    return out


def random_case(r: random.Random, heads: int, kvh: int, dim: int, spans_lens: list[tuple[int, int]],
                q_dtype, cache_dtype, bs: int = 16):
    """Spans of (rows, context) laid out one after another, each with a block table drawn
    without replacement from a cache twice as large as needed (holes, any order)."""
    need = sum(-(-c // bs) for _, c in spans_lens)
    num_blocks = 2 * need + 3
    free = list(range(num_blocks))
    r.shuffle(free)
    tables, spans, row = [], [], 0
    for n, c in spans_lens:
        tables.append([free.pop() for _ in range(-(-c // bs))])
        spans.append((row, n, c))
        row += n
    g = torch.Generator().manual_seed(r.randrange(1 << 30))
    q = torch.randn(row, heads, dim, generator=g).to(q_dtype)
    k_cache = torch.randn(num_blocks * bs, kvh, dim, generator=g).to(cache_dtype)
    v_cache = torch.randn(num_blocks * bs, kvh, dim, generator=g).to(cache_dtype)
    width = max(map(len, tables))
    meta = AttentionMetadata(slot_mapping=torch.empty(0, dtype=torch.long), block_size=bs)
    meta.span_rows = torch.tensor([s[0] for s in spans])
    meta.span_lens = torch.tensor([s[1] for s in spans])
    meta.span_ctx = torch.tensor([s[2] for s in spans])
    meta.span_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    meta.span_max_len, meta.span_max_ctx = max(s[1] for s in spans), max(s[2] for s in spans)
    return q, torch.stack([k_cache, v_cache]), tables, spans, meta


CASES = [  # heads, kv heads, head dim, [(rows, context)], q dtype, cache dtype
    (4, 2, 16, [(1, 1), (1, 17), (1, 40), (1, 33)], torch.float32, torch.float32),  # decodes only
    (4, 2, 16, [(1, 30), (5, 5), (12, 50), (1, 16), (7, 23)], torch.float32, torch.float32),  # mixed, prefixes
    (8, 2, 64, [(3, 70), (1, 9), (20, 20)], torch.float32, torch.float32),  # groups of 4
    (6, 2, 16, [(1, 12), (9, 41)], torch.float32, torch.float32),  # groups of 3: padded in the kernel's tile
    (4, 4, 80, [(2, 35), (1, 3)], torch.float32, torch.float32),  # no grouping, head dim 80 (not 2^k)
    (4, 2, 64, [(1, 45), (6, 38), (1, 2)], torch.bfloat16, torch.bfloat16),
    (4, 2, 16, [(1, 29), (4, 19)], torch.float32, torch.bfloat16),  # an fp32 model over a bf16 cache
    (2, 1, 16, [(1, 2000), (3, 1200)], torch.float32, torch.float32),  # long contexts
]


@pytest.mark.parametrize("ops", [TorchOps(), TritonOps()], ids=["torch", "triton"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_paged_attention_matches_the_oracle(ops, case):
    heads, kvh, dim, spans_lens, q_dtype, cache_dtype = CASES[case]
    r = random.Random(case)
    q, kv, tables, spans, meta = random_case(r, heads, kvh, dim, spans_lens, q_dtype, cache_dtype)
    scale = dim**-0.5
    out = torch.full_like(q, float("nan"))
    ops.attend(q, kv, meta, scale, out)
    want = oracle(q, kv[0], kv[1], tables, spans, meta.block_size, scale)
    tol = 2e-2 if q_dtype == torch.bfloat16 else 1e-5
    assert not out.isnan().any(), "a row of some span was never written"
    err = (out.double() - want).abs().max().item()
    assert err < tol, f"{ops.name}: max error {err:.2e} over spans {spans_lens}"


@pytest.mark.parametrize("attention", ["torch", "triton"])
def test_engine_on_each_backend_gives_the_reference_tokens(tiny_model, attention):
    """Greedy tokens of mixed-length prompts, chunked prefill and cached prefixes on the
    backend equal the reference forward's by the shared comparator, and every sampling
    step's logits agree within fp32 rounding."""
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.output_compare import compare_outputs
    from shoal.sampling import SamplingParams

    r = random.Random(3)
    shared = [r.randrange(500) for _ in range(40)]  # a prefix the later prompts reuse from the cache
    prompts = [[r.randrange(500) for _ in range(n)] for n in (1, 7, 33, 70)] + [shared + [1, 2], shared + [3]]
    runs = {}
    for name in ("sdpa", attention):
        eng = LLMEngine(tiny_model, EngineConfig(attention=name, policy="mb", max_num_batched_tokens=48))
        assert (eng.runner.ops.name if eng.runner.ops else "sdpa") == name
        logits = []
        eng.on_logits = lambda ids, lg: logits.append(lg.clone())
        outs = eng.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True, return_margins=True))
        runs[name] = outs, logits, eng.stats.prompt_tokens_cached
    (ref, ref_logits, _), (got, got_logits, cached) = runs["sdpa"], runs[attention]
    assert cached > 0, "no prompt reused a cached prefix"
    for a, b in zip(ref, got):
        cmp = compare_outputs(a.token_ids, b.token_ids, [a.margins, b.margins])
        assert cmp, f"{attention}: {cmp.detail}"
    diff = max((a - b).abs().max().item() for a, b in zip(ref_logits, got_logits))
    assert diff < 1e-4, f"{attention}: logits differ from the reference forward by {diff}"


class RejectMixedDevices(TorchDispatchMode):
    """Records every op that takes a host tensor (of at least one element's dimension)
    together with a device tensor, except the copies that move data between them."""

    TRANSFERS = {"aten::_to_copy", "aten::copy_", "aten::_copy_from", "aten::lift_fresh", "aten::_pin_memory"}

    def __init__(self, device: str):
        super().__init__()
        self.device, self.offenders, self.transfers = device, [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
        devices = {t.device.type for t in tensors if t.dim() > 0 or t.device.type != "cpu"}
        result = func(*args, **(kwargs or {}))
        if func._schema.name in self.TRANSFERS:
            outputs = [t for t in tree_flatten(result)[0] if isinstance(t, torch.Tensor)]
            if "cpu" in devices and any(t.device.type == self.device for t in outputs):
                self.transfers += 1  # a host -> device copy
        elif "cpu" in devices and self.device in devices:
            self.offenders.append(str(func))
        return result


def test_a_step_on_a_device_takes_no_host_tensor(tiny_model):
    """The model, its KV cache and a step of decodes and prefill chunks on the `meta`
    device with the torch backend: only the staged copy of the step's inputs crosses."""
    from shoal.nodes.worker.kv_cache import KVCache
    from shoal.nodes.worker.model_runner import ModelRunner
    from shoal.nodes.worker.models.loader import load_decoder
    from shoal.nodes.worker.sequence import Sequence
    from shoal.sampling import SamplingParams

    model, _ = load_decoder(tiny_model, "float32", device="meta")
    assert model.embed.weight.device.type == "meta" and model.rope.cos.device.type == "meta"
    cache = KVCache(model.cfg, 32, 16, torch.float32, device="meta")
    runner = ModelRunner(model, cache, TorchOps())
    chunks = []
    for i, (done, n) in enumerate([(20, 1), (0, 9), (16, 12), (5, 1)]):
        seq = Sequence(i, list(range(done + n + 1)), SamplingParams())
        seq.block_table, seq.num_computed = list(range(8 * i, 8 * i + 3)), done
        chunks.append((seq, n))
    mode = RejectMixedDevices("meta")
    with mode:
        logits, rows = runner.run(chunks, [True, True, False, True])
    assert logits.device.type == "meta" and logits.shape == (3, model.cfg.vocab_size) and rows == [0, 3, 1]  # decodes first
    assert not mode.offenders, f"ops given host tensors beside device ones: {sorted(set(mode.offenders))}"
    assert mode.transfers == 1, f"the step's inputs went over in {mode.transfers} copies, not one"


def test_sampling_on_a_device_takes_no_host_tensor():
    """Greedy, temperature, top-k and top-p rows picked on the device, whole and in
    chunks, and the logprobs that go ahead with them: no op mixes host and device tensors
    (the row indices and uniforms go over as copies)."""
    from shoal.nodes.worker import logits_processing as lp
    from shoal.nodes.worker.pending_tokens import logprob_tensors
    from shoal.nodes.worker.device_copy import to_device
    from shoal.nodes.worker.sampler import pick
    from shoal.sampling import SamplingParams

    logits = torch.empty(4, 300, device="meta")
    params = [SamplingParams(), SamplingParams(temperature=0.7, seed=1), SamplingParams(temperature=1.0, top_k=5),
              SamplingParams(temperature=1.0, top_p=0.8, return_margins=True)]
    mode = RejectMixedDevices("meta")
    with mode:
        chosen, margins, sampled = pick(logits, params, [0.0, 0.3, 0.6, 0.9])
        _, _, chunked = pick(logits, params, [0.0, 0.3, 0.6, 0.9], rows_per_chunk=2)
        picked, values, ids = logprob_tensors(lp.log_probs(logits, [0, 2]), chosen[to_device([0, 2], logits.device)], 3)
    assert chosen.device.type == "meta" and margins.device.type == "meta" and sampled[0] == [1, 2, 3]
    assert chunked[0] == [1, 2, 3] and chunked[1].shape == (3,) and chunked[3].device.type == "meta"
    assert picked.shape == (2,) and values.shape == ids.shape == (2, 3) and ids.device.type == "meta"
    assert not mode.offenders, f"ops given host tensors beside device ones: {sorted(set(mode.offenders))}"


def test_a_launch_asking_every_figure_on_a_device_takes_no_host_tensor():
    """The engine's whole sampling launch (`sampling_launch.py`) for rows asking for
    everything at once, as the KV sizing's profiled step runs it: a grammar's mask, logit
    bias, min_tokens, the three penalties, logprobs and margins, greedy and sampled rows."""
    import numpy as np

    from shoal.nodes.worker import logits_processing as lp
    from shoal.nodes.worker.sampling_launch import launch_sampling
    from shoal.nodes.worker.sequence import Sequence
    from shoal.sampling import SamplingParams

    every = dict(min_tokens=2, stop_token_ids=(7,), logit_bias={3: 1.5}, presence_penalty=0.5, frequency_penalty=0.2,
                 repetition_penalty=1.2, logprobs=4, return_margins=True)
    seqs = [Sequence(0, [1, 2, 3], SamplingParams(**every)),
            Sequence(1, [4, 5], SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=3, **every))]
    seqs[1].output_token_ids = [9, 9, 11]
    logits = torch.empty(2, 300, device="meta")
    mode = RejectMixedDevices("meta")
    with mode:
        lp.apply_bitmask(logits, [0, 1], np.full((2, 10), -1, dtype=np.int32))
        launched = launch_sampling(seqs, logits, None, lambda p: list(p.stop_token_ids))
    assert launched.chosen.device.type == "meta" and launched.rows["logprob_rows"] == [0, 1]
    assert launched.rows["sampled_rows"] == [1] and set(launched._figures) >= {"lp_values", "margins", "lo"}
    assert not mode.offenders, f"ops given host tensors beside device ones: {sorted(set(mode.offenders))}"


def test_backend_choice_follows_the_device():
    cpu, meta = torch.device("cpu"), torch.device("meta")
    assert choose_ops("torch", meta, 16)[0].name == "torch"
    assert choose_ops("sdpa", cpu, 16)[0] is None
    with pytest.raises(ValueError, match="native ops are CPU kernels"):
        choose_ops("native", meta, 16)
    with pytest.raises(ValueError, match="unknown attention backend"):
        choose_ops("flash", cpu, 16)
    # Under the interpreter Triton runs anywhere; without it, only on a GPU.
    assert choose_ops("triton", cpu, 16)[0].name == "triton"
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        with pytest.raises(ValueError, match="run on a GPU"):
            choose_ops("triton", cpu, 16)
        ops, why = choose_ops("auto", meta, 16)
        assert ops.name == "torch" and "Triton" in why
    finally:
        os.environ["TRITON_INTERPRET"] = "1"


def test_decode_steps_in_padded_graph_buffers_give_the_eager_logits(tiny_model):
    """Decode graphs' buffers and padding (`decode_graphs.py`, replayed eagerly: the CUDA
    capture itself needs a GPU): steps of 5, then 3, then 1 sequences in buffers of 8, 4
    and 1 rows give the logits of the same steps run as they are, and the padding rows
    write only the scratch block."""
    from shoal.nodes.worker.decode_graphs import DecodeGraphs, graph_sizes
    from shoal.nodes.worker.kv_cache import KVCache
    from shoal.nodes.worker.model_runner import ModelRunner
    from shoal.nodes.worker.models.loader import load_decoder
    from shoal.nodes.worker.sequence import Sequence
    from shoal.sampling import SamplingParams

    assert graph_sizes(256)[:5] == [1, 2, 4, 8, 16] and graph_sizes(256)[-1] == 256 and graph_sizes(5) == [1, 2, 4, 5]
    model, _ = load_decoder(tiny_model, "float32")
    blocks, bs = 40, 16
    cache = KVCache(model.cfg, blocks + 1, bs, torch.float32)  # + the scratch block
    for layer in cache.layers:
        layer.zero_()
    ops = TritonOps()
    eager = ModelRunner(model, cache, ops)
    graphs = DecodeGraphs(model, cache, ops, max_seqs=8, max_blocks=8, scratch_block=blocks, replay="eager")
    graphed = ModelRunner(model, cache, ops, graphs=graphs)
    r = random.Random(4)
    seqs = []
    for i, length in enumerate((3, 17, 40, 9, 64)):
        seq = Sequence(i, [r.randrange(500) for _ in range(length + 1)], SamplingParams())
        seq.block_table = list(range(8 * i, 8 * i + 5))
        seqs.append(seq)
    eager.run([(s, s.num_tokens - 1) for s in seqs], [False] * len(seqs))  # prefill all but the last token
    for s in seqs:
        s.num_computed = s.num_tokens - 1
    for n in (5, 3, 1):
        step = [(s, 1) for s in seqs[:n]]
        want, _ = eager.run(step, [True] * n)
        before = [layer[:, : blocks * bs].clone() for layer in cache.layers]
        for layer in cache.layers:
            layer[:, blocks * bs:].zero_()
        got, rows = graphed.run(step, [True] * n)
        if graphs.size_for(n) > n:
            assert cache.layers[0][:, blocks * bs].abs().sum() > 0, "the padding rows did not write the scratch block"
        assert rows == list(range(n)) and got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-5), f"{n} decodes in a buffer of {graphs.size_for(n)}: logits differ"
        own = {s.block_table[s.num_computed // bs] * bs + s.num_computed % bs for s, _ in step}
        for old, layer in zip(before, cache.layers):
            changed = set((old != layer[:, : blocks * bs]).any(-1).any(-1).any(0).nonzero().flatten().tolist())
            assert changed <= own, f"padding rows wrote slots {sorted(changed - own)} of the sequences' blocks"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_elementwise_ops_match_torch(dtype):
    """RMSNorm with the residual add, qk-norm + RoPE + cache write, and silu * up in
    Triton (interpreted) against TorchOps: fp32 to rounding, bf16 within one rounding of
    a value (summation order)."""
    from shoal.nodes.worker.models.layers import RotaryEmbedding

    g = torch.Generator().manual_seed(0)
    ref, tri = TorchOps(), TritonOps()
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    x = torch.randn(7, 96, generator=g).to(dtype)  # a hidden size that is no power of two
    res = torch.randn(7, 96, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(96, generator=g)).to(dtype)
    r1, r2 = res.clone(), res.clone()
    assert torch.allclose(ref.rms_norm(x, r1, w, 1e-6).float(), tri.rms_norm(x, r2, w, 1e-6).float(), **tol)
    assert torch.allclose(r1.float(), r2.float(), **tol), "the residual stream was not updated the same"
    assert torch.allclose(ref.rms_norm(x, x.new_empty(0), w, 1e-6).float(),
                          tri.rms_norm(x, x.new_empty(0), w, 1e-6).float(), **tol)
    gu = torch.randn(5, 2 * 80, generator=g).to(dtype)
    assert torch.allclose(ref.silu_mul(gu).float(), tri.silu_mul(gu).float(), **tol)
    H, KVH, D, T = 4, 2, 16, 6
    rope = RotaryEmbedding(D, 64, 10000.0)
    qkv = torch.randn(T + 2, (H + 2 * KVH) * D, generator=g).to(dtype)  # padding rows after the step's T
    qn, kn = (1 + 0.1 * torch.randn(D, generator=g)).to(dtype), (1 + 0.1 * torch.randn(D, generator=g)).to(dtype)
    positions, slots = torch.tensor([0, 5, 9, 31, 63, 2]), torch.tensor([3, 17, 4, 30, 8, 11])
    for norm in (True, False):
        caches = [torch.zeros(32, KVH, D, dtype=dtype) for _ in range(4)]
        args = (qn, kn) if norm else (qkv.new_empty(0), qkv.new_empty(0))
        q1 = ref.qkv_rope_cache(qkv, *args, rope.cos, rope.sin, positions, slots, caches[0], caches[1], H, KVH, 1e-6)
        q2 = tri.qkv_rope_cache(qkv, *args, rope.cos, rope.sin, positions, slots, caches[2], caches[3], H, KVH, 1e-6)
        assert torch.allclose(q1.float(), q2.float(), **tol), f"queries differ (qk-norm {norm})"
        assert torch.allclose(caches[0].float(), caches[2].float(), **tol), f"keys differ (qk-norm {norm})"
        assert torch.equal(caches[1], caches[3]), "values are copied as they are"
        assert caches[2].abs().sum() > 0 and caches[2][0].abs().sum() == 0, "keys went to other slots"
