"""W1: Shoal's engine, in-process and through a local cluster, against vLLM's CPU build
(where it is installed) and transformers static batching, on the same inputs in the
same run.

Each system runs in its own fresh process so that peak RSS is its own. Prints one
summary line per figure and the ratios; `--json PATH` writes them too.

    python scripts/bench_generate.py                      # W1 in the default dtype (auto)
    python scripts/bench_generate.py --dtype bfloat16     # every system in bf16
    python scripts/bench_generate.py --sequences 32       # a scaled-down W1
    python scripts/bench_generate.py --vllm-python /tmp/vv/bin/python   # vLLM from its own venv
    python scripts/bench_generate.py --isa avx2           # as on a CPU with AVX2 only
    python scripts/bench_generate.py --peers shoal-cluster --rounds 3   # the cluster's cost, 3 rounds

`--rounds N` runs every system N times, each run a fresh process, in an order that turns
around every round (A B C, then C B A, ...), and reports the median of the per-round
ratios: this machine's speed drifts by 10-50% over minutes, more than the gaps measured,
so one run of each side, minutes apart, can say little (the first round's runs are the
cold ones a user gets; so are all the others).

`--isa avx2` runs every system as it would run on an AVX2-only CPU, on this one: torch's
own kernels (ATEN_CPU_CAPABILITY), oneDNN and MKL are capped at AVX2, Shoal loads its
AVX2 native build, and `auto` resolves without the AVX-512 flags (to float32). vLLM's
CPU build keeps its own compiled kernels (attention, cache ops), which this cannot cap.

Beside the matmul ceiling the run measures the memory read rate and prints W1's roofline
floor (`roofline.py`): its matmuls at the ceiling plus its decode steps' KV-cache reads at
the read rate. Each system's time is also given as a share of that floor, and the floor
says how much of the ceiling any engine's model FLOP/s can reach on W1 on this machine.

`--dtype auto` resolves as the worker does (`nodes/worker/dtype_choice.py`): the
checkpoint's bf16 where this CPU has AVX512_BF16 or AMX, else float32, for every system.
Shoal's KV cache dtype (`--kv-cache-dtype auto`) resolves as the worker's too: bf16 where
auto computes the bf16 checkpoint in fp32; the roofline floor counts its bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from roofline import decode_cache_bytes, floor_seconds, memory_read_gbps  # noqa: E402
from turned_rounds import format_ratio, per_round, run_rounds  # noqa: E402
from workloads import w1  # noqa: E402


def matmul_gflops(dtype_name: str, threads: int) -> dict:
    """The machine's matrix-multiply throughput, the ceiling a decoder step can reach:
    the best of torch's `F.linear` and oneDNN with a prepacked weight (what vLLM's CPU
    build and Shoal's packed linears call), at a decoder step's shape."""
    import torch

    from shoal.nodes.worker.models.packed_linear import PackedLinear

    torch.set_num_threads(threads)
    dtype = getattr(torch, dtype_name)
    x = torch.randn(1024, 768, dtype=dtype)
    lin = torch.nn.Linear(768, 4096, bias=False).to(dtype)
    calls = {"F.linear": lambda: torch.nn.functional.linear(x, lin.weight)}
    try:
        packed = PackedLinear(lin, 1024)
        calls["oneDNN packed"] = lambda: packed(x)
    except Exception:  # no oneDNN ops in this torch build
        pass
    rates = {}
    with torch.inference_mode():
        for name, fn in calls.items():
            for _ in range(3):
                fn()
            # The best of 5 timings of 10 calls: a ceiling, not a typical rate (one timing
            # on this noisy machine read 10-15% low, below what the engines then reached).
            best = 0.0
            for _ in range(5):
                n, t = 10, time.perf_counter()
                for _ in range(n):
                    fn()
                best = max(best, 2 * 1024 * 768 * 4096 * n / (time.perf_counter() - t) / 1e9)
            rates[name] = best
    return rates


# The environment that caps every library at AVX2 (what `--isa avx2` sets for all runs).
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "SHOAL_VECTOR_ISA": "AVX2"}


def cpu_summary() -> str:
    """The CPU model and the vector flags every figure depends on."""
    from shoal.nodes.worker.dtype_choice import cpu_flags, cpu_model

    wanted = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16"]
    flags = cpu_flags()
    summary = f"{cpu_model()}; {os.cpu_count()} cores; " + " ".join(f for f in wanted if f in flags)
    if os.environ.get("SHOAL_VECTOR_ISA") == "AVX2":
        summary += " (capped at AVX2: " + ", ".join(f"{k}={v}" for k, v in AVX2_ENV.items()) + ")"
    return summary


def run_shoal(args, work) -> dict:
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    eng = LLMEngine(args.model, EngineConfig(dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype,
                                             max_num_batched_tokens=args.budget, num_threads=args.threads,
                                             policy=args.policy))
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in work.output_lens]
    t = time.perf_counter()
    outs = eng.generate(work.prompts, params)
    wall = time.perf_counter() - t
    s = eng.stats
    result = {"wall": wall, "output_tokens": sum(len(o.token_ids) for o in outs), "steps": s.steps,
              "breakdown": {"plan": s.time_plan, "model": s.time_model, "sample": s.time_sample},
              "preemptions": s.preemptions, "budget": eng.config.max_num_batched_tokens,
              "budget_reason": eng.budget_reason, "policy_fallback": eng.policy_fallback,
              "attention": eng.runner.ops.name if eng.runner.ops is not None else "sdpa", "packed_linears": eng.packed_linears,
              "pad_rows": eng.model.pad_rows}
    if args.no_profile:
        return result
    # A step's anatomy, profiled apart from the timed run: the same work again, with
    # the profiler on for steps in the prefill-and-decode middle of the job.
    from step_profile import profile_steps

    for i, (p, n) in enumerate(zip(work.prompts, work.output_lens)):
        eng.add_request(("profile", i), prompt_token_ids=p, params=SamplingParams(max_tokens=n, ignore_eos=True))
    for _ in range(60):
        eng.step()
    result["step_profile"] = profile_steps(eng, 10)
    return result


def run_shoal_cluster(args, work) -> dict:
    """The same work as a job through a local cluster (etcd, router, scheduler, storage
    and one worker, all on this machine's cores): wall time from submit to the last
    result. The worker calibrates (or loads its calibration) before the clock starts."""
    import shoal
    from cluster_stats import worker_stats
    from workloads import job_items

    worker_args = ["--kv-cache-dtype", args.kv_cache_dtype] + (["--budget", str(args.budget)] if args.budget else [])
    with shoal.LocalCluster(args.model, workers=1, dtype=args.dtype, policy=args.policy, worker_threads=args.threads,
                            worker_args=worker_args) as cluster:
        client = shoal.Client(cluster.router)
        before = worker_stats(cluster)["engine"]
        t = time.perf_counter()
        results = client.submit(job_items(work), params={"ignore_eos": True}).wait()
        wall = time.perf_counter() - t
        after = worker_stats(cluster)["engine"]
        client.close()
    failed = [r for r in results if r.get("error")]
    if failed:
        raise RuntimeError(f"{len(failed)} items failed, e.g. {failed[0]}")
    # The worker's engine counters over the job tell its engine time (which varies with
    # the machine as the in-process run's does) from the time the job spent outside it.
    engine = {k: after[k] - before[k] for k in ("steps", "time_model", "time_sample", "time_plan")}
    # The nodes have exited: the largest child's peak is the worker's.
    return {"wall": wall, "output_tokens": sum(len(r["token_ids"]) for r in results), "steps": engine["steps"],
            "engine_s": engine["time_model"] + engine["time_sample"] + engine["time_plan"],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def run_transformers(args, work) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).eval()
    model.generation_config.eos_token_id = None
    t = time.perf_counter()
    produced = 0
    for b in range(0, len(work.prompts), 32):
        batch = work.prompts[b : b + 32]
        lens = work.output_lens[b : b + 32]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=max(lens), do_sample=False, pad_token_id=0)
        produced += sum(lens)  # the static batch runs to its longest; only asked-for tokens count
    return {"wall": time.perf_counter() - t, "output_tokens": produced}


def vllm_cpu_env(kv_cache_gib: int | None = 4) -> None:
    """vLLM's CPU recipe, before vllm is imported: a `kv_cache_gib` KV cache (None: vLLM's
    own default, sized from the machine's memory) and its OpenMP threads bound to every
    core (unless the caller set either)."""
    if kv_cache_gib is not None:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{os.cpu_count() - 1}")


def run_vllm(args, work) -> dict:
    vllm_cpu_env()
    from vllm import LLM, SamplingParams, TokensPrompt

    llm = LLM(args.model, skip_tokenizer_init=True, dtype=args.dtype)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in work.output_lens]
    t = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in work.prompts], params)
    res = {"wall": time.perf_counter() - t, "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs)}
    # vLLM runs its engine (weights, KV cache) in a child process: shut down and reaped,
    # its peak counts under RUSAGE_CHILDREN. Both live at once, so the two peaks add.
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    res["peak_rss_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                          + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    return res


RUNNERS = {"shoal": run_shoal, "shoal-cluster": run_shoal_cluster, "transformers": run_transformers, "vllm": run_vllm}


def child(args) -> None:
    work = w1(sequences=args.sequences)
    res = RUNNERS[args.child](args, work)
    res.setdefault("peak_rss_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    print("RESULT " + json.dumps(res))


def vllm_installed(python: str) -> bool:
    """Whether `python` (this interpreter, or the one of vLLM's own venv) imports vllm."""
    done = subprocess.run([python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
                          capture_output=True)
    return done.returncode == 0


def run_system(args, name: str, work, model_params: int, ceiling: float, floor: dict, profile: bool) -> dict | None:
    """One run of `name` in a fresh process; prints its lines and returns its figures."""
    total_tokens = work.prompt_tokens + work.output_tokens
    cmd = [args.vllm_python if name == "vllm" else sys.executable, __file__, "--child", name, "--model", args.model, "--dtype", args.dtype,
           "--sequences", str(args.sequences), "--threads", str(args.threads), "--policy", args.policy]
    cmd += ["--budget", str(args.budget)] if args.budget else []
    cmd += [] if name == "vllm" else ["--kv-cache-dtype", args.kv_cache_dtype]
    cmd += [] if profile else ["--no-profile"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        print(f"{name}: failed\n{proc.stderr[-2000:]}")
        return None
    r = json.loads(line[7:])
    r["output_tok_s"] = r["output_tokens"] / r["wall"]
    r["total_tok_s"] = (work.prompt_tokens + r["output_tokens"]) / r["wall"]
    r["flops_share"] = 2 * model_params * total_tokens / r["wall"] / (ceiling * 1e9)
    r["floor_share"] = floor["floor_s"] / r["wall"]
    print(f"{name:>12}: {r['wall']:7.1f} s  {r['output_tok_s']:7.0f} output tok/s  {r['total_tok_s']:7.0f} total tok/s  "
          f"peak RSS {r['peak_rss_mb']:.0f} MB  model FLOP/s {100 * r['flops_share']:.0f}% of matmul ceiling, "
          f"{100 * r['floor_share']:.0f}% of the roofline", flush=True)
    if name == "shoal-cluster":
        print(f"{'':>12}  steps {r['steps']}; worker engine {r['engine_s']:.1f} s, outside the engine "
              f"{r['wall'] - r['engine_s']:.1f} s (submit, placement, results, the other nodes)")
    if name == "shoal":
        b = r["breakdown"]
        other = r["wall"] - sum(b.values())
        print(f"{'':>12}  steps {r['steps']}; plan {b['plan']:.1f} s, model {b['model']:.1f} s, "
              f"sample {b['sample']:.1f} s, other {other:.1f} s; preemptions {r['preemptions']}")
        print(f"{'':>12}  budget {r['budget']} tokens/step ({r['budget_reason']}); attention {r['attention']}; "
              f"{r['packed_linears']} packed linears" + ("; rows padded to a few sizes" if r.get("pad_rows") else "")
              + (f"; policy fell back to MB: {r['policy_fallback']}" if r["policy_fallback"] else ""))
        if "step_profile" in r:
            from step_profile import format_breakdown

            print(f"{'':>12}  step anatomy: {format_breakdown(r['step_profile'])}")
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".bench/model-small", help="made with --preset small if absent")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                    help="Shoal's KV cache dtype; auto resolves as the worker does for the --dtype asked")
    ap.add_argument("--vllm-python", default=sys.executable,
                    help="the interpreter of a venv with vLLM's CPU build (it needs its own torch build)")
    ap.add_argument("--sequences", type=int, default=128)
    ap.add_argument("--budget", type=int, default=None,
                    help="Shoal's max tokens per step (default: the engine's own, from its device calibration)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--policy", default="ebplus", choices=["mb", "eb", "ebplus"], help="Shoal's step planner")
    ap.add_argument("--peers", default="shoal-cluster,transformers,vllm",
                    help="systems to run beside Shoal in-process (shoal-cluster: the same job through a local cluster)")
    ap.add_argument("--isa", choices=["native", "avx2"], default="native",
                    help="avx2: run every system as on an AVX2-only CPU (see the docstring)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run every system this many times, in alternating order; report median per-round ratios")
    ap.add_argument("--json")
    ap.add_argument("--child", choices=list(RUNNERS), help=argparse.SUPPRESS)
    ap.add_argument("--no-profile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    if args.isa == "avx2":  # before torch loads, here and in every child (they inherit it)
        os.environ.update(AVX2_ENV)
    if not Path(args.model, "config.json").exists():
        from shoal.nodes.worker.models.make_model import make_model

        make_model(args.model, preset="small", dtype="bfloat16")
    from shoal.nodes.worker.dtype_choice import choose_dtype, choose_kv_cache_dtype, cpu_flags

    flags = {f for f in cpu_flags() if not f.startswith(("avx512", "amx"))} if args.isa == "avx2" else None
    choice = choose_dtype(args.dtype, args.model, flags=flags)
    kv_choice = choose_kv_cache_dtype(args.kv_cache_dtype, args.dtype, choice, args.model)
    if args.dtype == "auto":
        print(f"dtype auto: {choice.name} ({choice.reason})")
    print(f"Shoal's KV cache: {kv_choice.name} ({kv_choice.reason})")
    args.dtype, args.kv_cache_dtype = choice.name, kv_choice.name
    work = w1(sequences=args.sequences)
    total_tokens = work.prompt_tokens + work.output_tokens
    from shoal.nodes.worker.models.config import load_decoder_config

    cfg = load_decoder_config(args.model)
    params = (cfg.vocab_size * cfg.hidden_size + cfg.num_layers * (
        cfg.hidden_size * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * cfg.hidden_size
        + 3 * cfg.hidden_size * cfg.intermediate_size))
    rates = matmul_gflops(args.dtype, args.threads)
    ceiling = max(rates.values())
    print(f"CPU: {cpu_summary()}")
    print(f"W1: {args.sequences} sequences, {work.prompt_tokens} prompt + {work.output_tokens} output tokens, "
          f"{args.dtype}, {args.threads} threads; model {params / 1e6:.0f}M parameters; Shoal policy {args.policy}, "
          f"budget {args.budget or 'auto'} tokens/step")
    print(f"matmul ceiling ({args.dtype}, 1024x768x4096, measured now): {ceiling:.0f} GFLOP/s ("
          + ", ".join(f"{k} {v:.0f}" for k, v in rates.items()) + ")")
    read_gbps = memory_read_gbps(args.threads)
    # Of a cache in Shoal's KV dtype (an fp32 one reads twice the bytes, a floor this far higher).
    cache_bytes = decode_cache_bytes([len(p) for p in work.prompts], work.output_lens, cfg.num_layers, cfg.kv_size,
                                     2 if args.kv_cache_dtype == "bfloat16" else 4)
    floor = floor_seconds(2 * params * total_tokens, ceiling, cache_bytes, read_gbps)
    print(f"roofline floor: {floor['floor_s']:.1f} s = matmuls at the ceiling {floor['matmul_s']:.1f} s + decode KV "
          f"reads ({cache_bytes / 1e9:.0f} GB in {args.kv_cache_dtype} at {read_gbps:.1f} GB/s, measured now) {floor['cache_s']:.1f} s; "
          f"no engine with a {args.kv_cache_dtype} cache can pass {100 * floor['max_matmul_share']:.0f}% of the ceiling "
          "on W1 here")
    has_vllm = "vllm" in args.peers and vllm_installed(args.vllm_python)
    systems = ["shoal"] + [p for p in args.peers.split(",") if p and (p != "vllm" or has_vllm)]
    if "vllm" in args.peers and not has_vllm:
        print(f"vllm: not importable by {args.vllm_python}, skipped (see --vllm-python)")
    rounds = run_rounds(systems, args.rounds, lambda name, rnd: run_system(
        args, name, work, params, ceiling, floor, profile=rnd == 0))
    results = rounds[0]
    for ours in ("shoal", "shoal-cluster"):
        for peer in ("vllm", "transformers"):
            ratio = per_round(rounds, ours, peer, lambda a, b: a["total_tok_s"] / b["total_tok_s"])
            if ratio:
                print(f"ratio {ours}/{peer}: {format_ratio(ratio, 'x')} total tok/s")
    extra = per_round(rounds, "shoal-cluster", "shoal", lambda a, b: a["wall"] / b["wall"] - 1)
    engine = per_round(rounds, "shoal-cluster", "shoal",
                       lambda a, b: a["engine_s"] / sum(b["breakdown"].values()) - 1)
    if extra:
        print(f"local cluster vs in-process: {format_ratio(extra, '%')} wall time, {format_ratio(engine, '%')} engine "
              f"time (every run cold, in its own process; one round's ratio moves with the machine's drift)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "cpu": cpu_summary(), "ceiling_gflops": rates, "read_gbps": read_gbps,
                                          "roofline": floor, "results": results, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
