"""One prepared check of Shoal on a GPU: correctness against transformers on the same
GPU, seeded sampling against the CPU engine, W1-GPU in-process and through a local
cluster, W2-GPU short form, the calibration it fitted and the attention backend that
ran. Prints one line per figure and writes every figure to one JSON file (after each
section, so a run cut short keeps what it measured). docs/gpu.md says how to carry the
wheels a bare GPU machine lacks and the one command that runs this.

    python scripts/gpu_check.py                    # on a GPU host: the whole check (~6 min on an H100)
    python scripts/gpu_check.py --only w1,w2       # some sections
    python scripts/gpu_check.py                    # without CUDA: a dry run at tiny shapes on the CPU

Sections: env, limits (the device-to-device copy rate and a large bf16 matmul's rate,
measured in the same run), greedy_fp32 / greedy_bf16 (Shoal's tokens against
transformers' `generate` on the same GPU and weights, by the shared comparator; fp32
with TF32 off), sampling (seeded top-p sampling on the GPU against the CPU engine, by
the comparator's draw rule), w1 (W1-GPU in-process: the `qwen3-1.7b` preset in bf16,
1,024 sequences, prompts and outputs in [128, 256], greedy, EOS ignored; total tokens/s,
decode steps' bytes read per second against the copy rate, prefill's FLOP/s against the
matmul rate, the calibration), profile (torch's profiler over a decode burst and a
prefill burst on the w1 engine: the top kernels and the device's busy share), transformers (the same work with `generate`, bf16, SDPA,
static batches of 64 with left padding, on the first `--hf-sequences`), w1_cluster (the
same job through a local cluster on the same GPU), w2 (MiniLM- and bge-base-shaped
encoders against sentence-transformers in fp16) and structured (W1 prompts constrained
by a JSON schema against the same work unconstrained, outputs checked).

Without CUDA every section runs at tiny shapes on the CPU, to show the script works:
its figures mean nothing. The exit code is 1 only when a section failed (a wrong token,
an exception), never for a section skipped for lack of a package or a device.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import importlib.util
import json
import os
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
# Every model is a local folder; a lent machine has no network, so a stray hub lookup
# fails at once rather than waiting out its timeout.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from workloads import (GenerationWork, job_items, vocabulary_words, w1, w2_partition_sizes, w2_texts,  # noqa: E402
                       write_w2_corpus)

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
# Async scheduling: the engine's default on a GPU; forced in the dry run, so that the CPU
# runs the path the GPU sections will take (on a CPU it is off by default).
ASYNC = None if GPU else True


def sync() -> None:
    if GPU:
        torch.cuda.synchronize()


def release() -> None:
    """Gives back what a finished section held on the device: the next section (a cluster's
    worker above all, another process) sizes its KV cache from the memory left free."""
    import gc

    gc.collect()  # engines hold reference cycles (the step log wraps their methods)
    if GPU:
        torch.cuda.empty_cache()


def timed(fn, repeats: int) -> float:
    """Seconds per call, after one warm-up call."""
    fn()
    sync()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - t) / repeats


# -- sections -----------------------------------------------------------------------------


def env(args) -> dict:
    import platform

    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name(0) if GPU else "cpu (dry run)", "cpu_cores": os.cpu_count(),
           "dry_run": not GPU}
    for mod in ("triton", "transformers", "sentence_transformers", "numpy", "zmq", "orjson", "etcd3", "uvloop",
                "llguidance", "flashinfer"):
        spec = importlib.util.find_spec(mod)
        out[mod] = getattr(__import__(mod), "__version__", "present") if spec else None
    import shutil
    import sysconfig

    for mod in ("google.protobuf", "grpc"):  # what etcd3 runs on
        found = importlib.util.find_spec(mod.split(".")[0]) and importlib.util.find_spec(mod)
        out[mod.split(".")[-1]] = getattr(importlib.import_module(mod), "__version__", "present") if found else None
    # Triton builds its launcher with the C compiler against Python's headers on first use.
    out["cc"] = shutil.which("cc") or shutil.which("gcc")
    out["python_h"] = (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()
    return out


def limits(args) -> dict:
    """The physical limits the figures are held against, measured in this run."""
    n = (1 << 31) if GPU else (1 << 26)
    src = torch.empty(n, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src), 10)
    m = 8192 if GPU else 1024
    a = torch.randn(m, m, dtype=torch.bfloat16, device=DEVICE)
    b = torch.randn(m, m, dtype=torch.bfloat16, device=DEVICE)
    mm_s = timed(lambda: a @ b, 10)
    return {"copy_bytes_per_s": 2 * n / copy_s, "matmul_flops": 2 * m**3 / mm_s,
            "line": f"copy {2 * n / copy_s / 1e12:.2f} TB/s (read + written), bf16 matmul {2 * m**3 / mm_s / 1e12:.0f} TFLOP/s"}


def measured_limits(found: dict, args) -> dict:
    """This run's limits section, or measured now where it did not run or failed."""
    got = found.get("limits") or {}
    if "copy_bytes_per_s" in got:
        return got
    try:
        return limits(args)
    except Exception:  # W1 runs all the same, without the shares of the limits
        return {}


def small_model(args, dtype: str) -> str:
    from shoal.nodes.worker.models.make_model import make_model

    path = Path(args.work) / f"small-{dtype}"
    if not (path / "config.json").exists():
        make_model(path, preset="small" if GPU else "tiny", dtype=dtype, tokenizer_text_chars=200_000)
    return str(path)


def greedy(args, dtype: str) -> dict:
    """Shoal's greedy tokens on the device against transformers' on the same device."""
    from transformers import AutoModelForCausalLM

    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.output_compare import BF16_TOL, FP32_TOL, compare_outputs
    from shoal.sampling import SamplingParams

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = small_model(args, dtype)
    vocab = json.loads(Path(model, "config.json").read_text())["vocab_size"]
    work = w1(vocab, 8, seed=1)
    prompts = [p[: 16 + 23 * i] for i, p in enumerate(work.prompts)]
    eng = LLMEngine(model, EngineConfig(device=DEVICE, dtype=dtype, policy="mb", max_num_batched_tokens=2048,
                                        async_scheduling=ASYNC))
    outs = eng.generate(prompts, SamplingParams(max_tokens=32, ignore_eos=True, return_margins=True))
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    hf = hf.to(DEVICE).eval()
    hf.generation_config.eos_token_id = None
    tol = BF16_TOL if dtype == "bfloat16" else FP32_TOL
    verdicts = []
    for p, o in zip(prompts, outs):
        ids = torch.tensor([p], device=DEVICE)
        with torch.inference_mode():
            ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                              pad_token_id=0)[0, len(p):].tolist()
        verdicts.append(compare_outputs(o.token_ids, ref, [o.margins], tol=tol))
    same = sum(bool(v) for v in verdicts)
    identical = sum(v.diverged_at is None for v in verdicts)
    bad = [v.detail for v in verdicts if not v]
    return {"ok": not bad, "sequences": len(verdicts), "same": same, "identical": identical, "failures": bad,
            "attention": eng.runner.ops.name if eng.runner.ops else "sdpa", "graphs": eng.setup.graphs_reason,
            "line": f"{same}/{len(verdicts)} the same output as transformers ({identical} identical), "
                    f"attention {eng.runner.ops.name if eng.runner.ops else 'sdpa'}, dtype {dtype}"}


