"""The `shoal` command line."""

from __future__ import annotations

import argparse
import sys
import time

import orjson


def cmd_make_model(args) -> int:
    from shoal.nodes.worker.models.make_model import make_model

    out = make_model(args.out, preset=args.preset, architecture=args.arch, dtype=args.dtype, seed=args.seed)
    print(f"model: {out}")
    return 0


def cmd_generate(args) -> int:
    """Runs a generation job on an engine in this process (the cluster path comes with
    the router and workers)."""
    from dataclasses import replace

    from shoal.generate_input import read_generate_items
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.progress import Progress
    from shoal.sampling import RequestError, SamplingParams

    items = read_generate_items(args.input)
    engine = LLMEngine(args.model, EngineConfig(dtype=args.dtype))
    base = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    failed = 0
    with open(args.output, "wb") as out:
        for it in items:
            p = replace(base, max_tokens=it.max_tokens) if it.max_tokens else base
            try:
                engine.add_request(it.id, prompt=it.prompt, prompt_token_ids=it.prompt_token_ids, params=p)
            except RequestError as e:
                failed += 1
                out.write(orjson.dumps({"id": it.id, "error": str(e)}) + b"\n")
        progress = Progress(len(items) - failed, "sequences")
        t0, tokens = time.perf_counter(), 0
        while engine.has_unfinished():
            for r in engine.step():
                tokens += len(r.token_ids)
                out.write(orjson.dumps({"id": r.seq_id, "text": r.text, "token_ids": r.token_ids,
                                        "finish_reason": r.finish_reason}) + b"\n")
                progress.advance(1, f"{tokens / (time.perf_counter() - t0):.0f} tok/s")
        progress.close()
    wall = time.perf_counter() - t0
    print(f"results: {args.output}  ({len(items) - failed} sequences, {failed} refused, "
          f"{tokens} tokens in {wall:.1f}s, {tokens / max(wall, 1e-9):.0f} output tok/s)")
    return 0


def cmd_calibrate(args) -> int:
    """Measures the step cost model on this device and caches it (re-runs if cached)."""
    from shoal.nodes.worker import calibration
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine

    engine = LLMEngine(args.model, EngineConfig(dtype=args.dtype, policy="mb"))
    cm = calibration.calibrate(engine, progress=lambda m: print(m, flush=True))
    path = calibration.save(engine, cm)
    print(f"calibration: {path}")
    try:
        cm.validate()
    except ValueError as e:
        print(f"warning: EB and EB+ will not use this calibration: {e}")
        return 1
    return 0


NODE_MAINS = {"storage": "shoal.nodes.storage", "worker": "shoal.nodes.worker.worker_node"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="shoal", description="Batch inference for iterative retrieval workloads")
    sub = ap.add_subparsers(dest="cmd", required=True)

    mm = sub.add_parser("make-model", help="write a random-weight checkpoint in Hugging Face layout")
    mm.add_argument("--preset", default="tiny", help="tiny | small")
    mm.add_argument("--out", required=True)
    mm.add_argument("--arch", default="Qwen3ForCausalLM")
    mm.add_argument("--dtype", default="bfloat16")
    mm.add_argument("--seed", type=int, default=0)
    mm.set_defaults(fn=cmd_make_model)

    g = sub.add_parser("generate", help="run a generation job over a JSONL file")
    g.add_argument("--model", required=True)
    g.add_argument("--input", required=True)
    g.add_argument("--output", required=True)
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    g.set_defaults(fn=cmd_generate)

    n = sub.add_parser("node", help="run one node of a cluster in this process (roles so far: storage, worker)")
    n.add_argument("role", choices=sorted(NODE_MAINS))
    n.add_argument("rest", nargs=argparse.REMAINDER, help="the role's own options (--dir, --bind, --etcd, ...)")
    n.set_defaults(fn=lambda a: __import__(NODE_MAINS[a.role], fromlist=["main"]).main(a.rest))

    c = sub.add_parser("calibrate", help="measure the step cost model on this device (cached per model, dtype, device)")
    c.add_argument("--model", required=True)
    c.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    c.set_defaults(fn=cmd_calibrate)

    args = ap.parse_args(argv)
    from shoal.generate_input import InputError
    from shoal.sampling import RequestError

    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.fn(args)
    except (InputError, RequestError, ValueError) as e:
        print(f"shoal {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
