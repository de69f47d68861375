"""W1 through the cluster (router, scheduler, storage, one worker) against the same
engine called in-process, same inputs, same run: the wall time the protocol and the
nodes add (target: under 5%).

    python scripts/bench_cluster.py --dtype float32 --sequences 128
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import w1  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".bench/model-small")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--sequences", type=int, default=128)
    ap.add_argument("--policy", default="mb")
    args = ap.parse_args()
    import shoal
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    if not Path(args.model, "config.json").exists():
        from shoal.nodes.worker.models.make_model import make_model

        make_model(args.model, preset="small", dtype="bfloat16")
    work = w1(sequences=args.sequences)
    items = [{"id": i, "prompt_token_ids": p, "max_tokens": n} for i, (p, n) in enumerate(zip(work.prompts, work.output_lens))]
    params = {"ignore_eos": True}

    eng = LLMEngine(args.model, EngineConfig(dtype=args.dtype, policy=args.policy))
    t = time.perf_counter()
    eng.generate(work.prompts, [SamplingParams(max_tokens=n, ignore_eos=True) for n in work.output_lens])
    inproc = time.perf_counter() - t
    del eng

    with shoal.LocalCluster(args.model, workers=1, dtype=args.dtype, policy=args.policy) as cluster:
        client = shoal.Client(cluster.router)
        t = time.perf_counter()
        results = client.submit(items, params=params).wait()
        wall = time.perf_counter() - t
    assert len(results) == len(items)
    tokens = work.prompt_tokens + work.output_tokens
    print(f"W1 x{args.sequences} ({args.dtype}, policy {args.policy}): in-process {inproc:.1f} s ({tokens / inproc:.0f} tok/s), "
          f"cluster {wall:.1f} s ({tokens / wall:.0f} tok/s); nodes and protocol add {100 * (wall / inproc - 1):+.1f}% wall time")


if __name__ == "__main__":
    main()