def sampling(args) -> dict:
    """Seeded top-p sampling: the device engine's draws against the CPU engine's."""
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.output_compare import compare_outputs
    from shoal.sampling import SamplingParams

    model = small_model(args, "float32")
    vocab = json.loads(Path(model, "config.json").read_text())["vocab_size"]
    prompts = [p[:40] for p in w1(vocab, 8, seed=2).prompts]
    params = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.95, seed=7, ignore_eos=True, return_margins=True)
    runs = {}
    # (the device's steps with async scheduling, the CPU's in order)
    for side, device, attention, overlap in (("device", DEVICE, "auto", ASYNC), ("cpu", "cpu", "sdpa", False)):
        eng = LLMEngine(model, EngineConfig(device=device, dtype="float32", attention=attention, policy="mb",
                                            async_scheduling=overlap))
        runs[side] = eng.generate(prompts, params)
    verdicts = [compare_outputs(a.token_ids, b.token_ids, [a.margins, b.margins], draws=[a.draws, b.draws])
                for a, b in zip(runs["device"], runs["cpu"])]
    bad = [v.detail for v in verdicts if not v]
    same = sum(bool(v) for v in verdicts)
    return {"ok": not bad, "sequences": len(verdicts), "same": same, "failures": bad,
            "identical": sum(v.diverged_at is None for v in verdicts),
            "line": f"{same}/{len(verdicts)} sampled sequences the same output on {DEVICE} and the CPU"}


def big_model(args) -> str:
    from shoal.nodes.worker.models.make_model import make_model

    preset = "qwen3-1.7b" if GPU else "tiny"
    path = Path(args.work) / preset
    if not (path / "config.json").exists():
        t = time.perf_counter()
        make_model(path, preset=preset, dtype="bfloat16", tokenizer_text_chars=200_000)
        print(f"  made {path} in {time.perf_counter() - t:.0f} s", flush=True)
    return str(path)


def w1_work(args, model: str) -> GenerationWork:
    vocab = json.loads(Path(model, "config.json").read_text())["vocab_size"]
    work = w1(vocab, args.sequences if GPU else 16)
    if not GPU:  # the dry run: short outputs
        work = GenerationWork(work.prompts, [8] * len(work.prompts))
    return work


class StepLog:
    """Each step's wall time and what it ran, from the engine's own step, which ends by
    reading sampled tokens back, so its wall time is the device's. In order, a step reads
    its own tokens; with async scheduling it launches itself and then reads the last
    step's, so its wall time is the last step's device time (host time hidden) and is
    paired with the last step's work. A step that read the last one's tokens before it
    ran (a row needed them) timed both, and is left out."""

    def __init__(self, eng):
        # wall, prefill rows, their attention span, decodes, decode ctx, rows sampled (the lm_head's)
        self.steps: list[tuple[float, int, int, int, int, int]] = []
        self.eng, self.originals = eng, (eng.runner.run, eng.step)
        run, step = self.originals
        self.last = None  # the last step's work

        def logged_run(chunks, mask, carry=None):
            pre = sum(n for _, n in chunks if n > 1)
            span = sum(n * (s.num_computed + (n + 1) / 2) for s, n in chunks if n > 1)
            dec = sum(1 for _, n in chunks if n == 1)
            ctx = sum(s.num_computed + 1 for s, n in chunks if n == 1)
            self.current = (pre, int(span), dec, ctx, sum(mask))
            return run(chunks, mask, carry)

        def logged_step():
            self.current = None
            ahead, in_flight = eng.stats.steps_ahead, eng._in_flight is not None
            t = time.perf_counter()
            out = step()
            wall = time.perf_counter() - t
            if eng.stats.steps_ahead > ahead:
                if self.last is not None:
                    self.steps.append((wall, *self.last))
            elif self.current is not None and not in_flight and eng._in_flight is None:
                self.steps.append((wall, *self.current))  # in order: it read its own tokens
            self.last = self.current
            return out

        eng.runner.run, eng.step = logged_run, logged_step

    def remove(self) -> None:
        """The engine's own methods back (the profile section measures it next)."""
        self.eng.runner.run, self.eng.step = self.originals


def w1_inprocess(args, limits_found: dict) -> dict:
    """W1-GPU on the default backend (Triton, decode graphs); where that fails, once more
    on the torch backend, eager, so that the run still measures something, and says so."""
    try:
        return w1_run(args, limits_found, "auto", False)
    except EngineFailed as e:
        if not GPU:
            raise
        failure = str(e)  # not `e` itself: its traceback holds the failed engine's memory
    release()
    out = w1_run(args, limits_found, "torch", True)
    out["default_backend_failed"] = failure
    out["line"] += f" [torch backend, eager: the default failed with {failure[:200]}]"
    return out


class EngineFailed(Exception):
    """The engine failed to start or to run W1 (not the figures computed after)."""


