"""Prefill steps of W3's returning hops, with a chunk after a cached prefix attended as two
flash calls (`attention.attend_after_prefix`, what the engine does) or as one SDPA call
over a masked rectangle (what it did before).

Each round submits 16 prompt heads (a 16-token question, or a question and 896 tokens of
earlier passages), runs them, then the 16 whole prompts, whose heads come from the prefix
cache: half get 1,300-1,500 new tokens (a hop whose context window slid), half 500-700
(a hop that appended passages). The second half of each round is timed. The two ways
take turns, round by round, and the result is the median of the per-pair ratios (this
machine drifts between minutes). Only where large prefill chunks go through SDPA (fp32 on
an AVX2 build) does either path run.

    python scripts/bench_prefix_attention.py [--model .bench/w3/model] [--pairs 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch.nn.functional as F

from shoal.nodes.worker import attention
from shoal.nodes.worker.engine import EngineConfig, LLMEngine
from shoal.sampling import SamplingParams

TWO_CALLS = attention.attend_after_prefix


def masked_rectangle(q, k, v, prefix, scale):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attention.chunk_mask(prefix, k.shape[2]), scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


def run_round(eng: LLMEngine, r: random.Random, first_id: int, way) -> float:
    attention.attend_after_prefix = way
    heads, whole = [], []
    for i in range(16):
        cached, new = (16, r.randint(1300, 1500)) if i % 2 == 0 else (912, r.randint(500, 700))
        head = [r.randrange(1000, 30000) for _ in range(cached)]
        heads.append(head)
        whole.append(head + [r.randrange(1000, 30000) for _ in range(new)])
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    for i, ids in enumerate(heads):
        eng.add_request(first_id + i, prompt_token_ids=ids, params=params)
    while eng.has_unfinished():
        eng.step()
    for i, ids in enumerate(whole):
        eng.add_request(first_id + 16 + i, prompt_token_ids=ids, params=params)
    t = time.perf_counter()
    while eng.has_unfinished():
        eng.step()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=".bench/w3/model", help="W3's decoder (bench_w3.py writes it)")
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args()
    eng = LLMEngine(args.model, EngineConfig(dtype="auto", num_threads=2, policy="mb"))
    print(f"dtype {eng.config.dtype}, prefill chunks through SDPA from rows x context "
          f"{eng.runner.sdpa_prefill_work or 'never'}")
    r = random.Random(0)
    run_round(eng, r, 0, TWO_CALLS)  # warm-up
    ratios = []
    for k in range(args.pairs):
        a = run_round(eng, r, 100 * (2 * k + 1), masked_rectangle)
        b = run_round(eng, r, 100 * (2 * k + 2), TWO_CALLS)
        ratios.append(a / b)
        print(f"masked rectangle {a:.2f} s, two flash calls {b:.2f} s: {a / b:.3f}x", flush=True)
    print(f"median {statistics.median(ratios):.3f}x ({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
