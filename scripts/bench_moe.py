"""Expert-level batching on a mixture-of-experts model (Qwen3-MoE, `--preset moe-small`:
16 experts, top 2, W1's attention stack), in the same run:

- shoal: the engine as it runs, each step's tokens of every sequence grouped by expert,
  one matrix multiply per expert (`nodes/worker/models/moe.py`);
- per-sequence dispatch: the same engine, but each MoE layer runs every sequence's
  tokens on their own (a decode token alone), what a runtime without cross-sequence
  expert batches does;
- transformers: `generate` of the same model (its own MoE block), the same prompts,
  batched with left padding.

Reported: generated tokens/s per side at each concurrency, and, for one MoE layer alone,
the time of a decode step's MLP over N sequences' tokens each way. Figures go to --json
and a PNG plot beside it.

    python scripts/bench_moe.py                                   # 16, 64 and 128 sequences
    python scripts/bench_moe.py --sequences 64 --peers shoal,per-sequence
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402


class PerSequenceDispatch:
    """Patches MoeBlock.forward to run each span of the step (a decode token, or one
    sequence's prefill chunk) alone, as one sequence at a time would."""

    def __init__(self):
        from shoal.nodes.worker.models.decoder import DecoderLM
        from shoal.nodes.worker.models.moe import MoeBlock

        self.classes, self.meta = (DecoderLM, MoeBlock), None
        self.saved = (DecoderLM.forward, MoeBlock.forward)

    def __enter__(self):
        DecoderLM, MoeBlock = self.classes
        model_forward, moe_forward = self.saved
        outer = self

        def forward(model, input_ids, positions, kv_caches, meta, logit_rows):
            outer.meta = meta
            return model_forward(model, input_ids, positions, kv_caches, meta, logit_rows)

        def per_sequence(block, x):
            meta = outer.meta
            if meta is None or meta.span_rows is None:
                return torch.cat([moe_forward(block, x[i:i + 1]) for i in range(x.shape[0])])
            return torch.cat([moe_forward(block, x[r:r + n]) for r, n in zip(meta.span_rows.tolist(), meta.span_lens.tolist())])

        DecoderLM.forward, MoeBlock.forward = forward, per_sequence
        return self

    def __exit__(self, *exc):
        self.classes[0].forward, self.classes[1].forward = self.saved


def work(n: int, prompt: tuple[int, int], out: int, vocab: int, seed: int = 0):
    r = random.Random(seed)
    return [[r.randrange(vocab - 1) for _ in range(r.randint(*prompt))] for _ in range(n)], out


def run_shoal(model: str, asked_dtype: str, prompts, out: int, per_sequence: bool) -> dict:
    from contextlib import nullcontext

    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    # The dtype as asked: `auto` resolves in the engine, its KV cache's dtype with it.
    eng = LLMEngine(model, EngineConfig(dtype=asked_dtype, policy="mb", max_num_seqs=max(256, len(prompts))))
    eng.generate(prompts[:2], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up
    with PerSequenceDispatch() if per_sequence else nullcontext():
        t = time.perf_counter()
        outs = eng.generate(prompts, SamplingParams(max_tokens=out, ignore_eos=True))
        wall = time.perf_counter() - t
    tokens = sum(len(o.token_ids) for o in outs)
    return {"wall": wall, "tokens": tokens, "tokens_per_s": tokens / wall}


def run_transformers(model: str, dtype: str, prompts, out: int) -> dict:
    from transformers import AutoModelForCausalLM

    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype).eval()
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        hf.generate(ids[:2, -4:], attention_mask=mask[:2, -4:], max_new_tokens=2, do_sample=False, pad_token_id=0)
        t = time.perf_counter()
        gen = hf.generate(ids, attention_mask=mask, max_new_tokens=out, min_new_tokens=out, do_sample=False,
                          pad_token_id=0)
        wall = time.perf_counter() - t
    tokens = (gen.shape[1] - width) * len(prompts)
    return {"wall": wall, "tokens": tokens, "tokens_per_s": tokens / wall}


def layer_times(model: str, dtype: str, sizes: list[int], repeats: int = 5) -> list[dict]:
    """One MoE layer's MLP over N decode tokens: expert-batched, per token, transformers'."""
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    from shoal.nodes.worker.models.loader import load_decoder

    decoder, _ = load_decoder(model, dtype)
    moe = next(layer.mlp for layer in decoder.layers if hasattr(layer.mlp, "router"))
    raw = json.loads(Path(model, "config.json").read_text())
    hf = Qwen3MoeSparseMoeBlock(Qwen3MoeConfig(**{k: v for k, v in raw.items() if k != "architectures"}))
    with torch.no_grad():
        hf.gate.weight.copy_(moe.router.weight)
        hf.experts.gate_up_proj.copy_(moe.gate_up)
        hf.experts.down_proj.copy_(moe.down)
    hf = hf.to(moe.gate_up.dtype).eval()
    rows = []
    for n in sizes:
        x = torch.randn(n, moe.gate_up.shape[2], generator=torch.Generator().manual_seed(n)).to(moe.gate_up.dtype)
        timings = {}
        for name, fn in (("expert_batched", lambda: moe(x)),
                         ("per_sequence", lambda: torch.cat([moe(x[i:i + 1]) for i in range(n)])),
                         ("transformers", lambda: hf(x.unsqueeze(0)))):
            with torch.inference_mode():
                fn()
                t = time.perf_counter()
                for _ in range(repeats):
                    fn()
                timings[name] = (time.perf_counter() - t) / repeats
        rows.append({"tokens": n, **{f"{k}_ms": 1e3 * v for k, v in timings.items()},
                     "experts_hit": sum(b > 0 for b in moe.expert_batches(x))})
    return rows


def main() -> None:
    from bench_generate import cpu_summary
    from workloads import bench_arguments

    ap = bench_arguments(__doc__)
    ap.set_defaults(model=".bench/model-moe-small")
    ap.add_argument("--concurrency", default="16,64,128", help="sequences per run, comma-separated")
    ap.add_argument("--prompt", default="32,64", help="prompt length range (random token ids)")
    ap.add_argument("--output", type=int, default=32, help="tokens each sequence generates")
    ap.add_argument("--peers", default="shoal,per-sequence,transformers")
    ap.add_argument("--json", default=".bench/moe.json")
    args = ap.parse_args()
    if not Path(args.model, "config.json").exists():
        from shoal.nodes.worker.models.make_model import make_model

        make_model(args.model, preset="moe-small", dtype="bfloat16")
    from shoal.nodes.worker.dtype_choice import choose_dtype  # the dtype a worker would pick here

    dtype = choose_dtype(args.dtype, args.model).name
    cfg = json.loads(Path(args.model, "config.json").read_text())
    peers = args.peers.split(",")
    print(f"{args.model}: {cfg['num_experts']} experts, top {cfg['num_experts_per_tok']}, {cfg['num_hidden_layers']} layers, "
          f"{dtype}; {cpu_summary()}", flush=True)
    rows = []
    for n in [int(x) for x in args.concurrency.split(",")]:
        prompts, out = work(n, tuple(int(x) for x in args.prompt.split(",")), args.output, cfg["vocab_size"])
        row = {"sequences": n}
        for peer in peers:
            if peer == "transformers":
                r = run_transformers(args.model, dtype, prompts, out)
            else:
                r = run_shoal(args.model, args.dtype, prompts, out, per_sequence=peer == "per-sequence")
            row[peer] = r["tokens_per_s"]
            print(f"  {n:4d} sequences, {peer:>13}: {r['tokens_per_s']:8.1f} generated tokens/s ({r['wall']:.1f} s)",
                  flush=True)
        if "shoal" in row:
            print(f"  {n:4d} sequences: shoal " + ", ".join(f"{row['shoal'] / row[p]:.2f}x {p}" for p in peers
                                                           if p != "shoal"), flush=True)
        rows.append(row)
    layers = layer_times(args.model, dtype, [1, 16, 64, 128, 256])
    for r in layers:
        print(f"  one MoE layer, {r['tokens']:3d} decode tokens ({r['experts_hit']} experts hit): expert-batched "
              f"{r['expert_batched_ms']:.2f} ms, per sequence {r['per_sequence_ms']:.2f} ms, transformers' block "
              f"{r['transformers_ms']:.2f} ms", flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "cpu": cpu_summary(), "dtype": dtype, "runs": rows,
                               "layer": layers}, indent=2))
    from plots import line_plot

    line_plot(out.with_suffix(".png"), [r["sequences"] for r in rows], [
        {"ylabel": "generated tokens/s", "series": {p: [r[p] for r in rows] for p in peers}}], "sequences",
        "mixture of experts: expert-level batches")


if __name__ == "__main__":
    main()
