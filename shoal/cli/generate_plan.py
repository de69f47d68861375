"""`shoal generate --dry-run` and `--predict`: the job's time from the workers' calibration
(`scheduler/generation_prediction.py`), each item's prompt tokenized here, once."""

from __future__ import annotations

from shoal.protocol.errors import ShoalError
from shoal.scheduler.generation_prediction import GenerationPrediction, WorkerShape, predict_generation


class NoPrediction(ShoalError):
    """The cluster cannot be predicted for; the message says why."""


def worker_shapes(members: list[dict]) -> list[WorkerShape]:
    workers = [m for m in members if m.get("role") == "worker" and (m.get("info") or {}).get("max_seqs")]
    if not workers:
        raise NoPrediction("no worker with a decoder in the cluster")
    shapes = []
    for m in workers:
        try:
            shapes.append(WorkerShape.from_info(m["info"]))
        except KeyError as e:
            raise NoPrediction(f"worker {m.get('node_id')} publishes no {e.args[0]} (an older worker, or a policy run "
                               "without one: `shoal calibrate` measures it)") from None
    return shapes


def item_lengths(records: list[dict], job, model_dir: str) -> tuple[list[tuple[int, int]], list[int], bool]:
    """(prompt tokens, output tokens) per sequence (n per item), each item's n, and
    whether any output length is only a bound (a sequence that may end before its
    max_tokens)."""
    from shoal.nodes.worker.tokenizer import TextTokenizer

    tokenizer = None
    lengths, per_item, bound = [], [], False
    for rec in records:
        settings = job.resolve(rec)
        if rec.get("prompt_token_ids") is not None:
            prompt = len(rec["prompt_token_ids"])
        else:
            tokenizer = tokenizer or TextTokenizer(model_dir)
            prompt = len(tokenizer.encode_chat(rec["messages"]) if rec.get("messages") is not None
                         else tokenizer.encode(rec["prompt"]))
        sampling = settings.sampling
        bound |= not sampling.ignore_eos
        lengths += [(prompt, sampling.max_tokens)] * settings.n
        per_item.append(settings.n)
    return lengths, per_item, bound


def predict_items(client, records: list[dict], job, model_dir: str) -> GenerationPrediction:
    import logging

    shapes = worker_shapes(client.cluster_info())
    lengths, per_item, bound = item_lengths(records, job, model_dir)
    quiet = logging.getLogger("shoal.scheduler")  # the simulated planners' mode switches are not news
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        return predict_generation(lengths, shapes, upper_bound=bound, per_item=per_item)
    finally:
        quiet.setLevel(level)
