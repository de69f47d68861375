"""`shoal batch`: an OpenAI Batch API file through a cluster, on the one at --router or on a
local one started for it.

    shoal batch --input requests.jsonl --output results.jsonl --model M/ [--encoder E/]

Chat and completion requests run on the decoder (--model), embedding requests on the
encoder (--encoder); one job runs them all. Output lines come in the order requests
finish (as the API's do: match them by custom_id), each bad line's error first.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from shoal.cli.resumable_output import add_overwrite_flag
from shoal.nodes.worker.device_choice import add_device_arg
from shoal.cli.exit_codes import add_allow_failures, finish

DEFAULT_CHAT_MAX_TOKENS = 256


def add_parser(sub) -> None:
    b = sub.add_parser("batch", help="run an OpenAI Batch API file (chat completions, completions, embeddings)")
    b.add_argument("--input", required=True, help="JSONL: one {custom_id, method, url, body} request per line")
    b.add_argument("--output", required=True, help="JSONL: one {id, custom_id, response, error} line per request")
    b.add_argument("--model", help="the decoder folder (needed for chat and completion requests)")
    b.add_argument("--encoder", help="the encoder folder (needed for embedding requests)")
    b.add_argument("--max-tokens", type=int, default=DEFAULT_CHAT_MAX_TOKENS,
                   help="a chat request's max_tokens where it sets none (completions: 16, as the API)")
    b.add_argument("--router", help="a running cluster's router; without it a local cluster runs the batch")
    add_device_arg(b)
    b.add_argument("--workers", type=int, default=1, help="workers of the local cluster (without --router)")
    b.add_argument("--dtype", default="auto", help="compute dtype of the local cluster's workers")
    b.add_argument("--job-key", help="idempotency key: the same key on the same cluster attaches to the same job")
    b.add_argument("--timeout", type=float, default=120.0, help="seconds a request to the cluster may take")
    add_allow_failures(b)
    add_overwrite_flag(b)
    b.set_defaults(fn=cmd_batch)


def read_requests(path: str, embedding_dim: int | None, have_model: bool, have_encoder: bool,
                  limits: tuple[int, int] | None = None):
    """(requests, [(line, custom_id, code, message, param)] for the lines that cannot run)."""
    from shoal.generate_input import InputError, parse_jsonl
    from shoal.openai_requests import RequestLineError, parse_request

    if not Path(path).is_file():
        raise InputError(f"input file {path} does not exist")
    requests, bad, seen = [], [], {}
    with open(path, "rb") as fh:
        for _, line, rec in parse_jsonl(fh, path, keep_going=True):
            try:
                if isinstance(rec, InputError):
                    raise RequestLineError(str(rec), "invalid_json")
                req = parse_request(rec, line, seen, embedding_dim, limits)
                missing = "--encoder" if req.kind == "embedding" and not have_encoder else \
                    "--model" if req.kind != "embedding" and not have_model else None
                if missing:
                    raise RequestLineError(f"line {line} ({req.custom_id}): {rec['url']} needs {missing}",
                                           "model_not_found", "body.model", req.custom_id)
                requests.append(req)
            except RequestLineError as e:
                custom_id = rec.get("custom_id") if isinstance(rec, dict) else None
                bad.append((line, custom_id if isinstance(custom_id, str) else None, e.code, str(e), e.param))
    return requests, bad


def token_counter(encoder: str, max_length: int):
    """Input tokens of texts as the encoder counts them (special tokens included, truncated)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(encoder) / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    return lambda texts: sum(len(e.ids) for e in tok.encode_batch(list(texts)))


def cmd_batch(args) -> int:
    from contextlib import nullcontext

    from shoal.sdk.client import Client
    from shoal.generate_input import InputError
    from shoal.cluster.local_cluster import LocalCluster
    from shoal.openai_responses import OutputLines
    from shoal.cli.output_path import check_output_file
    from shoal.cli.progress import Progress
    from shoal.cli.generate import default_job_key
    from shoal.cli.resumable_output import ResumableOutput, job_fingerprint

    if not args.model and not args.encoder:
        raise InputError("give --model (chat and completion requests), --encoder (embeddings), or both")
    check_output_file(args.output)
    encoder_info = None
    if args.encoder:
        from shoal.encoder_config import describe_encoder

        encoder_info = describe_encoder(args.encoder)
    from shoal.generate_input import model_limits

    limits = model_limits(args.model) if args.model else None
    requests, bad = read_requests(args.input, encoder_info and encoder_info["dim"], bool(args.model), bool(args.encoder),
                                  limits)
    for line in bad:
        print(f"bad request: {line[3]}", file=sys.stderr)
    by_id = {r.custom_id: r for r in requests}
    count_tokens = token_counter(args.encoder, encoder_info["max_seq_length"]) if encoder_info else None
    settings = {"command": "batch", "model": args.model and str(Path(args.model).resolve()),
                "encoder": args.encoder and str(Path(args.encoder).resolve()), "dtype": args.dtype,
                "max_tokens": args.max_tokens, "job_key": args.job_key}
    fingerprint = job_fingerprint(settings, [[r.line, r.item] for r in requests] + [list(b) for b in bad])
    # Output ids are the tag and the input line: a tag of the job's own (the key is in the
    # fingerprint) gives the lines of a rerun that finishes an interrupted run the same ids.
    tag = (args.job_key or fingerprint)[-12:]
    lines = OutputLines(tag, int(time.time()))
    output = ResumableOutput(args.output, fingerprint, overwrite=args.overwrite)
    done, failed = set(), 0
    for line in output.earlier_results():  # done: input line numbers
        done.add(line["error"]["line"] if line["error"] is not None else by_id[line["custom_id"]].line)
        failed += line["error"] is not None
    todo = [r for r in requests if r.line not in done]
    if output.resuming:
        print(f"resuming: {output.kept} of {len(requests) + len(bad)} lines already in {args.output}; running the "
              f"other {len(todo)}", file=sys.stderr)
    t0 = time.perf_counter()
    with output:
        for b in bad:
            if b[0] not in done:
                output.write(lines.error(*b))
                failed += 1
        if todo:
            kinds = {r.kind for r in todo}
            cluster = nullcontext() if args.router else LocalCluster(
                args.model if kinds - {"embedding"} else None, workers=args.workers, dtype=args.dtype, device=args.device,
                encoder=args.encoder if "embedding" in kinds else None)
            with cluster as local:
                router = args.router or local.router
                job = Client(router, timeout=args.timeout).submit(
                    [r.item for r in todo], program="openai_request",
                    params={"max_tokens": args.max_tokens}, job_key=args.job_key or default_job_key("batch", fingerprint))
                print(f"job {job.id}: {len(todo)} requests via {router}", file=sys.stderr)
                progress = Progress(len(requests), "requests")
                progress.advance(len(requests) - len(todo))
                for rec in job.results():
                    req = by_id[rec["id"]]
                    if req.line in done:  # a resubmitted --job-key returns the whole job
                        continue
                    done.add(req.line)
                    line = lines.result(req, rec, count_tokens)
                    failed += line["error"] is not None
                    output.write(line)
                    progress.advance(1)
                progress.close()
    total = len(requests) + len(bad)
    print(f"results: {args.output}  ({total} requests, {total - failed} completed, {failed} failed, "
          f"{time.perf_counter() - t0:.1f}s)")
    return finish(failed, total, "requests", args.output, args.allow_failures)