def w1_run(args, limits_found: dict, attention: str, eager: bool) -> dict:
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.nodes.worker.kv_cache import bytes_per_token
    from shoal.sampling import SamplingParams

    model = big_model(args)
    work = w1_work(args, model)
    t = time.perf_counter()
    try:
        # (The dry run on a CPU takes the GPU's async scheduling too, to run its code.)
        eng = LLMEngine(model, EngineConfig(device=DEVICE, policy=args.policy, attention=attention, enforce_eager=eager,
                                            async_scheduling=ASYNC))
        start_s = time.perf_counter() - t
        log = StepLog(eng)
        params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in work.output_lens]
        t = time.perf_counter()
        outs = eng.generate(work.prompts, params)
        wall = time.perf_counter() - t
    except Exception as e:
        raise EngineFailed(f"{type(e).__name__}: {e}") from e
    log.remove()
    tokens = work.prompt_tokens + sum(len(o.token_ids) for o in outs)
    cfg = eng.model_cfg
    weights = sum(p.numel() * p.element_size() for p in eng.model.parameters())
    # Every token goes through the layers' matmuls; only the sampled rows through the lm_head.
    layer_params = sum(p.numel() for n, p in eng.model.named_parameters() if "embed" not in n and "lm_head" not in n)
    head_params = cfg.vocab_size * cfg.hidden_size
    kv_token = bytes_per_token(cfg, eng.cache.layers[0].dtype)
    decode = [(w, weights + ctx * kv_token) for w, pre, _, dec, ctx, _ in log.steps if pre == 0 and dec >= 128]
    prefill = [(w, 2 * layer_params * pre + 2 * head_params * rows
                + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * span)
               for w, pre, span, dec, _, rows in log.steps if dec == 0 and pre > 0]
    out = {"wall": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "engine_start_s": start_s,
           "steps": eng.stats.steps, "attention": eng.runner.ops.name if eng.runner.ops else "sdpa",
           "attention_reason": eng.setup.ops_reason, "graphs": eng.setup.graphs_reason, "kv_cache": eng.kv_cache_reason,
           "kv_cache_gib": eng.cache.nbytes / 2**30, "budget": eng.config.max_num_batched_tokens,
           "budget_reason": eng.budget_reason, "policy": args.policy, "policy_fallback": eng.policy_fallback,
           "calibration": eng.cost_model.to_dict() if eng.cost_model else None,
           "time_model": eng.stats.time_model, "time_sample": eng.stats.time_sample, "time_plan": eng.stats.time_plan,
           "preemptions": eng.stats.preemptions, "decode_steps_128": len(decode), "prefill_steps": len(prefill)}
    if decode:
        rates = [b / w for w, b in decode]
        out["decode_bytes_per_s_median"] = statistics.median(rates)
        if limits_found.get("copy_bytes_per_s"):
            out["decode_share_of_copy_rate"] = statistics.median(rates) / limits_found["copy_bytes_per_s"]
    if prefill:
        out["prefill_flops_median"] = statistics.median(f / w for w, f in prefill)
        if limits_found.get("matmul_flops"):
            out["prefill_share_of_matmul"] = out["prefill_flops_median"] / limits_found["matmul_flops"]
    if PROFILED["wanted"]:
        PROFILED["engine"] = eng  # the profile section looks inside this engine's steps
    out["line"] = (f"{out['tokens_per_s']:,.0f} total tokens/s ({wall:.1f} s, {out['steps']} steps, attention "
                   f"{out['attention']}); decode >=128 rows at {100 * out.get('decode_share_of_copy_rate', 0):.0f}% "
                   f"of the copy rate, prefill at {100 * out.get('prefill_share_of_matmul', 0):.0f}% of the matmul rate")
    return out


# The w1 section's engine, kept for the profile section when it runs next (then released).
PROFILED: dict = {"wanted": False}


def profile(args) -> dict:
    """Where a step's time goes, for the session that tunes what the w1 figures show:
    torch's profiler over a decode-heavy burst (256 sequences of 16 prompt tokens, 48
    tokens each: one prefill step, then decode) and a prefill-only burst (64 prompts of
    256 tokens, one token each), on the w1 engine (decode graphs and all). Per burst: the
    kernels that took the most device time, and the device's busy share of the burst's
    wall time (kernel time summed; far below 1 says the host is in the way)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from shoal.sampling import SamplingParams

    eng = PROFILED.pop("engine", None)
    if eng is None:  # run on its own: an engine of its own
        from shoal.nodes.worker.engine import EngineConfig, LLMEngine

        eng = LLMEngine(big_model(args), EngineConfig(device=DEVICE, policy=args.policy))
    vocab = eng.model_cfg.vocab_size
    gen = torch.Generator().manual_seed(5)
    n_dec, n_pre = (256, 64) if GPU else (16, 4)
    bursts = {"decode": ([torch.randint(10, vocab, (16,), generator=gen).tolist() for _ in range(n_dec)],
                         48 if GPU else 6),
              "prefill": ([torch.randint(10, vocab, (256 if GPU else 32,), generator=gen).tolist()
                           for _ in range(n_pre)], 1)}
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if GPU else [])
    out: dict = {"attention": eng.runner.ops.name if eng.runner.ops else "sdpa", "graphs": eng.setup.graphs_reason}
    lines = []
    for name, (prompts, n) in bursts.items():
        params = SamplingParams(max_tokens=n, ignore_eos=True)
        eng.generate(prompts[:4], params)  # warm
        # Timed without the profiler (its tracing of the host slows the host down), then profiled.
        # Once with each step's tokens read before the next is planned, once as the
        # engine runs (async scheduling on a GPU): what overlapping host and device gains.
        overlap = eng.async_scheduling
        eng.async_scheduling = False
        sync()
        steps0, t = eng.stats.steps, time.perf_counter()
        eng.generate(prompts, params)
        sync()
        in_order = (time.perf_counter() - t) / max(1, eng.stats.steps - steps0)
        eng.async_scheduling = overlap
        sync()
        steps0, t = eng.stats.steps, time.perf_counter()
        eng.generate(prompts, params)
        sync()
        wall, steps = time.perf_counter() - t, eng.stats.steps - steps0
        with torch_profile(activities=activities) as prof:
            eng.generate(prompts, params)
            sync()
        rows = profile_rows(prof, GPU)
        # Kernels and copies summed over every stream: above 1 where copies overlap compute.
        busy = sum(r["ms"] for r in rows) / 1e3 if GPU else None
        out[name] = {"wall_s": wall, "steps": steps, "ms_per_step": 1e3 * wall / max(1, steps),
                     "ms_per_step_in_order": 1e3 * in_order, "async_scheduling": overlap,
                     "device_busy_share": busy / wall if busy is not None else None, "top": rows[:15]}
        lines.append(f"{name} {1e3 * wall / max(1, steps):.1f} ms/step ({1e3 * in_order:.1f} in order)"
                     + (f", device busy {100 * busy / wall:.0f}%" if busy is not None else "")
                     + (f", top {rows[0]['name'][:40]} {rows[0]['share']:.0%}" if rows else ""))
    out["line"] = "; ".join(lines)
    return out


def profile_rows(prof, device_kernels: bool) -> list[dict]:
    """The profiler's operators (device kernels on a GPU, host operators on a CPU) by the
    time they took themselves, most first, each with its share of the total."""
    stats = []
    for ev in prof.key_averages():
        if device_kernels:
            # Device-side kernels only (not the host operators that launched them).
            if str(getattr(ev, "device_type", "")).split(".")[-1] != "CUDA":
                continue
            us = getattr(ev, "self_device_time_total", None)
            us = getattr(ev, "self_cuda_time_total", 0) if us is None else us
        else:
            us = ev.self_cpu_time_total
        if us > 0:
            stats.append((us, ev.key, ev.count))
    total = sum(us for us, _, _ in stats) or 1
    return [{"name": k, "ms": us / 1e3, "calls": c, "share": us / total}
            for us, k, c in sorted(stats, reverse=True)]


def transformers_w1(args) -> dict:
    from transformers import AutoModelForCausalLM

    model_dir = big_model(args)
    work = w1_work(args, model_dir)
    n = min(args.hf_sequences if GPU else 8, len(work.prompts))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa")
    model = model.to(DEVICE).eval()
    model.generation_config.eos_token_id = None
    t = time.perf_counter()
    tokens = 0
    for b in range(0, n, 64):
        batch, lens = work.prompts[b:min(n, b + 64)], work.output_lens[b:min(n, b + 64)]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=DEVICE)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=DEVICE)
        with torch.inference_mode():
            model.generate(ids, attention_mask=mask, max_new_tokens=max(lens), do_sample=False, pad_token_id=0)
        tokens += sum(map(len, batch)) + sum(lens)  # a static batch runs to its longest; asked-for tokens count
    sync()
    wall = time.perf_counter() - t
    return {"sequences": n, "wall": wall, "tokens_per_s": tokens / wall,
            "line": f"{tokens / wall:,.0f} total tokens/s over the first {n} sequences"}


def log_tails(folder: Path, lines: int = 30) -> str:
    """The last lines of each node's log in `folder`."""
    out = []
    for log in sorted(folder.glob("*.log")) if folder.is_dir() else []:
        out.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
    return "\n".join(out) or f"(no logs in {folder})"


