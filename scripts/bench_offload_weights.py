"""Throughput when the device cannot hold the model: Shoal's weight streaming at 100%,
50% and 25% of the weights resident, against a layer-streaming baseline, on the dense
W1 model and the MoE model, in the same run.

- shoal: `EngineConfig(device_memory=...)` (`nodes/worker/weight_streamer.py`): as many
  layers resident as fit, the rest copied into two slots ahead of use on a copy thread,
  a MoE layer's experts copied only when its router chose them; every sequence in one
  continuously batched run, so each fetched layer serves all of them.
- layer streaming: what accelerate's CPU offload does: every layer (every expert)
  copied in before it runs, nothing ahead of use, for fixed batches of --batch
  sequences run one after another.

On a CPU the "device" is the same memory: a fetch is a memcpy at the machine's copy
bandwidth (measured here too), the code path a GPU takes with pinned host memory.
Reported: generated tokens/s, bytes fetched per generated token, the ratios; --json and
a PNG beside it.

    python scripts/bench_offload_weights.py
    python scripts/bench_offload_weights.py --models .bench/model-moe-small --sequences 128
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def copy_bandwidth() -> float:
    import torch

    src = torch.empty(256 << 20, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = time.perf_counter()
    for _ in range(4):
        dst.copy_(src)
    return 4 * src.numel() / (time.perf_counter() - t)


def prompts_for(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    r = random.Random(seed)
    return [[r.randrange(vocab - 1) for _ in range(r.randint(32, 64))] for _ in range(n)]


def run(model: str, prompts, out: int, fraction: float | None, batch: int) -> dict:
    """fraction: of the weights resident (Shoal); None: the layer-streaming baseline."""
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.nodes.worker.weight_streamer import WeightStreamer, nbytes
    from shoal.sampling import SamplingParams

    if fraction is None:
        eng = LLMEngine(model, EngineConfig(policy="mb", packed_linears=False))
        eng.streamer = eng.model.streamer = WeightStreamer(eng.model, 0, resident_layers=0, overlap=False,
                                                           routed_experts_only=False)
        groups = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    else:
        probe = LLMEngine(model, EngineConfig(policy="mb", packed_linears=False, num_blocks=4))
        weights = nbytes(probe.model)  # in the dtype the engine picks here
        del probe
        budget = int(weights * fraction) if fraction < 1 else 0
        eng = LLMEngine(model, EngineConfig(policy="mb", device_memory=budget, max_num_seqs=max(256, len(prompts))))
        groups = [prompts]
    params = SamplingParams(max_tokens=out, ignore_eos=True)
    eng.generate(prompts[:2], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    before = eng.streamer.summary()["bytes_fetched"] if eng.streamer else 0
    t = time.perf_counter()
    tokens = sum(len(o.token_ids) for g in groups for o in eng.generate(g, params))
    wall = time.perf_counter() - t
    s = eng.streamer.summary() if eng.streamer else {"bytes_fetched": 0, "resident_bytes": None, "weight_bytes": None}
    return {"tokens_per_s": tokens / wall, "wall": wall, "tokens": tokens,
            "bytes_per_token": (s["bytes_fetched"] - before) / tokens, "resident_bytes": s["resident_bytes"],
            "weight_bytes": s["weight_bytes"], "streamed_layers": s.get("streamed_layers", 0),
            "fetch_wait_s": s.get("fetch_wait_s", 0.0)}


def main() -> None:
    import argparse

    from bench_generate import cpu_summary

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=".bench/model-small,.bench/model-moe-small")
    ap.add_argument("--sequences", type=int, default=64)
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8, help="the baseline's fixed batch")
    ap.add_argument("--fractions", default="1,0.5,0.25")
    ap.add_argument("--json", default=".bench/offload_weights.json")
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"{cpu_summary()}; host-to-device copy (memcpy here) {bw / 1e9:.1f} GB/s", flush=True)
    results = []
    for model in args.models.split(","):
        if not Path(model, "config.json").exists():
            from shoal.nodes.worker.models.make_model import make_model

            make_model(model, preset="moe-small" if "moe" in model else "small", dtype="bfloat16")
        vocab = json.loads(Path(model, "config.json").read_text())["vocab_size"]
        prompts = prompts_for(args.sequences, vocab)
        base = run(model, prompts, args.output, None, args.batch)
        print(f"{model}: layer streaming, batches of {args.batch}: {base['tokens_per_s']:.1f} tokens/s, "
              f"{base['bytes_per_token'] / 1e6:.1f} MB fetched per token", flush=True)
        for f in (float(x) for x in args.fractions.split(",")):
            try:
                r = run(model, prompts, args.output, f, args.batch)
            except ValueError as e:  # the embeddings and two layer slots are the least a device holds
                print(f"  {100 * f:3.0f}% resident: cannot run ({e})", flush=True)
                continue
            r.update(model=model, fraction=f, baseline_tokens_per_s=base["tokens_per_s"],
                     baseline_bytes_per_token=base["bytes_per_token"])
            results.append(r)
            full = next(x for x in results if x["model"] == model and x["fraction"] == 1.0)
            print(f"  {100 * f:3.0f}% resident ({r['streamed_layers']} layers streamed): {r['tokens_per_s']:.1f} "
                  f"tokens/s, {r['bytes_per_token'] / 1e6:.2f} MB fetched per token (waited {r['fetch_wait_s']:.1f} s "
                  f"on copies); {r['tokens_per_s'] / base['tokens_per_s']:.2f}x layer streaming, "
                  f"{r['tokens_per_s'] / full['tokens_per_s']:.2f}x fully resident", flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "cpu": cpu_summary(), "copy_bytes_per_s": bw, "results": results},
                              indent=2))
    from plots import line_plot

    models = list(dict.fromkeys(r["model"] for r in results))
    fractions = sorted({r["fraction"] for r in results}, reverse=True)
    series = {}
    for m in models:
        rows = {r["fraction"]: r for r in results if r["model"] == m}
        series[f"shoal {Path(m).name}"] = [rows[f]["tokens_per_s"] if f in rows else None for f in fractions]
        series[f"layer streaming {Path(m).name}"] = [rows[f]["baseline_tokens_per_s"] if f in rows else None
                                                     for f in fractions]
    line_plot(out.with_suffix(".png"), [100 * f for f in fractions], [{"ylabel": "generated tokens/s", "series": series}],
              "% of the weights resident", "weight streaming")


if __name__ == "__main__":
    main()
