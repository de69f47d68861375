"""Decode attention alone: how fast the paged kernel reads the KV cache, against how fast
this machine streams memory, measured in the same run.

A decode step reads every running sequence's whole context from the cache, once per
layer; on W1 that is ~40% of a step whenever the matrix unit runs fast. This times only
`paged_attention` on decode rows, outside the engine: a cache of the engine's default
size (4 GiB: far larger than any CPU cache), the context blocks of each sequence
scattered across it as a long job leaves them, one call per layer as a step makes them.
The figure is the cache bytes read per second (keys and values of every context token,
every layer), beside `roofline.memory_read_gbps`, the rate the W1 benchmark's floor
assumes. `--hot` puts every layer on one small cache (the same rows read again, from the
CPU's caches: the kernel's arithmetic alone); `--pages 4k` allocates the cache without
the 2 MB pages the engine asks for.

    python scripts/bench_decode_attention.py                 # W1's and W3's decode shapes
    python scripts/bench_decode_attention.py --shape 32x1500 --hot
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_generate import cpu_summary  # noqa: E402
from roofline import memory_read_gbps  # noqa: E402

# W1's and W3's decoder: 12 layers, 12 query heads, 4 KV heads of 64 dims.
LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 12, 12, 4, 64, 16
SHAPES = {"w1": (128, 283), "w3": (96, 1100)}  # running sequences x mean context, mid-job


def run(seqs: int, ctx: int, dtype, qdtype, hot: bool, pages: str, steps: int, cache_bytes: int) -> dict:
    import torch

    from shoal.nodes.worker import huge_pages
    from shoal.nodes.worker.kernels import native_ops

    ops = native_ops()
    if ops is None:
        raise SystemExit("the native kernels could not be built here (see the log above)")
    row_bytes = KV_HEADS * HEAD_DIM * dtype.itemsize
    per_seq = -(-ctx // BLOCK)
    slots = seqs * per_seq * BLOCK if hot else cache_bytes // (2 * LAYERS * row_bytes) // BLOCK * BLOCK
    if slots < seqs * per_seq * BLOCK:
        raise SystemExit(f"{seqs} x {ctx} tokens do not fit a {cache_bytes >> 20} MiB cache")
    empty = huge_pages.empty if pages == "2m" else (lambda shape, dt: torch.empty(shape, dtype=dt))
    gen = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(1 if hot else LAYERS):
        k, v = empty((slots, KV_HEADS, HEAD_DIM), dtype), empty((slots, KV_HEADS, HEAD_DIM), dtype)
        k.normal_(generator=gen), v.normal_(generator=gen)  # also commits every page before timing
        layers.append((k, v))
    layers = layers * (LAYERS // len(layers))
    tables = torch.randperm(slots // BLOCK, generator=gen)[: seqs * per_seq].view(seqs, per_seq).contiguous()
    rows = torch.arange(seqs, dtype=torch.long)
    lens = torch.ones(seqs, dtype=torch.long)
    ctxs = torch.full((seqs,), ctx, dtype=torch.long)
    q = torch.randn(seqs, HEADS, HEAD_DIM, generator=gen).to(qdtype)  # queries and output in the model's dtype
    out = torch.empty_like(q)

    def step():
        for k, v in layers:
            ops.paged_attention(q, k, v, tables, rows, lens, ctxs, BLOCK, HEAD_DIM**-0.5, out)

    for _ in range(3):
        step()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    median = sorted(times)[len(times) // 2]
    read = LAYERS * seqs * ctx * 2 * row_bytes
    return {"ms": median * 1e3, "mb": read / 1e6, "gbps": read / median / 1e9}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", help="SEQSxCONTEXT, or w1 / w3 (default: both)")
    ap.add_argument("--dtype", default="auto", help="the cache's dtype: bfloat16, float32, or auto (what the engine picks)")
    ap.add_argument("--query-dtype", default="auto",
                    help="the model's dtype (queries, output): bfloat16, float32, or auto (what the engine computes in)")
    ap.add_argument("--hot", action="store_true", help="one small cache for every layer: read from the CPU's caches")
    ap.add_argument("--pages", choices=("2m", "4k"), default="2m", help="the cache on 2 MB pages (the engine's) or 4 KB")
    ap.add_argument("--steps", type=int, default=15, help="timed steps per shape (the median is printed)")
    ap.add_argument("--cache-gib", type=float, default=4.0, help="the cache's size, as the engine's default")
    args = ap.parse_args()

    import torch

    from shoal.nodes.worker.cpu_threads import cores_owned
    from shoal.nodes.worker.dtype_choice import cpu_native_bf16

    threads = cores_owned()[0]
    torch.set_num_threads(threads)
    # auto: what the engine does with a bf16 checkpoint on this CPU (dtype_choice.py): it
    # computes in bf16 where the CPU has native bf16, else in fp32; the cache stays bf16.
    name = args.dtype if args.dtype != "auto" else "bfloat16"
    qname = args.query_dtype if args.query_dtype != "auto" else "bfloat16" if cpu_native_bf16() else "float32"
    for flag, value in (("--dtype", name), ("--query-dtype", qname)):
        if value not in ("bfloat16", "float32"):
            raise SystemExit(f"{flag} {value!r}: bfloat16 or float32")
    dtype, qdtype = getattr(torch, name), getattr(torch, qname)
    print(f"CPU: {cpu_summary()}; {threads} threads; cache {dtype}, queries {qdtype}, {args.pages} pages, "
          f"{'hot (one small cache for every layer)' if args.hot else f'{args.cache_gib:g} GiB'}")
    for shape in args.shape or list(SHAPES):
        seqs, ctx = SHAPES[shape] if shape in SHAPES else map(int, shape.lower().split("x"))
        r = run(seqs, ctx, dtype, qdtype, args.hot, args.pages, args.steps, int(args.cache_gib * 2**30))
        mem = memory_read_gbps(threads)
        print(f"{shape}: {seqs} sequences x {ctx} tokens, {LAYERS} layers: {r['ms']:.1f} ms a step, "
              f"{r['mb']:.0f} MB of KV read at {r['gbps']:.1f} GB/s; memory streams at {mem:.1f} GB/s "
              f"(the kernel at {r['gbps'] / mem:.0%} of it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