def w1_cluster(args, inprocess: dict | None) -> dict:
    import shoal

    model = big_model(args)
    work = w1_work(args, model)
    # Every wait bounded (a node that dies must not take the command's whole ten minutes),
    # and the nodes' logs kept in --work, their tails in the figures when it fails.
    cluster = shoal.LocalCluster(model, workers=1, device=DEVICE, policy=args.policy,
                                 state_dir=Path(args.work) / f"cluster-w1-{int(time.time())}")
    try:
        cluster.start(timeout=240, node_timeout=300)  # a worker hung while loading is killed
        client = shoal.Client(cluster.router)
        prediction = predicted_job(client, job_items(work), model)
        t = time.perf_counter()
        results = client.submit(job_items(work), params={"ignore_eos": True}).wait(timeout=300)
        wall = time.perf_counter() - t
        client.close()
        steps = failed_steps(cluster)
    except Exception as e:
        raise RuntimeError(f"{type(e).__name__}: {e}\n{log_tails(cluster.dir / 'logs')}") from e
    finally:
        cluster.stop()
    failed = [r for r in results if r.get("error")]
    tokens = work.prompt_tokens + sum(len(r["token_ids"]) for r in results)
    # A figure taken while steps failed (out of memory: capped) is not the engine's.
    out = {"ok": not failed and not steps.get("failed_steps"), "wall": wall, "tokens_per_s": tokens / wall,
           "failed": len(failed), **steps}
    if inprocess and inprocess.get("wall"):  # (not a failed first half's error)
        out["cluster_over_inprocess"] = wall / inprocess["wall"]
    if isinstance(prediction, str):
        out["prediction"] = prediction
    else:  # the simulator with the worker's own calibration (`shoal generate --dry-run`'s figure)
        out["predicted_s"], out["prediction_error"] = prediction, prediction / wall - 1
    out["line"] = (f"{tokens / wall:,.0f} total tokens/s ({wall:.1f} s)"
                   + (f", {100 * (out['cluster_over_inprocess'] - 1):+.1f}% over in-process"
                      if "cluster_over_inprocess" in out else "")
                   + (f"; predicted {prediction:.1f} s ({100 * out['prediction_error']:+.0f}%)"
                      if not isinstance(prediction, str) else f"; no prediction: {prediction}")
                   + (f"; {steps['failed_steps']} failed steps, capped at {steps['step_cap']} sequences"
                      if steps.get("failed_steps") else ""))
    return out


def failed_steps(cluster) -> dict:
    """The worker's failed steps and the cap they left (`step_failures.py`), or why
    they could not be asked."""
    from shoal.transport.rpc import RpcClient

    rpc = RpcClient(cluster.nodes["worker-0"][2])
    try:
        stats = rpc.request("StatsQuery", timeout=10)["stats"]
    except Exception as e:  # (the figures stand without it)
        return {"failed_steps_unknown": f"{type(e).__name__}: {e}"}
    finally:
        rpc.close()
    return {"failed_steps": stats.get("counters", {}).get("errors.step", 0),
            "step_cap": stats.get("engine", {}).get("step_cap")}


def predicted_job(client, items: list[dict], model: str) -> float | str:
    """The job's seconds as `shoal generate --dry-run` predicts them from the cluster's
    calibrated workers, or why there is no prediction."""
    from shoal.cli.generate_plan import predict_items
    from shoal.request_settings import GenerationSettings

    try:
        return predict_items(client, items, GenerationSettings.from_wire({"ignore_eos": True}), model).seconds
    except Exception as e:  # the job runs all the same
        return f"{type(e).__name__}: {e}"


ENCODER_SHAPES = {"minilm": dict(hidden=384, layers=6, heads=12, intermediate=1536),
                  "bge-base": dict(hidden=768, layers=12, heads=12, intermediate=3072)}


def encoder_folder(args, name: str) -> Path:
    """A random-weight encoder of `name`'s shape in --work, made once (a WordPiece
    tokenizer trained here, shared by the shapes: nothing to carry)."""
    from shoal.nodes.worker.models.make_encoder import make_encoder

    folder = Path(args.work) / f"encoder-{name}"
    if not (folder / "config.json").exists():
        first = Path(args.work) / "encoder-minilm"
        make_encoder(folder, first if (first / "config.json").exists() else None, max_seq_length=256,
                     **ENCODER_SHAPES[name])
    return folder


