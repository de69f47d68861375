"""`shoal index build|load`, `shoal rag` and `shoal demo-data`: iterative retrieval from
the command line.

    shoal demo-data --out demo/                       # stdlib passages and questions
    shoal embed --encoder MiniLM/ --input demo/corpus.jsonl --output demo/emb
    shoal index build --embeddings demo/emb --shards 2 --output demo/index
    shoal rag --model M/ --encoder MiniLM/ --index demo/index --input demo/questions.jsonl \\
        --output demo/answers.jsonl --hops 3 --k 4

`shoal rag` checks everything it can before it starts (the index, that it was built
with --encoder, k against its size, every line of the questions), loads the index onto
the storage nodes and runs the `ircot` program over the questions; each output line is
{id, question, answer, answered, hops: [{query, passages, thought}]}.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import orjson

from shoal.cli.resumable_output import add_overwrite_flag
from shoal.nodes.worker.device_choice import add_device_arg
from shoal.cli.exit_codes import add_allow_failures, finish


def add_parsers(sub) -> None:
    ix = sub.add_parser("index", help="vector indexes: build one from an embedding job's output, load it")
    isub = ix.add_subparsers(dest="index_cmd", required=True)
    b = isub.add_parser("build", help="an index of an embedding job's output, in shards: exact or approximate (faiss)")
    b.add_argument("--embeddings", required=True, help="a `shoal embed --output` directory (complete)")
    b.add_argument("--output", required=True, help="the index directory to write (replaced if it exists)")
    b.add_argument("--shards", type=int, default=1, help="shards, each served by a storage node")
    b.add_argument("--kind", default="exact", choices=["exact", "ivf", "hnsw"],
                   help="exact search, or an approximate faiss index for corpora past a few million passages")
    b.add_argument("--nlist", type=int, help="ivf: inverted lists per shard (default about 4*sqrt(rows))")
    b.add_argument("--m", type=int, help="hnsw: links per vector (default 32)")
    b.add_argument("--ef-construction", type=int, help="hnsw: candidates kept while building (default 80)")
    b.set_defaults(fn=cmd_index_build)
    ld = isub.add_parser("load", help="load an index onto a running cluster's storage nodes")
    ld.add_argument("--router", required=True)
    ld.add_argument("--index", required=True, help="an index directory the storage nodes can read at this path")
    ld.add_argument("--name", default="default", help="what Retrieve operations call it")
    ld.add_argument("--replicas", type=int, default=1, help="storage nodes per shard (retrieval fails over between them)")
    ld.set_defaults(fn=cmd_index_load)

    r = sub.add_parser("rag", help="iterative retrieval (the ircot program) over a file of questions")
    r.add_argument("--model", help="decoder folder (for the local cluster; a --router cluster has its own)")
    r.add_argument("--encoder", required=True, help="the encoder the index was built with")
    r.add_argument("--index", required=True, help="a `shoal index build` directory")
    r.add_argument("--input", required=True, help="JSONL of {id, question, [max_hops], [thought_tokens]}")
    r.add_argument("--output", required=True, help="JSONL of answers with their hops")
    r.add_argument("--hops", type=int, default=3, help="at most this many retrieve+think hops (an item may set max_hops)")
    r.add_argument("--k", type=int, default=4, help="passages retrieved per hop")
    r.add_argument("--thought-tokens", type=int, default=32, help="at most this many tokens per thought")
    r.add_argument("--index-name", default="default")
    r.add_argument("--replicas", type=int, default=1, help="storage nodes per index shard")
    r.add_argument("--router", help="a running cluster's router; without it a local cluster runs the job")
    add_device_arg(r)
    r.add_argument("--workers", type=int, default=1, help="workers of the local cluster")
    r.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="the local cluster's decoder dtype (auto: the checkpoint's where this device computes "
                        "it natively, else float32)")
    r.add_argument("--storage-nodes", type=int, default=1, help="storage nodes of the local cluster")
    r.add_argument("--threads", type=int, default=None, help="torch threads per local worker")
    r.add_argument("--job-key", help="idempotency key (default: a new job)")
    add_overwrite_flag(r)
    add_allow_failures(r)
    r.set_defaults(fn=cmd_rag)

    d = sub.add_parser("demo-data", help="the demo corpus (stdlib docstrings) and questions about it")
    d.add_argument("--out", required=True)
    d.add_argument("--passages", type=int, default=2000)
    d.add_argument("--questions", type=int, default=64)
    d.set_defaults(fn=cmd_demo_data)


def cmd_index_build(args) -> int:
    from shoal.cli.progress import Progress
    from shoal.cli.index_build import build_index

    t0 = time.perf_counter()
    progress = None

    def show(done: int, total: int) -> None:
        nonlocal progress
        progress = progress or Progress(total, "passages")
        progress.advance(done - progress.done)

    ann = {k: v for k, v in (("nlist", args.nlist), ("m", args.m), ("ef_construction", args.ef_construction)) if v}
    meta = build_index(args.embeddings, args.output, args.shards, progress=show, kind=args.kind, ann=ann)
    if progress:
        progress.close()
    defaults = f", search default {meta['shards'][0]['ann']}" if meta["kind"] != "exact" else ""
    print(f"index: {args.output}  ({meta['kind']}: {meta['rows']} passages of dimension {meta['dim']} in "
          f"{len(meta['shards'])} shards{defaults}, {time.perf_counter() - t0:.1f}s)")
    return 0


def cmd_index_load(args) -> int:
    from shoal.sdk.client import Client

    r = Client(args.router).load_index(args.index, args.name, args.replicas)
    print(f"index {r['name']} ({r['rows']} passages): " +
          ", ".join(f"shard {i} on {'+'.join(nodes)}" for i, nodes in enumerate(r["placement"])))
    return 0


def cmd_demo_data(args) -> int:
    from shoal.cli.demo_corpus import write_demo_data

    c, q = write_demo_data(args.out, args.passages, args.questions)
    print(f"corpus: {c}\nquestions: {q}")
    return 0


def read_questions(path: str | Path) -> list[dict]:
    """Every line checked as an ircot item (InputError names the first bad one)."""
    from shoal.generate_input import ItemChecker, read_records

    checker = ItemChecker("ircot")
    return [checker.record(rec, where, place) for where, place, rec in read_records(path)]


def check_index(index: str | Path, encoder: str | Path, k: int) -> dict:
    """The index's manifest, if this encoder made it and it holds k passages."""
    from shoal.encoder_config import describe_encoder
    from shoal.vector_index import IndexFileError, read_manifest

    meta = read_manifest(index)
    enc = describe_encoder(encoder)
    if meta["encoder"] != enc["fingerprint"] or meta["dim"] != enc["dim"]:
        raise IndexFileError(f"index {index} was built with encoder {meta['encoder']} (dimension {meta['dim']}), "
                          f"but --encoder {encoder} is {enc['fingerprint']} (dimension {enc['dim']}): "
                          "queries must be embedded by the encoder that embedded the passages")
    if k > meta["rows"]:
        raise IndexFileError(f"--k {k} is larger than index {index} ({meta['rows']} passages)")
    return meta


