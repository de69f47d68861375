"""Prefill throughput: long prompts through Shoal's engine and vLLM's CPU build.

W3, the main job, is bound by prompt arithmetic (each hop's prompt keeps only the
context's last 1,500 tokens, so about three quarters of its prompt tokens must be
computed whatever the schedule); this measures that one thing, engine against engine,
without the schedule, the encoder or the cluster around it. Each round computes a fresh
set of prompts (new random token ids, so no prefix cache helps) of W3's lengths, one
output token each, in the engine's own batching (Shoal: its step budget; vLLM: its
chunked prefill).

Each engine runs in its own process, both loaded at once, and they take turns: a round
on Shoal, then the same prompts on vLLM, and so on. This machine's speed drifts by
10-50% over minutes, so the result is the median of the per-round ratios (each pair of
rounds ran within a minute of each other); every round is printed.

    python scripts/bench_prefill.py --vllm-python VENV/bin/python
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_generate import cpu_summary, vllm_cpu_env, vllm_installed  # noqa: E402
from workloads import ensure_model  # noqa: E402


def prompts(seed: int, n: int, lo: int, hi: int, vocab: int = 30000) -> list[list[int]]:
    r = random.Random(seed)
    return [[r.randrange(1, vocab) for _ in range(r.randint(lo, hi))] for _ in range(n)]


def shoal_engine(args):
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    # The dtype as asked: `auto` resolves in the engine, its KV cache's dtype with it.
    eng = LLMEngine(args.model, EngineConfig(dtype=args.asked_dtype, max_num_batched_tokens=args.budget))
    print(f"shoal: {eng.config.dtype}, KV cache {eng.config.kv_cache_dtype}, {eng.config.max_num_batched_tokens} "
          "tokens per step", file=sys.stderr)

    def run(ps: list[list[int]], tag: int) -> None:
        for i, p in enumerate(ps):
            eng.add_request((tag, i), prompt_token_ids=p, params=SamplingParams(max_tokens=1, ignore_eos=True))
        while eng.has_unfinished():
            eng.step()
    return run


def vllm_engine(args):
    vllm_cpu_env()
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(args.model, skip_tokenizer_init=True, dtype=args.dtype)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True, detokenize=False)

    def run(ps: list[list[int]], tag: int) -> None:
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], params, use_tqdm=False)
    return run


def child(args) -> None:
    """Loads an engine, says READY, then runs one round per `round N` line on stdin."""
    run = (shoal_engine if args.child == "shoal" else vllm_engine)(args)
    print("READY", flush=True)
    for line in sys.stdin:
        rnd = int(line.split()[1])
        ps = prompts(1000 + rnd, args.prompts, args.min_len, args.max_len)
        t = time.perf_counter()
        run(ps, rnd)
        print(f"RATE {sum(map(len, ps)) / (time.perf_counter() - t)}", flush=True)


class Side:
    """An engine in its own process, taking rounds when told."""

    def __init__(self, python: str, side: str, args):
        cmd = [python, str(Path(__file__).resolve()), "--child", side, "--model", args.model, "--dtype", args.dtype,
               "--asked-dtype", args.asked_dtype,
               "--prompts", str(args.prompts), "--min-len", str(args.min_len), "--max-len", str(args.max_len)]
        cmd += ["--budget", str(args.budget)] if args.budget else []
        self.name = side
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._expect("READY")

    def _expect(self, word: str) -> str:
        for line in self.proc.stdout:
            if line.startswith(word):
                return line
        raise SystemExit(f"{self.name} stopped (exit {self.proc.wait()}); its messages are above")

    def round(self, rnd: int) -> float:
        self.proc.stdin.write(f"round {rnd}\n")
        self.proc.stdin.flush()
        return float(self._expect("RATE").split()[1])

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".bench/model-small", help="W1's model (made with --preset small if absent)")
    ap.add_argument("--dtype", default="auto", help="auto: what the worker picks on this CPU")
    ap.add_argument("--vllm-python", default=sys.executable, help="the interpreter of a venv with vLLM's CPU build")
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--min-len", type=int, default=900)
    ap.add_argument("--max-len", type=int, default=1500, help="W3's prompts: up to 1,500 context tokens")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--budget", type=int, default=None, help="Shoal's tokens per step (default: its calibration's)")
    ap.add_argument("--json")
    ap.add_argument("--child", choices=["shoal", "vllm"], help=argparse.SUPPRESS)
    ap.add_argument("--asked-dtype", help=argparse.SUPPRESS)  # --dtype before `auto` resolved
    args = ap.parse_args()
    if args.child:
        return child(args)
    ensure_model(args.model)
    args.asked_dtype = args.dtype
    if args.dtype == "auto":
        from shoal.nodes.worker.dtype_choice import choose_dtype

        choice = choose_dtype("auto", args.model)
        print(f"dtype auto: {choice.name} ({choice.reason})")
        args.dtype = choice.name
    print(f"CPU: {cpu_summary()}")
    print(f"{args.prompts} prompts of {args.min_len}-{args.max_len} random tokens per round, one output token each")
    sides = [Side(sys.executable, "shoal", args)]
    if vllm_installed(args.vllm_python):
        sides.append(Side(args.vllm_python, "vllm", args))
    else:
        print(f"(vLLM is not installed for {args.vllm_python}: Shoal alone)")
    out = {s.name: [] for s in sides}
    for rnd in range(args.rounds + 1):  # round 0 warms both up
        rates = {s.name: s.round(rnd) for s in sides}
        if rnd == 0:
            continue
        for name, rate in rates.items():
            out[name].append(rate)
        print(f"round {rnd}: " + ", ".join(f"{n} {r:,.0f} tok/s" for n, r in rates.items())
              + (f"  ({rates['shoal'] / rates['vllm']:.2f}x)" if "vllm" in rates else ""), flush=True)
    for s in sides:
        s.close()
        print(f"{s.name}: median {statistics.median(out[s.name]):,.0f} tok/s")
    if "vllm" in out:
        out["ratio"] = statistics.median(a / b for a, b in zip(out["shoal"], out["vllm"]))
        print(f"shoal vs vllm prefill: {out['ratio']:.2f}x (median of the per-round ratios)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