def w2(args) -> dict:
    """Two encoder shapes over W2-style texts: Shoal's encoder against
    sentence-transformers, both fp16 on the device (fp32 in the dry run)."""
    from sentence_transformers import SentenceTransformer

    from shoal.nodes.worker.models.encoder import Encoder
    from shoal.scheduler.superbatch import DEFAULT_TOKEN_BUDGET

    texts = None
    dtype = torch.float16 if GPU else torch.float32
    out = {}
    for name in ENCODER_SHAPES:
        folder = encoder_folder(args, name)
        texts = texts or w2_texts(vocabulary_words(str(folder)), args.w2_texts if GPU else 200)
        enc = Encoder(folder, dtype=dtype, device=DEVICE)
        shoal_s = timed(lambda: enc.encode(texts), 1)
        # The CPU's micro-batch budget on the same device: what the GPU's default gains.
        small_s = (shoal_s if enc.token_budget == DEFAULT_TOKEN_BUDGET
                   else timed(lambda: enc.encode(texts, token_budget=DEFAULT_TOKEN_BUDGET), 1))
        mine = enc.encode(texts[:64])
        st = SentenceTransformer(str(folder), device=DEVICE)
        if GPU:
            st = st.half()
        st_s = timed(lambda: st.encode(texts, batch_size=64, convert_to_tensor=True), 1)
        theirs = st.encode(texts[:64], batch_size=64, convert_to_tensor=True).float().cpu()
        cos = torch.nn.functional.cosine_similarity(mine, theirs, dim=-1).min().item()
        out[name] = {"shoal_texts_per_s": len(texts) / shoal_s, "st_texts_per_s": len(texts) / st_s,
                     "ratio": st_s / shoal_s, "min_cosine": cos, "token_budget": enc.token_budget,
                     f"shoal_at_{DEFAULT_TOKEN_BUDGET}_texts_per_s": len(texts) / small_s}
    out["ok"] = all(v["min_cosine"] > 0.99 for v in out.values() if isinstance(v, dict))
    out["line"] = "; ".join(f"{k} {v['shoal_texts_per_s']:,.0f} texts/s, {v['ratio']:.2f}x sentence-transformers "
                            f"(cosine >= {v['min_cosine']:.4f}; micro-batches of {v['token_budget']} tokens, "
                            f"{v[f'shoal_at_{DEFAULT_TOKEN_BUDGET}_texts_per_s']:,.0f} texts/s at {DEFAULT_TOKEN_BUDGET})"
                            for k, v in out.items() if isinstance(v, dict))
    return out


def w2_superbatches(args) -> dict:
    """W2-GPU's second half: SuperBatches (B_min = n_max = 1,024) against a call per
    partition (B_min = 1, no split: the pipeline SURGE replaces) through a local cluster
    whose worker encodes on the GPU, the MiniLM-shaped encoder over log-normal partitions
    (σ 1.72), beside the time the cost model predicted (`shoal embed --dry-run`). The
    per-partition job stops at `--w2-cap` seconds (a call per partition is the slow side):
    its rate is then the texts it embedded by then over that time."""
    import shoal
    from bench_embed import run_job

    from shoal.cli.embed_plan import predict_job
    from shoal.corpus_reader import CorpusSpec
    from shoal.encoder_config import describe_encoder

    encoder = encoder_folder(args, "minilm")
    n, parts = (args.w2_sb_texts, min(args.w2_partitions, args.w2_sb_texts)) if GPU else (300, 100)
    texts = w2_texts(vocabulary_words(str(encoder)), n, seed=0)
    stamp = int(time.time())
    paths = write_w2_corpus(Path(args.work) / f"w2-corpus-{parts}", texts, w2_partition_sizes(n, parts, 1.72, seed=1))
    cluster = shoal.LocalCluster(encoder=str(encoder), workers=1, device=DEVICE,
                                 state_dir=Path(args.work) / f"cluster-w2-{stamp}")
    client = None
    try:
        cluster.start(timeout=240, node_timeout=300)
        client = shoal.Client(cluster.router)
        info = describe_encoder(str(encoder))
        try:
            prediction = predict_job(client, CorpusSpec(tuple(paths)), str(encoder), info, 1024, 1024,
                                     cache_key=f"gpu-check-{stamp}")
        except Exception as e:  # the jobs run all the same
            prediction = f"{type(e).__name__}: {e}"
        encoding: list[float] = []
        sb_wall, first = run_job(client, paths, Path(args.work) / f"w2-sb-{stamp}", str(encoder), 1024, 1024, encoding)
        t = time.perf_counter()
        job = client.embed(paths, str(Path(args.work) / f"w2-pp-{stamp}"), str(encoder), b_min=1, n_max=n,
                           job_key=f"gpu-check-pp-{stamp}")
        while (st := job.status())["state"] == "running" and time.perf_counter() - t < args.w2_cap:
            time.sleep(0.5)
        pp_wall = time.perf_counter() - t
        capped = st["state"] == "running"
        if capped:
            job.cancel()
        if not st["done"]:
            raise RuntimeError(f"the per-partition job embedded nothing in {pp_wall:.0f} s ({st})")
    except Exception as e:
        raise RuntimeError(f"{type(e).__name__}: {e}\n{log_tails(cluster.dir / 'logs')}") from e
    finally:
        if client is not None:
            client.close()
        cluster.stop()
    # An embedding job counts its texts. A cut-off rate holds the corpus's reading, which a
    # whole job pays once, against part of its texts: the gain errs in the SuperBatches' favour.
    sb_rate, pp_rate = n / sb_wall, st["done"] / pp_wall
    out = {"ok": capped or st["state"] == "done", "texts": n, "partitions": parts, "superbatch_texts_per_s": sb_rate,
           "superbatch_encoding_s": encoding[0], "first_output_s": first, "per_partition_texts_per_s": pp_rate,
           "per_partition_capped": capped, "per_partition_texts_done": [st["done"], st["total"]], "gain": sb_rate / pp_rate}
    if isinstance(prediction, str):
        out["prediction"] = prediction
    else:
        out.update(predicted_superbatch_s=prediction.superbatch_s, predicted_gain=prediction.gain,
                   prediction_error=prediction.superbatch_s / encoding[0] - 1, phi=prediction.phi)
    out["line"] = (f"{parts:,} partitions of {n:,} texts: SuperBatches {sb_rate:,.0f} texts/s, a call per partition "
                   f"{pp_rate:,.0f}{' (cut off at ' + str(st['done']) + ' of ' + str(st['total']) + ' texts)' if capped else ''}"
                   f": {out['gain']:.2f}x"
                   + (f"; predicted {prediction.gain:.2f}x, SuperBatch time {100 * out['prediction_error']:+.0f}%"
                      if not isinstance(prediction, str) else f"; no prediction: {prediction}"))
    return out


