"""Prefill attention alone: one chunk through the native kernel's tiles against gather +
`scaled_dot_product_attention` (where `EngineConfig.sdpa_prefill_work` sends chunks of
that many rows x context and more; none by default), over an fp32 and a bf16 cache,
with the model's queries (fp32 unless this CPU has native bf16).

Each shape is ROWSxCONTEXT: a fresh prompt where the two are equal, else a chunk after a
cached prefix of CONTEXT - ROWS tokens, its blocks scattered over a cache four times its
size. Median of `--repeats` calls after one warm-up, cache dtypes alternated per shape.

    python scripts/bench_prefill_attention.py                      # W1's and W3's chunk shapes
    python scripts/bench_prefill_attention.py --shape 700x700 --shape 128x1200
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_generate import cpu_summary  # noqa: E402

# W1's and W3's decoder: 12 query heads, 4 KV heads of 64 dims, 16-token blocks.
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 12, 4, 64, 16
SHAPES = ["190x190", "512x512", "256x1200", "512x1900", "1536x1536"]


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", action="append", help="ROWSxCONTEXT (default: W1's and W3's chunk shapes)")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()

    import torch

    from shoal.nodes.worker.attention import PrefillSpan, prefill_sdpa
    from shoal.nodes.worker.cpu_threads import cores_owned
    from shoal.nodes.worker.dtype_choice import cpu_native_bf16
    from shoal.nodes.worker.kernels import native_ops

    torch.set_num_threads(cores_owned()[0])
    ops = native_ops()
    if ops is None:
        raise SystemExit("the native ops could not be built here")
    qdtype = torch.bfloat16 if cpu_native_bf16() else torch.float32
    print(f"CPU: {cpu_summary()}; {torch.get_num_threads()} threads; queries {qdtype}; {ops.vector_width()} floats a vector")
    gen = torch.Generator().manual_seed(0)
    for shape in args.shape or SHAPES:
        rows, ctx = map(int, shape.lower().split("x"))
        blocks = -(-ctx // BLOCK)
        table = torch.randperm(4 * blocks, generator=gen)[:blocks].view(1, blocks)
        pos = torch.arange(ctx)
        slots = table[0][pos // BLOCK] * BLOCK + pos % BLOCK
        q = torch.randn(rows, HEADS, HEAD_DIM, generator=gen).to(qdtype)
        out = torch.empty_like(q)
        span = PrefillSpan(0, rows, fresh=rows == ctx, slots=slots, prefix=ctx - rows)
        cells = []
        for dtype in (torch.float32, torch.bfloat16):
            cache = torch.randn(2, 4 * blocks * BLOCK, KV_HEADS, HEAD_DIM, generator=gen).to(dtype)
            meta = [torch.tensor([0]), torch.tensor([rows]), torch.tensor([ctx])]
            kernel = median_ms(lambda: ops.paged_attention(q, cache[0], cache[1], table, *meta, BLOCK,
                                                           HEAD_DIM**-0.5, out), args.repeats)
            sdpa = median_ms(lambda: prefill_sdpa(q, cache, [span], HEAD_DIM**-0.5, out), args.repeats)
            cells.append(f"{str(dtype)[6:]} cache: kernel {kernel:.2f} ms, SDPA {sdpa:.2f} ms ({kernel / sdpa:.2f}x)")
        kind = "fresh" if rows == ctx else f"after {ctx - rows} cached"
        print(f"{rows} rows x {ctx} keys ({kind}; rows x context {rows * ctx}): " + "; ".join(cells), flush=True)


if __name__ == "__main__":
    main()
