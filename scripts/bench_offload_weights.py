"""Throughput when the device cannot hold the model: Shoal's weight streaming at 100%,
50% and 25% of the weights resident, against a layer-streaming baseline, on the dense
W1 model and the MoE model, in the same run.

- shoal: `EngineConfig(device_memory=...)` (`nodes/worker/weight_streamer.py`): as many
  layers resident as fit, the rest copied into two slots ahead of use on a copy thread,
  a MoE layer's experts copied only when its router chose them (or ahead of use with
  the layer when the step's tokens are expected to use most of them); every sequence in
  one continuously batched run, so each fetched layer serves all of them.
- layer streaming: what accelerate's CPU offload does: every layer (every expert)
  copied in before it runs, nothing ahead of use, for fixed batches of --batch
  sequences run one after another.

On a CPU the "device" is the same memory: a fetch is a memcpy at the machine's copy
bandwidth (measured here too), the code path a GPU takes with pinned host memory.
Every side runs the same step budget (--budget) under MB, so no cached calibration tilts
one of them. Reported: generated tokens/s (the best of --repeats), bytes fetched per
generated token, the ratios, and each streamed figure through the fetch term of the step
cost (`explain`); --json and a PNG beside it.

    python scripts/bench_offload_weights.py
    python scripts/bench_offload_weights.py --models .bench/model-moe-small --sequences 128
"""

from __future__ import annotations

import gc
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


