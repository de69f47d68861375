"""`shoal generate`: a generation job over a JSONL or Parquet file, on the cluster at
--router or on a local one started for it."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from shoal.sdk.client import DEFAULT_CLIENT_TIMEOUT_S
from shoal.generate_input import MAX_ITEM_BYTES
from shoal.cli.exit_codes import add_allow_failures, finish
from shoal.cli.resumable_output import add_overwrite_flag
from shoal.nodes.worker.device_choice import add_device_arg

DTYPE_HELP = ("compute dtype; auto (default): the checkpoint's where this device computes it natively "
              "(bf16 on a CPU only with AVX512_BF16 or AMX), else float32")


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="run a generation job over a JSONL or Parquet file")
    g.add_argument("--model", required=True)
    g.add_argument("--input", required=True, help="JSONL or .parquet: id, prompt | prompt_token_ids, [max_tokens]")
    g.add_argument("--output", required=True, help="JSONL, or Parquet if it ends in .parquet")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0)
    add_output_args(g)
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help=DTYPE_HELP)
    add_device_arg(g)
    g.add_argument("--workers", type=int, default=1, help="workers of the local cluster (without --router)")
    g.add_argument("--router", help="a running cluster's router; without it a local cluster runs the job")
    g.add_argument("--job-key", help="idempotency key: resubmitting it returns the same job")
    g.add_argument("--dry-run", action="store_true",
                   help="predict the job's time from the workers' calibration, and stop (nothing runs)")
    g.add_argument("--predict", action="store_true",
                   help="predict the job's time before it runs, and compare with what it took after")
    g.add_argument("--on-error", choices=["fail", "skip"], default="fail",
                   help="a bad input line: refuse the job (fail), or run the rest and record the line's error "
                        "in the output (skip)")
    g.add_argument("--timeout", type=float, default=DEFAULT_CLIENT_TIMEOUT_S,
                   help="give up when the cluster has not answered a request for this many seconds "
                        "(it waits that long for a node that is down to come back)")
    g.add_argument("--max-item-bytes", type=int, default=MAX_ITEM_BYTES,
                   help="largest input line taken, as compact JSON (a cluster's storage has its own limit)")
    add_overwrite_flag(g)
    add_allow_failures(g)
    g.set_defaults(fn=cmd_generate)


def add_output_args(g) -> None:
    """What every item's output must be or carry (an item's own fields win)."""
    o = g.add_argument_group("output shape (an item's own json_schema, regex, choice, logprobs, n, ... win)")
    c = o.add_mutually_exclusive_group()
    c.add_argument("--json-schema", metavar="FILE", help="constrain every output to JSON valid under this schema "
                   "(a JSON file; '{\"type\": \"object\"}' for any object)")
    c.add_argument("--regex", help="constrain every output to match this regular expression")
    c.add_argument("--choice", action="append", metavar="TEXT", help="constrain every output to one of these "
                   "(repeat the flag for each)")
    o.add_argument("--logprobs", type=int, metavar="N", help="record each token's logprob and its N most likely "
                   "alternatives (0-20), from the model's distribution before temperature and penalties")
    o.add_argument("--n", type=int, default=1, help="samples per prompt (with --temperature > 0 and seeds seed, "
                   "seed+1, ...): a record's samples are its `choices`")
    o.add_argument("--min-tokens", type=int, default=0)
    o.add_argument("--presence-penalty", type=float, default=0.0)
    o.add_argument("--frequency-penalty", type=float, default=0.0)
    o.add_argument("--repetition-penalty", type=float, default=1.0)


def job_settings(args):
    """The command's flags as the job's GenerationSettings (the request contract's
    checks; a bad flag is an InputError naming it)."""
    from shoal.generate_input import InputError
    from shoal.request_settings import GenerationSettings, SettingsError

    wire = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p, "seed": args.seed,
            "logprobs": args.logprobs, "min_tokens": args.min_tokens, "presence_penalty": args.presence_penalty,
            "frequency_penalty": args.frequency_penalty, "repetition_penalty": args.repetition_penalty,
            "regex": args.regex, "choice": args.choice, "n": args.n}
    if args.json_schema:
        import orjson

        try:
            wire["json_schema"] = orjson.loads(Path(args.json_schema).read_bytes())
        except (OSError, orjson.JSONDecodeError) as e:
            raise InputError(f"--json-schema {args.json_schema}: {e}") from None
    try:
        return GenerationSettings.from_wire({k: v for k, v in wire.items() if v is not None})
    except SettingsError as e:
        flag = f"--{e.field.replace('_', '-')}" if e.field else "the job's settings"
        raise InputError(f"{flag}: {e}") from None


def record_tokens(rec: dict) -> int:
    """Generated tokens of a record (all samples of an n > 1 one)."""
    return sum(len(c.get("token_ids", ())) for c in rec.get("choices", [rec]))


def default_job_key(command: str, fingerprint: str) -> str:
    """The job key a run uses without --job-key: its fingerprint (settings and items).
    Run again after the client died or gave up, the same command finds its job still
    known to the cluster and reads the results stored meanwhile, instead of submitting
    the missing items as a new job and computing them again."""
    return f"{command}-{fingerprint[:32]}"


def record_key(rec: dict) -> tuple:
    """What a record of the output answers: an input line refused by --on-error skip (its
    id, if it has one, may be a good line's too), or an item."""
    return ("line", rec["line"]) if "line" in rec else ("id", rec["id"])


def cmd_generate(args) -> int:
    """A generation job through a cluster: the one at --router, or a local one started
    for this job and stopped afterwards."""
    from contextlib import nullcontext

    from shoal.sdk.client import Client
    from shoal.generate_input import InputError, model_limits, read_generate_items_skipping
    from shoal.cluster.local_cluster import LocalCluster
    from shoal.cli.progress import Progress
    from shoal.request_settings import SettingsError, check_fits

    from shoal.cli.output_path import check_output_file
    from shoal.cli.resumable_output import ResumableOutput, job_fingerprint

    settings = job_settings(args)
    job_wide = settings
    sent_params = settings.to_wire()
    check_output_file(args.output)  # before the job runs: its results are not thrown away at the end
    context, vocab = model_limits(args.model)
    try:
        check_fits(settings.sampling.max_tokens, 0, context)
    except SettingsError:
        raise InputError(f"--max-tokens {settings.sampling.max_tokens} does not fit the model's context of "
                         f"{context} tokens") from None
    # Every line is checked before anything starts; with --on-error skip a bad one becomes
    # its own error record in the output instead of refusing the job.
    items, bad = read_generate_items_skipping(args.input, args.max_item_bytes, max_context=context,
                                              skip=args.on_error == "skip", job=settings, vocab_size=vocab)
    for rec in bad:
        print(f"skipped: {rec['error']}", file=sys.stderr)
    if not items:
        raise InputError(f"{args.input}: no item to run" + (f" ({len(bad)} skipped)" if bad else ""))
    payload = [it.to_record() for it in items]
    parquet = str(args.output).endswith(".parquet")
    jsonl_path = f"{args.output}.jsonl.part" if parquet else args.output
    settings = {"command": "generate", "model": str(Path(args.model).resolve()), "dtype": args.dtype,
                "params": sent_params}
    # Refused lines count by their numbers (their errors name the input as it was typed).
    fingerprint = job_fingerprint(settings, [*payload, *({"refused line": rec["line"]} for rec in bad)])
    output = ResumableOutput(jsonl_path, fingerprint, overwrite=args.overwrite)
    done, failed = set(), 0
    for rec in output.earlier_results():
        done.add(record_key(rec))
        failed += rec.get("finish_reason") == "error"
    todo = [rec for rec in payload if ("id", rec["id"]) not in done]
    if output.resuming:
        print(f"resuming: {output.kept} of {len(payload) + len(bad)} records already in {jsonl_path}; running the "
              f"other {len(todo)}", file=sys.stderr)
    if args.dry_run:  # before the output is opened: a dry run writes nothing
        cluster = nullcontext() if args.router else LocalCluster(args.model, workers=args.workers, dtype=args.dtype,
                                                                 device=args.device)
        with cluster as local:
            prediction = _predict(Client(args.router or local.router, timeout=args.timeout), todo, job_wide, args)
        return 0 if prediction is not None else 1
    tokens, wall, prediction = 0, 0.0, None
    with output:
        for rec in (rec for rec in bad if record_key(rec) not in done):
            output.write(rec)
            failed += 1
        if todo:
            cluster = nullcontext() if args.router else LocalCluster(
                args.model, workers=args.workers, dtype=args.dtype, device=args.device,
                storage_args=["--max-item-bytes", str(args.max_item_bytes)])
            with cluster as local:
                router = args.router or local.router
                if args.predict:
                    prediction = _predict(Client(router, timeout=args.timeout), todo, job_wide, args)
                t0 = time.perf_counter()
                job = Client(router, timeout=args.timeout).submit(todo, params=sent_params, job_key=args.job_key or default_job_key("generate", fingerprint))
                print(f"job {job.id}: {len(todo)} sequences via {router}", file=sys.stderr)
                progress = Progress(len(payload), "sequences")
                progress.advance(len(payload) - len(todo))
                for rec in job.results():
                    if ("id", rec["id"]) in done:  # a resubmitted --job-key returns the whole job
                        continue
                    done.add(("id", rec["id"]))
                    for c in rec.get("choices", [rec]):
                        c.pop("margins", None)
                        c.pop("draws", None)
                    tokens += record_tokens(rec)
                    failed += rec.get("finish_reason") == "error"
                    output.write(rec)
                    progress.advance(1, f"{tokens / max(time.perf_counter() - t0, 1e-9):.0f} tok/s")
                progress.close()
                wall = time.perf_counter() - t0  # the job, not the local cluster's shutdown
        if parquet:  # before the run counts as finished: its results are all in the part file until then
            from shoal.results_parquet import jsonl_to_parquet

            jsonl_to_parquet(jsonl_path, args.output)
    if parquet:
        os.unlink(jsonl_path)
    if prediction is not None and wall:
        print(f"predicted {prediction.seconds:.1f}s ({prediction.tokens_per_s:.0f} output tok/s), measured {wall:.1f}s "
              f"from submit to the last result: error {100 * (prediction.seconds - wall) / wall:+.0f}%", file=sys.stderr)
    print(f"results: {args.output}  ({len(items) + len(bad)} sequences, {failed} failed, "
          f"{tokens} tokens in {wall:.1f}s, {tokens / max(wall, 1e-9):.0f} output tok/s"
          + (f"; {output.kept} kept from the interrupted run" if output.resuming else "") + ")")
    return finish(failed, len(items) + len(bad), "sequences", args.output, args.allow_failures)


def _predict(client, records: list[dict], job, args):
    """Prints the job's predicted time; None (said why) where the cluster cannot be predicted."""
    from shoal.cli.generate_plan import NoPrediction, predict_items
    from shoal.scheduler.cost_model import CalibrationError

    try:
        prediction = predict_items(client, records, job, args.model)
    except (NoPrediction, CalibrationError, KeyError, TypeError, ValueError) as e:  # the job runs all the same
        print(f"no prediction: {e}", file=sys.stderr)
        return None
    print(f"prediction: {prediction.summary()}", file=sys.stderr)
    return prediction
