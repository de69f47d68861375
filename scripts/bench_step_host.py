"""The host's share of a decode step: planning, the runner's input tensors, sampling's
bookkeeping, per sequence, with the model's own time taken out.

On a GPU the host's work for a step runs while the device waits (the step reads its
sampled tokens back before the next is planned), so every microsecond per sequence here
is device time lost at large batches: at 256 sequences of a Qwen3-1.7B-shaped model an
H100's decode step is about 4 ms of memory traffic. The model here is the tiny preset
on the CPU, whose forward is timed apart and subtracted; what is left is the same
Python a GPU worker runs.

    python scripts/bench_step_host.py --sequences 256 1024
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time
from pathlib import Path


def measure(model: str, n: int, steps: int, async_scheduling: bool = False) -> dict:
    import torch

    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    eng = LLMEngine(model, EngineConfig(device="cpu", dtype="float32", policy="mb", max_num_seqs=max(256, n),
                                        max_num_batched_tokens=16384, async_scheduling=async_scheduling))
    g = torch.Generator().manual_seed(0)
    vocab = eng.model_cfg.vocab_size
    for i in range(n):
        eng.add_request(("q", i), prompt_token_ids=torch.randint(10, vocab - 10, (200,), generator=g).tolist(),
                        params=SamplingParams(max_tokens=steps + 20, ignore_eos=True))
    while eng.waiting or any(s.num_computed < s.num_prompt_tokens for s in eng.running):
        eng.step()
    model_s = [0.0]
    forward = eng.runner.model

    class Timed:  # the model's forward, timed apart
        def __getattr__(self, name):
            return getattr(forward, name)

        def __call__(self, *a, **k):
            t = time.perf_counter()
            out = forward(*a, **k)
            model_s[0] += time.perf_counter() - t
            return out

    eng.runner.model = Timed()
    gc.collect()
    gc.freeze()  # as a worker's heap is (`process_memory.freeze_startup_heap`)
    plan0 = eng.stats.time_plan
    t = time.perf_counter()
    for _ in range(steps):
        eng.step()
    wall = time.perf_counter() - t
    gc.unfreeze()
    host = wall - model_s[0]
    return {"sequences": n, "steps": steps, "host_ms_per_step": 1e3 * host / steps,
            "host_us_per_sequence": 1e6 * host / steps / n, "plan_ms_per_step": 1e3 * (eng.stats.time_plan - plan0) / steps,
            "model_ms_per_step": 1e3 * model_s[0] / steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sequences", type=int, nargs="+", default=[256, 1024])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3, help="the best of this many runs is reported")
    ap.add_argument("--async-scheduling", action="store_true",
                    help="the GPU's path: each step launched before the last one's tokens are read")
    args = ap.parse_args()
    from shoal.nodes.worker.models.make_model import make_model

    with tempfile.TemporaryDirectory() as tmp:
        model = str(Path(tmp) / "tiny")
        make_model(model, preset="tiny", dtype="float32", tokenizer_text_chars=20_000)
        for n in args.sequences:
            best = min((measure(model, n, args.steps, args.async_scheduling) for _ in range(args.repeats)),
                       key=lambda r: r["host_us_per_sequence"])
            print(f"{n} sequences: host {best['host_ms_per_step']:.2f} ms per decode step "
                  f"({best['host_us_per_sequence']:.2f} us per sequence; planning {best['plan_ms_per_step']:.2f} ms), "
                  f"model {best['model_ms_per_step']:.2f} ms")
            print(json.dumps(best))


if __name__ == "__main__":
    main()