def cmd_rag(args) -> int:
    from contextlib import nullcontext

    from shoal.sdk.client import Client
    from shoal.cluster.local_cluster import LocalCluster
    from shoal.cli.progress import Progress

    if not args.router and not args.model:
        raise ValueError("give --model (a local cluster runs the job) or --router")
    from shoal.cli.output_path import check_output_file
    from shoal.cli.generate import default_job_key
    from shoal.cli.resumable_output import ResumableOutput, job_fingerprint

    meta = check_index(args.index, args.encoder, args.k)
    items = read_questions(args.input)
    check_output_file(args.output)
    params = {"max_hops": args.hops, "k": args.k, "thought_tokens": args.thought_tokens, "index": args.index_name}
    # Answers stream into a part file as they come (a rerun after a crash keeps them) and
    # are written out in input order at the end.
    part = f"{args.output}.part"
    settings = {"command": "rag", "model": args.model and str(Path(args.model).resolve()),
                "encoder": str(Path(args.encoder).resolve()),
                "index": {"path": str(Path(args.index).resolve()), "manifest": meta},
                "dtype": args.dtype, "params": params}
    fingerprint = job_fingerprint(settings, items)
    output = ResumableOutput(part, fingerprint, overwrite=args.overwrite)
    records = {rec["id"]: rec for rec in output.earlier_results()}
    todo = [it for it in items if it["id"] not in records]
    if output.resuming:
        print(f"resuming: {len(records)} of {len(items)} answers already in {part}; running the other {len(todo)}",
              file=sys.stderr)
    wall = 0.0
    with output:
        if todo:
            cluster = nullcontext() if args.router else LocalCluster(
                args.model, encoder=args.encoder, workers=args.workers, dtype=args.dtype, device=args.device,
                storage_nodes=args.storage_nodes, worker_threads=args.threads)
            with cluster as local:
                router = args.router or local.router
                client = Client(router)
                placed = client.load_index(args.index, args.index_name, args.replicas)
                print(f"index {args.index_name}: {meta['rows']} passages in {len(placed['placement'])} shards on "
                      f"{sorted({n for nodes in placed['placement'] for n in nodes})}", file=sys.stderr)
                t0 = time.perf_counter()
                job = client.submit(todo, program="ircot", params=params,
                                     job_key=args.job_key or default_job_key("rag", fingerprint))
                print(f"job {job.id}: {len(todo)} questions via {router}", file=sys.stderr)
                progress = Progress(len(items), "questions")
                progress.advance(len(items) - len(todo))
                for rec in job.results():
                    if rec["id"] in records:  # a resubmitted --job-key returns the whole job
                        continue
                    records[rec["id"]] = rec
                    output.write(rec)
                    progress.advance(1)
                progress.close()
                wall = time.perf_counter() - t0
        tmp = Path(f"{args.output}.tmp")
        with open(tmp, "wb") as out:
            for it in items:  # input order
                out.write(orjson.dumps(records[it["id"]]) + b"\n")
        tmp.replace(args.output)
    Path(part).unlink()
    gold = {it["id"]: it["gold"] for it in items if "gold" in it}
    ok = [r for r in records.values() if r.get("finish_reason") != "error"]
    hops = sum(len(r["hops"]) for r in ok)
    found = sum(1 for r in ok if r["id"] in gold and any(gold[r["id"]] in h["passages"] for h in r["hops"]))
    print(f"answers: {args.output}  ({len(items)} questions, {len(items) - len(ok)} failed, {hops} hops in {wall:.1f}s"
          + (f"; the gold passage was retrieved for {found} of {sum(1 for r in ok if r['id'] in gold)}" if gold else "")
          + ")")
    for r in records.values():
        if r.get("finish_reason") == "error":
            print(f"  {r['id']}: {r['error']}", file=sys.stderr)
    return finish(len(items) - len(ok), len(items), "questions", args.output, args.allow_failures)