def release_device() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def prompts_for(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    r = random.Random(seed)
    return [[r.randrange(vocab - 1) for _ in range(r.randint(32, 64))] for _ in range(n)]


_weight_bytes: dict[tuple[str, str], int] = {}


def weight_bytes(model: str, device: str) -> int:
    """The model's weight bytes in the dtype the engine picks on `device`: one small eager
    engine per model (no decode graphs captured), remembered for every fraction."""
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.nodes.worker.weight_streamer import nbytes

    if (model, device) not in _weight_bytes:
        probe = LLMEngine(model, EngineConfig(policy="mb", packed_linears=False, num_blocks=4, device=device,
                                              enforce_eager=True))
        _weight_bytes[model, device] = nbytes(probe.model)
        del probe
        release_device()
    return _weight_bytes[model, device]


def run(model: str, prompts, out: int, fraction: float | None, batch: int, budget: int, repeats: int = 1,
        device: str = "cpu") -> dict:
    """fraction: of the weights resident (Shoal); None: the layer-streaming baseline.
    The best of `repeats` timed runs (this machine's neighbours come and go). `device`:
    where the engine computes (on a GPU the streamed weights come over PCIe)."""
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.nodes.worker.weight_streamer import WeightStreamer
    from shoal.sampling import SamplingParams

    if fraction is None:
        # Eager: a resident engine on a GPU would capture decode graphs, whose replays read
        # the weights where they were and never call the streamer attached below.
        eng = LLMEngine(model, EngineConfig(policy="mb", packed_linears=False, max_num_batched_tokens=budget,
                                            device=device, enforce_eager=True))
        eng.streamer = eng.model.streamer = WeightStreamer(eng.model, 0, resident_layers=0, overlap=False,
                                                           routed_experts_only=False)
        groups = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    else:
        memory = int(weight_bytes(model, device) * fraction) if fraction < 1 else 0
        eng = LLMEngine(model, EngineConfig(policy="mb", device_memory=memory, max_num_seqs=max(256, len(prompts)),
                                            max_num_batched_tokens=budget, device=device))
        groups = [prompts]
    params = SamplingParams(max_tokens=out, ignore_eos=True)
    eng.generate(prompts[:2], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    best = None
    for _ in range(repeats):
        before = eng.streamer.summary()["bytes_fetched"] if eng.streamer else 0
        steps = eng.stats.steps
        t = time.perf_counter()
        tokens = sum(len(o.token_ids) for g in groups for o in eng.generate(g, params))
        wall = time.perf_counter() - t
        if best is None or wall < best[0]:
            best = (wall, tokens, eng.stats.steps - steps,
                    (eng.streamer.summary()["bytes_fetched"] if eng.streamer else 0) - before)
    wall, tokens, steps, fetched = best
    s = eng.streamer.summary() if eng.streamer else {"bytes_fetched": 0, "resident_bytes": None, "weight_bytes": None}
    bandwidth = eng.streamer.fetch_cost.bandwidth if eng.streamer else None
    if eng.streamer:  # nothing of this engine (its copy thread, its memory) stays to weigh on the next
        eng.streamer.close()
    del eng
    release_device()
    return {"tokens_per_s": tokens / wall, "wall": wall, "tokens": tokens, "steps": steps,
            "bytes_per_token": fetched / tokens, "resident_bytes": s["resident_bytes"],
            "weight_bytes": s["weight_bytes"], "streamed_layers": s.get("streamed_layers", 0),
            "fetch_wait_s": s.get("fetch_wait_s", 0.0),
            "copy_bytes_per_s": bandwidth}


def explain(r: dict, full: dict) -> dict:
    """The figures through the fetch term of the step cost (`scheduler/fetch_cost.py`):
    each step copies the streamed weights once, F = bytes per step / copy bandwidth; on a
    CPU the copies share the compute's memory bandwidth, so a step takes its resident
    time T plus F, and the streamed run reaches T / (T + F) of the resident one. The
    batch whose compute covers its fetch (at least half the resident throughput) is the
    B with T(B) >= F: about B·F/T at the measured B."""
    steps = r["steps"] or 1
    fetch_s = r["bytes_per_token"] * r["tokens"] / steps / r["copy_bytes_per_s"] if r["copy_bytes_per_s"] else 0.0
    resident_step = full["wall"] / max(1, full["steps"])
    return {"fetch_ms_per_step": 1e3 * fetch_s, "resident_ms_per_step": 1e3 * resident_step,
            "predicted_vs_resident": resident_step / (resident_step + fetch_s),
            "covering_batch": r["sequences"] * fetch_s / resident_step}


def main() -> None:
    import argparse

    from bench_generate import cpu_summary

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=".bench/model-small,.bench/model-moe-small")
    ap.add_argument("--sequences", default="64,128", help="sequence counts, each run on every model and fraction")
    ap.add_argument("--output", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8, help="the baseline's fixed batch")
    ap.add_argument("--budget", type=int, default=2048, help="tokens per step, the same on every side")
    ap.add_argument("--repeats", type=int, default=2, help="Shoal's timed runs per point (the best is kept)")
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
        for n in (int(x) for x in args.sequences.split(",")):
            prompts = prompts_for(n, vocab)
            base = run(model, prompts, args.output, None, args.batch, args.budget)
            print(f"{model}, {n} sequences: layer streaming, batches of {args.batch}: {base['tokens_per_s']:.1f} "
                  f"tokens/s, {base['bytes_per_token'] / 1e6:.1f} MB fetched per token", flush=True)
            full = None
            for f in (float(x) for x in args.fractions.split(",")):
                try:
                    r = run(model, prompts, args.output, f, args.batch, args.budget, args.repeats)
                except ValueError as e:  # the embeddings and two layer slots are the least a device holds
                    print(f"  {100 * f:3.0f}% resident: cannot run ({e})", flush=True)
                    continue
                r.update(model=model, fraction=f, sequences=n, baseline_tokens_per_s=base["tokens_per_s"],
                         baseline_bytes_per_token=base["bytes_per_token"])
                full = full or (r if f == 1.0 else None)
                line = (f"  {100 * f:3.0f}% resident ({r['streamed_layers']} layers streamed): {r['tokens_per_s']:.1f} "
                        f"tokens/s, {r['bytes_per_token'] / 1e6:.2f} MB fetched per token; "
                        f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x layer streaming")
                if full is not None and r["streamed_layers"]:
                    r.update(explain(r, full))
                    line += (f", {r['tokens_per_s'] / full['tokens_per_s']:.2f}x fully resident (the cost model: "
                             f"{r['fetch_ms_per_step']:.0f} ms fetch per step at "
                             f"{r['copy_bytes_per_s'] / 1e9:.1f} GB/s on a {r['resident_ms_per_step']:.0f} ms step "
                             f"predicts {r['predicted_vs_resident']:.2f}x; compute covers the fetch from "
                             f"~{r['covering_batch']:.0f} sequences)")
                print(line, flush=True)
                results.append(r)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "cpu": cpu_summary(), "copy_bytes_per_s": bw, "results": results},
                              indent=2))
    from plots import line_plot

    models = list(dict.fromkeys(r["model"] for r in results))
    fractions = sorted({r["fraction"] for r in results}, reverse=True)
    series = {}
    for m in models:
        for n in sorted({r["sequences"] for r in results if r["model"] == m}):
            rows = {r["fraction"]: r for r in results if r["model"] == m and r["sequences"] == n}
            name = f"{Path(m).name}, {n} seqs"
            series[f"shoal {name}"] = [rows[f]["tokens_per_s"] if f in rows else None for f in fractions]
            series[f"layer streaming {name}"] = [rows[f]["baseline_tokens_per_s"] if f in rows else None
                                                 for f in fractions]
    line_plot(out.with_suffix(".png"), [100 * f for f in fractions], [{"ylabel": "generated tokens/s", "series": series}],
              "% of the weights resident", "weight streaming")


if __name__ == "__main__":
    main()