def structured(args) -> dict:
    """W1 prompts on the `qwen3-1.7b` preset, every request constrained by a JSON schema
    (scripts/bench_structured.py's), against the same requests unconstrained generating
    the constrained run's output lengths, on the device: tokens/s of both, the time steps
    waited for their masks, and every output that stopped parsed and checked."""
    from bench_structured import schema

    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    model = big_model(args)
    vocab = json.loads(Path(model, "config.json").read_text())["vocab_size"]
    work = w1(vocab, min(args.sequences, 256) if GPU else 8)
    cap = 256 if GPU else 24
    eng = LLMEngine(model, EngineConfig(device=DEVICE, prefix_caching=False, policy="mb", async_scheduling=ASYNC))
    constrained = [SamplingParams(max_tokens=min(n, cap), json_schema=schema()) for n in work.output_lens]
    eng.generate(work.prompts[:2], constrained[:2])  # warm: the grammar's tokenizer, graphs

    def run(params):
        wait0 = eng.stats.time_grammar_wait
        t = time.perf_counter()
        outs = eng.generate(work.prompts, params)
        wall = time.perf_counter() - t
        return outs, sum(len(o.token_ids) for o in outs) / wall, eng.stats.time_grammar_wait - wait0

    outs, c_rate, wait = run(constrained)
    lengths = [len(o.token_ids) for o in outs]
    bad = []
    for o in outs:
        if o.finish_reason == "stop":
            try:
                doc = json.loads(o.text)
                assert set(schema()["required"]) <= set(doc)
            except Exception as e:
                bad.append(f"{o.seq_id}: {type(e).__name__} {o.text[:80]!r}")
    _, p_rate, _ = run([SamplingParams(max_tokens=n, ignore_eos=True) for n in lengths])
    _, c_rate2, _ = run(constrained)  # again, after the unconstrained run: the order turned around
    ratio = statistics.mean([c_rate, c_rate2]) / p_rate
    return {"ok": not bad, "failures": bad, "sequences": len(outs), "mean_output": statistics.mean(lengths),
            "stopped": sum(o.finish_reason == "stop" for o in outs), "constrained_tok_s": [c_rate, c_rate2],
            "plain_tok_s": p_rate, "ratio": ratio, "grammar_wait_s": wait, "grammars": eng.grammars.stats(),
            "line": f"JSON schema {ratio:.2f}x the unconstrained tokens/s ({p_rate:,.0f} tok/s plain; "
                    f"{len(outs)} sequences of {statistics.mean(lengths):.0f} tokens on average, "
                    f"{sum(o.finish_reason == 'stop' for o in outs)} ended by the grammar, {len(bad)} of those not JSON "
                    f"with the schema's keys); steps waited {wait:.3f} s for masks"}


# -- the run ------------------------------------------------------------------------------

def streaming(args) -> dict:
    """Weight streaming on the device (`--device-memory`, about half the layers resident): the
    copies on a stream of their own ordered by events (`weight_copies.py`). Greedy tokens
    against the same engine with every weight resident, tokens/s of both, bytes copied
    per generated token and the copy bandwidth the copy stream's events measured."""
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.output_compare import BF16_TOL, compare_outputs
    from shoal.sampling import SamplingParams

    from shoal.nodes.worker.models.make_model import make_model

    model = Path(args.work) / "streamed-bfloat16"  # the small shape (tiny on a dry run) in 8 layers
    if not (model / "config.json").exists():
        make_model(model, preset="small" if GPU else "tiny", dtype="bfloat16", overrides={"num_hidden_layers": 8},
                   tokenizer_text_chars=200_000)
    model = str(model)
    vocab = json.loads(Path(model, "config.json").read_text())["vocab_size"]
    work = w1(vocab, 64 if GPU else 4, seed=3)
    params = SamplingParams(max_tokens=64 if GPU else 8, ignore_eos=True, return_margins=True)
    runs = {}
    for name in ("resident", "streamed"):
        config = EngineConfig(device=DEVICE, dtype="bfloat16", policy="mb", async_scheduling=ASYNC)
        if name == "streamed":
            from shoal.nodes.worker.models.loader import load_decoder
            from shoal.nodes.worker.weight_streamer import nbytes

            probe, _ = load_decoder(model, "bfloat16", "cpu")  # (as loaded: before any repacking)
            layers = [nbytes(layer) for layer in probe.layers]
            fixed = nbytes(probe) - sum(layers)
            del probe
            # What stays resident besides the two slots: about half the layers.
            budget = fixed + 2 * max(layers) + sum(layers) // 2 - 2 * max(layers)
            config = EngineConfig(device=DEVICE, dtype="bfloat16", policy="mb", async_scheduling=ASYNC,
                                  device_memory=max(budget, fixed + 2 * max(layers)))
        eng = LLMEngine(model, config)
        eng.generate(work.prompts[:2], SamplingParams(max_tokens=2, ignore_eos=True))  # warm
        sync()
        streamer = eng.model.streamer
        before = streamer.summary().get("bytes_fetched", 0) if streamer is not None else 0  # start, profile, warm-up
        t = time.perf_counter()
        outs = eng.generate(work.prompts, params)
        sync()
        wall = time.perf_counter() - t
        tokens = sum(len(o.token_ids) for o in outs)
        stats = streamer.summary() if streamer is not None else {}
        if stats:
            stats["bytes_fetched"] = stats.get("bytes_fetched", 0) - before  # this run's only
        runs[name] = {"outs": outs, "tok_s": tokens / wall, "tokens": tokens, "stream": stats}
        del eng
        release()
    verdicts = [compare_outputs(s.token_ids, r.token_ids, [r.margins, s.margins], tol=BF16_TOL)
                for r, s in zip(runs["resident"]["outs"], runs["streamed"]["outs"])]
    bad = [v.detail for v in verdicts if not v]
    st = runs["streamed"]["stream"]
    bw = st.get("fetch_cost", {}).get("bandwidth", 0.0)
    per_token = st.get("bytes_fetched", 0) / max(runs["streamed"]["tokens"], 1)
    ratio = runs["streamed"]["tok_s"] / runs["resident"]["tok_s"]
    return {"ok": not bad and bool(st.get("streamed_layers")), "failures": bad,
            "resident_tok_s": runs["resident"]["tok_s"], "streamed_tok_s": runs["streamed"]["tok_s"],
            "streamed_over_resident": ratio, "bytes_per_token": per_token, "copy_bandwidth": bw,
            "stream": st,
            "line": f"{sum(bool(v) for v in verdicts)}/{len(verdicts)} the same streamed as resident; "
                    f"{st.get('streamed_layers', 0)} layers streamed: {runs['streamed']['tok_s']:.0f} against "
                    f"{runs['resident']['tok_s']:.0f} tok/s resident ({ratio:.2f}x), "
                    f"{per_token / 1e6:.2f} MB copied per token at {bw / 1e9:.1f} GB/s (" + ("copy-stream events" if GPU else "copy thread") + ")"}


