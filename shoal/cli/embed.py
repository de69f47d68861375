"""`shoal embed`: a bulk embedding job, on the cluster at --router or on a local one
started for it.

    shoal embed --encoder MiniLM/ --input corpus/*.jsonl --output emb/

Run the same command again after any crash (of a node, or of the whole local
cluster): the output's manifest says which SuperBatches are written, and only the rest
is embedded.
"""

from __future__ import annotations

import sys
import time

from shoal.nodes.worker.device_choice import add_device_arg
from shoal.cli.exit_codes import add_allow_failures, finish
from shoal.scheduler.superbatch import token_budget_arg


def add_parser(sub) -> None:
    e = sub.add_parser("embed", help="embed a corpus of JSONL or Parquet files into Parquet (SuperBatches)")
    e.add_argument("--encoder", required=True, help="a sentence-transformers folder (config.json, model.safetensors, "
                                                    "tokenizer.json); the workers host the same one")
    e.add_argument("--input", required=True, nargs="+", help="JSONL or .parquet files with a text field; each file is "
                                                              "a partition unless --partition-by names a column")
    e.add_argument("--output", required=True, help="directory for the Parquet files and their manifest")
    e.add_argument("--partition-by", default="", help="column naming each row's partition")
    e.add_argument("--text-field", default="text")
    e.add_argument("--id-field", default="id", help="rows without it are named FILE-STEM:LINE")
    e.add_argument("--b-min", type=int, default=1024, help="a SuperBatch packs whole partitions until it holds this many texts")
    e.add_argument("--n-max", type=int, default=1024, help="a partition larger than this is split into pieces of it")
    e.add_argument("--vector-dtype", default="float32", choices=["float32", "float16"], help="as stored")
    e.add_argument("--on-error", default="fail", choices=["fail", "skip"],
                   help="a malformed row stops the job before it runs (fail) or is skipped and reported (skip)")
    e.add_argument("--encoder-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help="compute dtype of the local cluster's workers (auto: the encoder checkpoint's where "
                        "this device computes it natively, else float32)")
    e.add_argument("--encoder-token-budget", type=token_budget_arg, default=None,
                   help="padded tokens per encoder micro-batch of the local cluster's workers "
                        "(default: 2048 on a CPU, 16384 on a GPU)")
    add_device_arg(e)
    e.add_argument("--workers", type=int, default=1, help="workers of the local cluster (without --router)")
    e.add_argument("--threads", type=int, default=None, help="torch threads per local worker")
    e.add_argument("--router", help="a running cluster's router; without it a local cluster runs the job")
    e.add_argument("--job-key", help="idempotency key (default: derived from the inputs, output and settings)")
    e.add_argument("--dry-run", action="store_true",
                   help="predict the job's time and throughput from the cluster's calibration, and stop")
    e.add_argument("--no-predict", action="store_true",
                   help="skip the prediction (it tokenizes the inputs here, once) and its comparison after the run")
    add_allow_failures(e)
    e.set_defaults(fn=cmd_embed)


def cmd_embed(args) -> int:
    from contextlib import nullcontext

    from shoal.sdk.client import Client
    from shoal.cluster.local_cluster import LocalCluster
    from shoal.encoder_config import describe_encoder
    from shoal.cli.progress import Progress

    info = describe_encoder(args.encoder)
    worker_args = ["--encoder-dtype", args.encoder_dtype]
    if args.encoder_token_budget is not None:
        worker_args += ["--encoder-token-budget", str(args.encoder_token_budget)]
    cluster = nullcontext() if args.router else LocalCluster(encoder=args.encoder, workers=args.workers, device=args.device,
                                                             worker_args=worker_args, worker_threads=args.threads)
    with cluster as local:
        router = args.router or local.router
        client = Client(router)
        prediction = None
        if args.dry_run or not args.no_predict:
            prediction = _predict(client, args, info)
            print(f"prediction: {prediction.summary()}", file=sys.stderr)
            if args.dry_run:
                return 0
        t0 = time.perf_counter()
        job = client.embed(args.input, args.output, info, partition_by=args.partition_by, b_min=args.b_min,
                                   n_max=args.n_max, vector_dtype=args.vector_dtype, on_error=args.on_error,
                                   text_field=args.text_field, id_field=args.id_field, job_key=args.job_key)
        d = job.detail
        print(f"job {job.id}: {job.total} texts in {d.get('partitions', 0)} partitions via {router}"
              + (f"; {d['done']} already in {args.output}" if d.get("done") else ""), file=sys.stderr)
        if d.get("skipped"):
            print(f"skipped {d['skipped']} bad rows; the first:", file=sys.stderr)
            for line in d.get("errors", []):
                print(f"  {line}", file=sys.stderr)
        if d.get("empty"):
            print(f"empty partitions: {', '.join(d['empty'])}", file=sys.stderr)
        accepted = time.perf_counter()  # the corpus is read: encoding starts
        progress = Progress(job.total, "texts")
        first: list[float] = []

        def show(st: dict) -> None:
            if st["done"] > d.get("done", 0) and not first:
                first.append(time.perf_counter() - t0)
            progress.advance(st["done"] - progress.done, f"{st['tokens_per_s']:.0f} texts/s")

        final = job.wait_until_done(poll=0.2, on_status=show)
        t_done = time.perf_counter()
        progress.close()
        wall = time.perf_counter() - t0
    if final["state"] != "done":
        print(f"job {job.id} ended {final['state']}: {final['done']} of {final['total']} texts", file=sys.stderr)
        return 1
    new = final["done"] - d.get("done", 0)
    summary = _output_summary(args.output)
    print(f"embeddings: {args.output}  ({final['total']} texts, {new} embedded now in {wall:.1f}s, "
          f"{new / max(wall, 1e-9):.0f} texts/s, first output after {first[0] if first else wall:.1f}s{summary})")
    if prediction is not None and not d.get("done"):
        measured = t_done - accepted
        print(f"predicted {prediction.superbatch_s:.1f}s for the SuperBatches ({prediction.texts_per_s:.0f} texts/s), "
              f"measured {measured:.1f}s ({final['total'] / max(measured, 1e-9):.0f} texts/s): error "
              f"{100 * (prediction.superbatch_s - measured) / max(measured, 1e-9):+.0f}% "
              f"(reading the corpus took {accepted - t0:.1f}s more)")
    return finish(d.get("skipped", 0), final["total"] + d.get("skipped", 0), "rows", args.output + " (their errors: above)", args.allow_failures)


def _predict(client, args, info: dict):
    import os
    import socket

    from shoal.corpus_reader import CorpusSpec
    from shoal.cli.embed_plan import predict_job

    spec = CorpusSpec(tuple(args.input), args.partition_by, args.text_field, args.id_field, args.on_error)
    # The call overhead is a property of the cluster: cached per router, or per machine for local clusters.
    key = args.router or f"local-{socket.gethostname()}-{os.cpu_count()}-{args.threads or 0}-{args.workers}"
    return predict_job(client, spec, args.encoder, info, args.b_min, args.n_max, cache_key=key)


def _output_summary(folder: str) -> str:
    """Truncated texts and coverage, when the output is on this machine."""
    from shoal.sdk.embeddings import EmbeddingSet

    try:
        out = EmbeddingSet(folder)
    except FileNotFoundError:
        return ""
    missing = out.missing()
    note = f", {out.truncated} texts truncated to the encoder's limit" if out.truncated else ""
    return note + (f", {sum(missing.values())} rows MISSING" if missing else "")
