"""The `shoal` command line."""

from __future__ import annotations

import argparse
import sys

from shoal.cli.generate import DTYPE_HELP
from shoal.nodes.worker.device_choice import DEVICE_HELP, device_arg
from shoal.protocol.errors import ShoalError


def cmd_make_model(args) -> int:
    from shoal.nodes.worker.models.make_model import make_model

    out = make_model(args.out, preset=args.preset, architecture=args.arch, dtype=args.dtype, seed=args.seed,
                     tokenizer=args.tokenizer, chat_template=None if args.chat_template == "none" else args.chat_template)
    print(f"model: {out}")
    return 0


def cmd_calibrate(args) -> int:
    """Measures the step cost model on this device and caches it (re-runs if cached)."""
    from shoal.nodes.worker import calibration
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine

    engine = LLMEngine(args.model, EngineConfig(dtype=args.dtype, policy="mb", device_memory=args.device_memory,
                                                device=args.device))
    cm = calibration.calibrate(engine, progress=lambda m: print(m, flush=True))
    path = calibration.save(engine, cm)
    print(f"calibration: {path}")
    try:
        cm.validate()
    except ValueError as e:
        print(f"warning: EB and EB+ will not use this calibration: {e}")
        return 1
    return 0


NODE_MAINS = {"storage": "shoal.nodes.storage.storage_node", "worker": "shoal.nodes.worker.worker_node",
              "scheduler": "shoal.nodes.scheduler_node", "router": "shoal.nodes.router"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="shoal", description="Batch inference for iterative retrieval workloads")
    sub = ap.add_subparsers(dest="cmd", required=True)

    mm = sub.add_parser("make-model", help="write a random-weight checkpoint in Hugging Face layout")
    mm.add_argument("--preset", default="tiny",
                    help="tiny | small | qwen3-1.7b | moe-tiny | moe-small (Qwen3-MoE, 8 or 16 experts, top 2)")
    mm.add_argument("--out", required=True)
    mm.add_argument("--arch", default="Qwen3ForCausalLM")
    mm.add_argument("--dtype", default="bfloat16")
    mm.add_argument("--seed", type=int, default=0)
    mm.add_argument("--tokenizer", default=None, help="folder with a tokenizer.json to use (its vocabulary size "
                                                      "becomes the model's); default: one trained on stdlib text")
    mm.add_argument("--chat-template", default="none", choices=["none", "chatml"],
                    help="write a chat template (and its special tokens) so items may be chat messages")
    mm.set_defaults(fn=cmd_make_model)

    from shoal.cli.generate import add_parser as add_generate

    add_generate(sub)
    from shoal.cli.batch import add_parser as add_batch

    add_batch(sub)
    from shoal.cli.embed import add_parser as add_embed

    add_embed(sub)

    from shoal.cli.rag import add_parsers as add_rag

    add_rag(sub)

    from shoal.cli.ops import add_parsers as add_ops

    add_ops(sub)

    n = sub.add_parser("node", help="run one node of a cluster in this process")
    n.add_argument("role", choices=sorted(NODE_MAINS))
    n.add_argument("rest", nargs=argparse.REMAINDER, help="the role's own options (--dir, --bind, --etcd, ...)")
    n.set_defaults(fn=lambda a: __import__(NODE_MAINS[a.role], fromlist=["main"]).main(a.rest))

    c = sub.add_parser("calibrate", help="measure the step cost model on this device (cached per model, dtype, device)")
    c.add_argument("--model", required=True)
    c.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                   help=DTYPE_HELP)
    c.add_argument("--device", type=device_arg, default="auto", help=f"the device to calibrate: {DEVICE_HELP}")
    c.add_argument("--device-memory", type=int, default=0,
                   help="as the worker's: a worker that streams its weights has a calibration of its own")
    c.set_defaults(fn=cmd_calibrate)

    args = ap.parse_args(argv)

    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _stop_on_signals()
    try:
        return args.fn(args)
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, SIGHUP: what was started for the command is stopped
        print(f"shoal {args.cmd}: interrupted ({e or 'Ctrl-C'})", file=sys.stderr)
        return 130
    except TimeoutError as e:  # the cluster did not answer: the message names what
        print(f"shoal {args.cmd}: error: {e}", file=sys.stderr)
        return 3
    except (ShoalError, ValueError, RuntimeError, OSError) as e:  # a refusal names its problem: one shape
        print(f"shoal {args.cmd}: error: {error_message(e)}", file=sys.stderr)
        return 2


def error_message(e: Exception) -> str:
    """What the user reads of an error: a refusal that crossed the wire without its code
    (the message names the problem), anything else as it says itself."""
    return e.message if isinstance(e, ShoalError) and e.code and hasattr(e, "message") else str(e)


def _stop_on_signals() -> None:
    """SIGTERM and SIGHUP (`timeout`, a closed terminal) unwind like Ctrl-C, so a local
    cluster started for a command is stopped on the way out."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, interrupt)


if __name__ == "__main__":
    sys.exit(main())