def w6(args) -> dict:
    """W6-GPU: a model the device holds only part of. The `qwen3-1.7b` preset and a random
    Qwen3-MoE (64 experts, top 8, hidden 2048, 24 layers, expert width 768), bf16, with
    50% and 25% of the weights resident (`--device-memory`) and all of them, 256
    sequences of 32 tokens, against layer streaming (every layer and expert copied in
    before it runs, fixed batches of 8: accelerate's CPU offload) on the same GPU; the
    baseline runs the first 32 sequences (its batches are independent: its rate is the
    same). `scripts/bench_offload_weights.py`'s runs, on the device."""
    from bench_offload_weights import prompts_for, run

    from shoal.nodes.worker.models.make_model import make_model

    shapes = {"dense": ("qwen3-1.7b", None), "moe": ("moe-small", {
        "num_experts": 64, "num_experts_per_tok": 8, "hidden_size": 2048, "num_hidden_layers": 24,
        "moe_intermediate_size": 768, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128})}
    if not GPU:  # a dry run: tiny shapes in 16 layers (a quarter of them must hold two layer slots)
        shapes = {"dense": ("tiny", {"num_hidden_layers": 16}), "moe": ("moe-tiny", {"num_hidden_layers": 16})}
    n, out = (256, 32) if GPU else (8, 4)
    figures, failures = {}, []
    for name, (preset, overrides) in shapes.items():
        # The dense shape is the other sections' model (the same preset and seed).
        model = Path(big_model(args)) if GPU and name == "dense" else Path(args.work) / f"w6-{name}"
        if not (model / "config.json").exists():
            make_model(model, preset=preset, dtype="bfloat16", overrides=overrides, tokenizer_text_chars=200_000)
        vocab = json.loads(Path(model, "config.json").read_text())["vocab_size"]
        prompts = prompts_for(n, vocab)
        row = {}
        # Each run on its own: one that fails (a first GPU run of a path) leaves the others' figures.
        for fraction in (None, 1.0, 0.5, 0.25):
            key = "layer_streaming" if fraction is None else fraction
            try:
                row[key] = (run(str(model), prompts[: max(8, n // 8)], out, None, 8, 2048, device=DEVICE)
                            if fraction is None else run(str(model), prompts, out, fraction, 8, 2048, device=DEVICE))
            except Exception as e:  # ValueError: the fixed part and two slots are the least a device holds
                row[key] = {"error": f"{type(e).__name__}: {e}"}
                failures.append(f"{name} {'layer streaming' if fraction is None else f'at {fraction:.0%}'}: "
                                f"{type(e).__name__}: {e}")
            release()
        figures[name] = row
    lines = []
    for name, row in figures.items():
        full, base = row[1.0], row["layer_streaming"]
        for fraction in (0.5, 0.25):
            r = row[fraction]
            if "error" in r or "error" in full or "error" in base:
                continue
            r["over_layer_streaming"] = r["tokens_per_s"] / base["tokens_per_s"]
            r["of_resident"] = r["tokens_per_s"] / full["tokens_per_s"]
            lines.append(f"{name} {fraction:.0%} resident: {r['tokens_per_s']:.0f} tok/s, "
                         f"{r['over_layer_streaming']:.1f}x layer streaming, {r['of_resident']:.2f} of resident, "
                         f"{r['bytes_per_token'] / 1e6:.1f} MB/token")
    if GPU:  # what "of resident" holds a streamed run against
        lines.append("(resident dense runs replay decode graphs; streamed and layer-streaming runs are eager)")
    return {"ok": not failures, "failures": failures, "figures": figures, "line": "; ".join(lines)}


def w3(args) -> dict:
    """W3-GPU, the main job where it is meant to run: the `w3` program (IRCoT-shaped
    questions: thoughts, retrievals, an answer) through a local cluster on the GPU, the
    decoder of the `qwen3-1.7b` preset's shape and a MiniLM-shaped encoder on the same
    GPU, against lockstep rounds on Shoal's own engine on the same GPU (the FlashRAG way:
    one batched generate per round, then one encode and one search). Target: 1.5x or
    more. Where each side's time went is in the figures (`scripts/bench_w3.py`'s runs)."""
    from bench_w3 import read_jsonl, run_shoal_cluster, run_shoal_lockstep

    from shoal.examples.w3_data import workload, write_w3

    encoder = encoder_folder(args, "minilm")
    data = Path(args.work) / ("w3" if GPU else "w3-dry")
    n = 256 if GPU else 12
    meta = write_w3(data, encoder, n_passages=3000 if GPU else 300, n_questions=n,
                    preset="qwen3-1.7b" if GPU else "tiny")
    (data / "w3.json").write_text(json.dumps({**meta, "encoder": str(encoder), "dtype": "bfloat16"}, indent=2))
    want = workload(read_jsonl(data / "questions.jsonl")[:n])
    lockstep = run_shoal_lockstep(data, n, None, device=DEVICE)
    release()
    state = Path(args.work) / f"cluster-w3-{int(time.time())}"
    try:  # every wait bounded, the nodes' logs kept and their tails reported (as in w1_cluster)
        cluster = run_shoal_cluster(data, n, None, [], state_dir=state, start_timeout=240, job_timeout=300,
                                    node_timeout=300)
    except Exception as e:
        raise RuntimeError(f"{type(e).__name__}: {e}\n{log_tails(state / 'logs')}") from e
    wrong = [f"{name}: {side[k]} {k}, the questions ask {want[k]}" for name, side in
             (("lockstep", lockstep), ("cluster", cluster)) for k in ("generated_tokens", "retrievals")
             if side[k] != want[k]]
    ratio = lockstep["wall"] / cluster["wall"]
    return {"ok": not wrong, "failures": wrong, "lockstep": lockstep, "cluster": cluster, "ratio": ratio,
            "line": f"{n} questions: the cluster {cluster['wall']:.1f} s, lockstep rounds {lockstep['wall']:.1f} s "
                    f"({lockstep['rounds']} rounds): {ratio:.2f}x (target 1.5x); mean batch "
                    f"{cluster['mean_batch']:.0f} against {lockstep['mean_batch']:.0f}"}


def w4(args) -> dict:
    """W4-GPU: MB, EB and EB+ on the real engine under the distribution shift (prompt,
    output) = (512,64) -> (256,256) -> (64,512) at 128 in flight (the paper's trace at half
    its lengths and concurrency), the `qwen3-1.7b` preset in bf16: each phase's tokens/s
    per policy, EB+ against the better pure mode (target: within 2%), and beside each
    phase the mode the crossover condition predicts from the device's calibration."""
    from bench_policies import predicted_sides, run, trace

    from shoal.nodes.worker.engine import EngineConfig, LLMEngine

    model = big_model(args) if GPU else small_model(args, "bfloat16")
    phases = trace("shift", 2 if GPU else 64, 256 if GPU else 8)
    results, predicted, fallbacks = {}, None, []
    # EB first: it calibrates the device, and MB (which never measures) and EB+ then run
    # at the calibrated step budget too, not MB at the default.
    for policy in ("eb", "mb", "ebplus"):
        eng = LLMEngine(model, EngineConfig(device=DEVICE, dtype="bfloat16", policy=policy, async_scheduling=ASYNC))
        if policy != "mb" and eng.policy_fallback:
            fallbacks.append(f"{policy} fell back to MB: {eng.policy_fallback}")
        if predicted is None and eng.cost_model is not None:
            predicted = predicted_sides(eng.cost_model, phases)
        per, total = run(eng, phases)
        results[policy] = {"phases": [p["tokens"] / p["time"] for p in per], "total_s": total,
                           "modes": [p["modes"] for p in per], "switches": list(getattr(eng.planner, "switches", []))}
        del eng
        release()
    rows, worst = [], 1.0
    for i, (label, _, _) in enumerate(phases):
        tp = {p: results[p]["phases"][i] for p in results}
        ratio = tp["ebplus"] / max(tp["mb"], tp["eb"])
        worst = min(worst, ratio)
        side = next((s for lbl, _, _, s in predicted or [] if lbl == label), "?")
        rows.append(f"{label}: MB {tp['mb']:.0f}, EB {tp['eb']:.0f}, EB+ {tp['ebplus']:.0f} tok/s "
                    f"(EB+/best {ratio:.3f}; measured best {'EB' if tp['eb'] > tp['mb'] else 'MB'}, predicted {side})")
    return {"ok": not fallbacks, "failures": fallbacks, "results": results, "predicted": predicted,
            "worst_ebplus_over_best": worst,
            "line": "; ".join(rows)}


SECTIONS = ("env", "limits", "greedy_fp32", "greedy_bf16", "sampling", "w1", "profile", "transformers", "w1_cluster", "w2",
            "structured", "streaming", "w2_superbatches", "w3", "w4", "w6")
NEEDS = {"w3": ["zmq", "orjson", "etcd3"], "greedy_fp32": ["transformers"], "greedy_bf16": ["transformers"], "transformers": ["transformers"],
         "w1_cluster": ["zmq", "orjson", "etcd3"], "w2": ["sentence_transformers"],
         "w2_superbatches": ["zmq", "orjson", "etcd3"], "structured": ["llguidance"]}


def write_report(report: dict, args) -> None:
    """The JSON file, and its copy in --mirror (what comes back from a device command)."""
    text = json.dumps(report, indent=2, default=str)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    if args.mirror:
        Path(args.mirror).mkdir(parents=True, exist_ok=True)
        (Path(args.mirror) / Path(args.out).name).write_text(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check.json", help="the JSON file of every figure")
    ap.add_argument("--work", default=".gpu-check", help="where the random-weight models are made")
    ap.add_argument("--only", default="", help="comma-separated sections (default: all)")
    ap.add_argument("--sequences", type=int, default=1024, help="W1-GPU's sequences")
    ap.add_argument("--hf-sequences", type=int, default=256, help="the sequences transformers runs (it is slow)")
    ap.add_argument("--w2-texts", type=int, default=20_000, help="texts per encoder in W2's short form")
    ap.add_argument("--w2-sb-texts", type=int, default=20_000, help="texts of w2_superbatches' corpus")
    ap.add_argument("--w2-partitions", type=int, default=10_000, help="partitions of w2_superbatches' corpus")
    ap.add_argument("--w2-cap", type=float, default=150.0,
                    help="seconds w2_superbatches lets the per-partition job run before it is cut off")
    ap.add_argument("--policy", default="ebplus", choices=["mb", "eb", "ebplus"])
    ap.add_argument("--mirror", default="", metavar="DIR",
                    help="also write the JSON file into DIR after each section (a device command's $OUT: "
                         "what finished comes back even when the command is cut off)")
    ap.add_argument("--append", action="store_true",
                    help="keep the sections already in --out and add these (a check run in two halves: the "
                         "cluster section reads the in-process W1 figures of the first)")
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s] or list(SECTIONS)
    unknown = set(only) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")
    # A run cut off by `timeout` (SIGTERM) or a crash prints every thread's stack: where it hung.
    faulthandler.enable()
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    PROFILED["wanted"] = "profile" in only
    profiler_warmup = None
    if GPU and PROFILED["wanted"]:
        # CUPTI started before any CUDA graph is captured: profiling graphs captured before
        # its first start can miss their kernels or fault (torch's _init_for_cuda_graphs).
        from torch.profiler import ProfilerActivity, profile as torch_profile

        try:
            with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
                pass
        except Exception as e:  # the profile section will fail on its own; the rest runs
            profiler_warmup = f"{type(e).__name__}: {e}"
            PROFILED["wanted"] = False
    os.environ.setdefault("SHOAL_STATE_DIR", str(Path(args.work).resolve() / "state"))
    Path(args.work).mkdir(parents=True, exist_ok=True)
    report: dict = {"device": DEVICE, "sections": {}}
    if args.append and Path(args.out).exists():
        report = json.loads(Path(args.out).read_text())
        report.pop("running", None)  # (a first half cut off)
    elif args.append:
        print(f"--append: no {args.out} yet (a fresh machine?): the sections that compare with the first "
              "half's figures will say so, and the models are made again", flush=True)
    found: dict = dict(report["sections"])
    if profiler_warmup:
        report["profiler_warmup_failed"] = profiler_warmup
    runs = {"env": lambda: env(args), "limits": lambda: limits(args), "greedy_fp32": lambda: greedy(args, "float32"),
            "greedy_bf16": lambda: greedy(args, "bfloat16"), "sampling": lambda: sampling(args),
            "w1": lambda: w1_inprocess(args, measured_limits(found, args)),
            "profile": lambda: profile(args),
            "transformers": lambda: transformers_w1(args), "w1_cluster": lambda: w1_cluster(args, found.get("w1")),
            "w2": lambda: w2(args), "w2_superbatches": lambda: w2_superbatches(args), "structured": lambda: structured(args),
            "streaming": lambda: streaming(args), "w3": lambda: w3(args), "w4": lambda: w4(args),
            "w6": lambda: w6(args)}
    failed = False
    t_all = time.perf_counter()
    for name in SECTIONS:
        if name not in only:
            continue
        missing = [m for m in NEEDS.get(name, []) if importlib.util.find_spec(m) is None]
        if missing:
            result = {"skipped": f"missing {', '.join(missing)} (docs/gpu.md: the wheels to carry)"}
        else:
            print(f"[{name}] started", flush=True)
            write_report({**report, "running": name}, args)  # a run cut off says where
            t = time.perf_counter()
            try:
                result = runs[name]()
            except Exception as e:
                result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
            result["seconds"] = round(time.perf_counter() - t, 1)
            release()
        found[name] = result
        failed |= result.get("ok", True) is False
        status = "SKIPPED " + result["skipped"] if "skipped" in result else (
            "FAILED " + result.get("error", "; ".join(result.get("failures", []))[:500]) if result.get("ok") is False
            else result.get("line", ""))
        print(f"[{name}] {status}" + (f" ({result['seconds']} s)" if "seconds" in result else ""), flush=True)
        if name == "env":
            print("  " + ", ".join(f"{k} {v}" for k, v in result.items() if k != "seconds"), flush=True)
        report["sections"][name] = result
        report["total_seconds"] = round(time.perf_counter() - t_all, 1)
        write_report(report, args)
    if not GPU:
        print("no CUDA here: a dry run at tiny shapes on the CPU; its figures mean nothing")
    print(f"wrote {args.out} ({report['total_seconds']} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
