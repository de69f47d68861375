"""Structured outputs: what constraining every request to a JSON schema costs the engine.

W1's shape (prompts of U[128, 256] tokens, up to U[128, 256] output tokens, the W1 model),
every request constrained by a JSON schema of a few fields (enums, bounded integers,
bounded strings, a bounded list of notes), against the same requests unconstrained, in
the same run, on one engine in this process:

1. The constrained run goes first once to learn each sequence's output length (greedy:
   deterministic). The unconstrained run then generates exactly those lengths
   (`ignore_eos`), so both runs have the same prompts, the same output lengths and the
   same step schedule: the difference is the grammar's work alone. Rounds alternate
   their order (turned_rounds.py); the ratio is the median of per-round ratios.
2. The grammar's own time: masks filled on their thread beside the forward pass, and the
   time steps waited for them after it (what lies on the critical path).
3. Compile time per distinct schema (in the engine, for this tokenizer; and the submit
   side's check, without one), and the grammar cache's hit rate over a job of 1,000
   requests with 10 schemas (8 tokens each: the cache is what is measured).

    python scripts/bench_structured.py                  # 32 sequences, 2 rounds
    python scripts/bench_structured.py --sequences 128  # full W1
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from turned_rounds import format_ratio, per_round, run_rounds  # noqa: E402
from workloads import bench_arguments, ensure_model, w1  # noqa: E402

LABELS = ["billing", "shipping", "returns", "technical", "account", "other"]


def schema(variant: int = 0) -> dict:
    """A support-ticket triage record; `variant` renames a field and an enum value, so
    ten variants are ten distinct grammars of the same size."""
    return {"type": "object", "additionalProperties": False,
            "required": ["category", "priority", f"summary_{variant}", "sentiment", "notes"],
            "properties": {
                "category": {"enum": [f"{x}_{variant}" if i == 0 else x for i, x in enumerate(LABELS)]},
                "priority": {"type": "integer", "minimum": 1, "maximum": 5},
                f"summary_{variant}": {"type": "string", "maxLength": 80},
                "sentiment": {"enum": ["negative", "neutral", "positive"]},
                "notes": {"type": "array", "minItems": 4, "maxItems": 16, "items": {"type": "string", "maxLength": 120}},
            }}


def cpu_summary() -> str:
    from shoal.nodes.worker.dtype_choice import cpu_flags, cpu_model

    flags = cpu_flags()
    return f"{cpu_model()}; {os.cpu_count()} cores; " + " ".join(
        f for f in ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"] if f in flags)


def run(eng, work, params) -> dict:
    s0 = dict(vars(eng.stats))
    g0 = eng.grammars.fill_seconds
    t = time.perf_counter()
    outs = eng.generate(work.prompts, params, seq_ids=[(time.perf_counter_ns(), i) for i in range(len(work.prompts))])
    wall = time.perf_counter() - t
    s = eng.stats
    tokens = sum(len(o.token_ids) for o in outs)
    return {"wall": wall, "tokens": tokens, "tok_s": tokens / wall, "steps": s.steps - s0["steps"],
            "model_s": s.time_model - s0["time_model"], "sample_s": s.time_sample - s0["time_sample"],
            "grammar_wait_s": s.time_grammar_wait - s0["time_grammar_wait"],
            "fill_s": eng.grammars.fill_seconds - g0, "outs": outs}


def main() -> None:
    ap = bench_arguments(__doc__, sequences=32, rounds=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    ensure_model(args.model)
    from shoal.constraint import check_compiles, constraint_of
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    print(f"CPU: {cpu_summary()}")
    # No prefix cache: every run computes its prompts in full, whatever ran before.
    eng = LLMEngine(args.model, EngineConfig(dtype=args.dtype, num_threads=args.threads, prefix_caching=False))
    print(f"engine: {eng.config.dtype}, {eng.threads} threads, budget {eng.config.max_num_batched_tokens}")
    work = w1(vocab_size=eng.model_cfg.vocab_size, sequences=args.sequences)
    constrained = [SamplingParams(max_tokens=n, json_schema=schema()) for n in work.output_lens]
    eng.generate(work.prompts[:2], [SamplingParams(max_tokens=4, json_schema=schema())] * 2)  # warm: tokenizer, kernels
    pilot = run(eng, work, constrained)
    lengths = [len(o.token_ids) for o in pilot["outs"]]
    stopped = sum(o.finish_reason == "stop" for o in pilot["outs"])
    free = [SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths]
    print(f"W1 shape, {len(lengths)} sequences: constrained outputs of {statistics.mean(lengths):.0f} tokens on average "
          f"({stopped} ended by their grammar, the rest at max_tokens); the unconstrained run generates the same lengths")

    def run_one(name: str, rnd: int) -> dict:
        r = run(eng, work, constrained if name == "json_schema" else free)
        assert [len(o.token_ids) for o in r["outs"]] == lengths
        print(f"  {name:12s} {r['tok_s']:7.1f} tok/s  ({r['tokens']} tokens in {r['wall']:.2f}s, {r['steps']} steps; "
              f"model {r['model_s']:.2f}s, sampling {r['sample_s']:.2f}s, mask thread {r['fill_s']:.3f}s of wall time beside it (its GIL waits included), "
              f"waited for after the forward pass {r['grammar_wait_s']:.3f}s)", flush=True)
        return r

    rounds = run_rounds(["json_schema", "plain"], args.rounds, run_one)
    ratios = per_round(rounds, "json_schema", "plain", lambda a, b: a["tok_s"] / b["tok_s"])
    print(f"constrained / unconstrained tokens/s: {format_ratio(ratios, 'x')}  (target >= 0.90)")

    # Compile time per distinct schema, and the cache over 1,000 requests of 10 schemas.
    schemas = [schema(v) for v in range(1, 11)]
    t = time.perf_counter()
    for sc in schemas:
        check_compiles(constraint_of(json_schema=sc))
    submit_ms = (time.perf_counter() - t) / len(schemas) * 1e3
    g = eng.grammars
    h0, m0, c0 = g.hits, g.misses, g.compile_seconds
    job = [SamplingParams(max_tokens=8, json_schema=schemas[i % 10]) for i in range(1000)]
    prompts = [work.prompts[i % len(work.prompts)][:32] for i in range(1000)]
    t = time.perf_counter()
    eng.generate(prompts, job, seq_ids=[("cache", i) for i in range(1000)])
    wall = time.perf_counter() - t
    hits, misses = g.hits - h0, g.misses - m0
    print(f"compile per distinct schema: {(g.compile_seconds - c0) / max(misses, 1) * 1e3:.1f} ms in the engine "
          f"(this tokenizer, {eng.model_cfg.vocab_size} tokens), {submit_ms:.1f} ms checked at submit")
    print(f"grammar cache over 1,000 requests with 10 schemas: {hits} hits, {misses} misses "
          f"(hit rate {hits / (hits + misses):.1%}); the job took {wall:.1f}s")


if __name__ == "__main__":
    main()
