"""A worker whose KV budget is too small for its batch: preempted sequences offloaded
to host memory (restored by a copy) vs recomputed (re-prefilled), on W1.

The engine gets KV blocks for a fraction of what the batch needs at its longest, so
sequences are preempted as they grow. Same engine, same work, rounds interleaved;
reported: wall time, throughput ratio, preemptions and prompt tokens computed.

    python scripts/bench_offload.py --sequences 16 --kv-fraction 0.4 --rounds 2
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import bench_arguments, ensure_model, w1  # noqa: E402


def main() -> None:
    ap = bench_arguments(__doc__, rounds=1)
    ap.add_argument("--kv-fraction", type=float, default=0.4)
    args = ap.parse_args()
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    ensure_model(args.model)
    work = w1(sequences=args.sequences)
    block = 16
    need = sum(-(-(len(p) + n) // block) for p, n in zip(work.prompts, work.output_lens))
    blocks = int(need * args.kv_fraction)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in work.output_lens]
    tokens = work.prompt_tokens + work.output_tokens
    engines = {name: LLMEngine(args.model, EngineConfig(dtype=args.dtype, policy="mb", num_blocks=blocks, block_size=block,
                                                        offload_bytes=off))
               for name, off in (("recompute", 0), ("offload", 8 << 30))}
    walls = {name: [] for name in engines}
    for r in range(args.rounds + 1):  # round 0 warms both
        for name in (list(engines) if r % 2 == 0 else list(engines)[::-1]):
            eng = engines[name]
            eng.reset_stats()
            t = time.perf_counter()
            eng.generate(work.prompts, params)
            wall = time.perf_counter() - t
            st = eng.stats
            if r:
                walls[name].append(wall)
            print(f"{'warm-up' if not r else f'round {r}'}, {name}: {wall:.1f} s ({tokens / wall:.0f} tok/s), "
                  f"{st.preemptions} preemptions, {st.offloads} offloads, {st.prompt_tokens_computed} prompt tokens "
                  f"computed (of {work.prompt_tokens})", flush=True)
    a, b = statistics.median(walls["recompute"]), statistics.median(walls["offload"])
    print(f"W1 x{args.sequences} with KV for {100 * args.kv_fraction:.0f}% of the batch ({blocks} blocks of {block}): "
          f"offloading {b:.1f} s vs recomputing {a:.1f} s: {a / b:.2f}x throughput")


if __name__ == "__main__":
    main()
