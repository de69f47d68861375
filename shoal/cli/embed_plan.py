"""Predicting an embedding job before it runs, from the cluster's own calibration.

The encoder's terms (a per micro-batch, c per padded token) are measured by each
worker on its device at startup, on token ids of its own, and published with its
membership (`ClusterInfo`). The per-call overhead t_call of the cluster pipeline (a
SuperBatch's messages, its storage read and write, scheduling) and the share of the
device the encoder gets inside the pipeline are measured by small embedding jobs of
calibration texts (never the job's); see `calibrate_pipeline`. The job's own texts are
only tokenized here (no encoder), to know their lengths.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import orjson

from shoal.corpus_reader import CorpusReport, CorpusSpec, corpus_rows
from shoal.scheduler.embed_prediction import EmbedPrediction, EncoderCost, predict
from shoal.scheduler.superbatch import DEFAULT_TOKEN_BUDGET

CALIBRATION_PARTITIONS = (8, 56)


def token_lengths(spec: CorpusSpec, encoder_folder: str | Path, max_length: int) -> dict[str, list[int]]:
    """partition -> token length of each text (truncated as the workers truncate)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(encoder_folder) / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=max_length)
    out: dict[str, list[int]] = {}
    if not spec.partition_by:
        for p in spec.inputs:
            out.setdefault(Path(p).stem, [])
    batch: list[tuple[str, str]] = []

    def flush():
        for (part, _), enc in zip(batch, tok.encode_batch([t for _, t in batch])):
            out.setdefault(part, []).append(len(enc.ids))
        batch.clear()

    for part, _, text in corpus_rows(CorpusSpec(spec.inputs, spec.partition_by, spec.text_field, spec.id_field, "skip"),
                                     CorpusReport()):
        batch.append((part, text))
        if len(batch) >= 4096:
            flush()
    flush()
    return out


def encoder_cost_terms(members: list[dict], fingerprint: str) -> dict:
    """The published cost terms of a worker hosting the encoder (the slowest if several)."""
    costs = [m["info"]["encoder_cost"] for m in members
             if m["role"] == "worker" and m["info"].get("encoder") == fingerprint and m["info"].get("encoder_cost")]
    if not costs:
        raise RuntimeError(f"no worker of the cluster hosts encoder {fingerprint} with a calibration")
    return max(costs, key=lambda c: c["c"])


def _cache(key: str) -> Path:
    from shoal.env import state_dir

    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in key)
    return state_dir() / "calibration" / f"embed-pipeline-v4-{safe}.json"


def _calibration_texts(encoder_folder: str | Path, n: int, seed: int = 7) -> list[str]:
    """Texts of the calibration's own: words of the encoder's vocabulary, log-normal lengths."""
    import random

    vocab = json.loads((Path(encoder_folder) / "tokenizer.json").read_text())["model"]["vocab"]
    words = sorted(w for w in vocab if w.isalpha() and w.isascii() and len(w) > 1)
    r = random.Random(seed)
    return [" ".join(r.choice(words) for _ in range(min(120, max(3, int(r.lognormvariate(3.0, 0.6))))))
            for _ in range(n)]


def _run(client, encoder: dict, folder: Path, partitions: list[list[str]], b_min: int) -> float:
    """Seconds from acceptance to done of a calibration job over `partitions`."""
    paths = []
    for i, texts in enumerate(partitions):
        path = folder / "in" / f"cal-{i:03d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(orjson.dumps({"id": f"c{i}-{k}", "text": t}) + b"\n" for k, t in enumerate(texts)))
        paths.append(str(path))
    job = client.embed(paths, folder / "out", encoder, b_min=b_min, n_max=max(1, b_min),
                       job_key=f"calibrate-{time.time_ns()}")
    t = time.perf_counter()
    job.wait_until_done(poll=0.01, timeout=600)
    return time.perf_counter() - t


CALIBRATION_SUPERBATCH = 192  # texts in each calibration SuperBatch
CALIBRATION_SUPERBATCHES = (2, 5)  # SuperBatches in the two jobs whose difference is timed


def calibrate_pipeline(client, encoder_folder: str | Path, encoder: dict, terms: dict,
                       cache_key: str | None = None, token_budget: int = DEFAULT_TOKEN_BUDGET) -> EncoderCost:
    """The encoder's terms as the cluster's pipeline delivers them, from calibration jobs
    of texts of its own (cached under `cache_key`; their files go to a temporary folder
    storage must be able to read: this machine, for a local cluster):

    - t_call: two jobs of one-text partitions that differ only in how many they hold;
      the slope is the time per call.
    - efficiency: two jobs of 2 and 5 SuperBatches of 192 calibration texts, their time
      difference against what the worker's own calibration (a, c) predicts for it: the share of the device the encoder gets beside the rest of the pipeline
      (tokenizing, Arrow, Parquet writes, the other nodes on the same host), applied to
      a and c."""
    if cache_key and _cache(cache_key).exists():
        rec = json.loads(_cache(cache_key).read_text())
        return EncoderCost(terms["a"] * rec["efficiency"], terms["c"] * rec["efficiency"], rec["t_call"])
    size, (few_sb, many_sb) = CALIBRATION_SUPERBATCH, CALIBRATION_SUPERBATCHES
    texts = _calibration_texts(encoder_folder, 512 + size * (few_sb + many_sb))
    warm, rest = texts[:512], texts[512:]
    parts_a = [rest[k * size:(k + 1) * size] for k in range(few_sb)]
    parts_b = [rest[(few_sb + k) * size:(few_sb + k + 1) * size] for k in range(many_sb)]
    with tempfile.TemporaryDirectory(prefix="shoal-calibrate-") as tmp:
        few, many = (_run(client, encoder, Path(tmp) / f"calls-{n}", [[f"calibration text {i}"] for i in range(n)], 1)
                     for n in CALIBRATION_PARTITIONS)
        # Torch prepares each new micro-batch shape once: a first pass over these shapes
        # is not timed, as the many SuperBatches of a real job do not pay it either.
        _run(client, encoder, Path(tmp) / "warm-up", [warm], len(warm))
        short, long = (_run(client, encoder, Path(tmp) / f"superbatches-{len(p)}", p, size) for p in (parts_a, parts_b))
    t_call = max(0.0, (many - few) / (CALIBRATION_PARTITIONS[1] - CALIBRATION_PARTITIONS[0]))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(encoder_folder) / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=encoder["max_seq_length"])
    isolated = EncoderCost(terms["a"], terms["c"], 0.0)
    predicted = [sum(isolated.encode([len(e.ids) for e in tok.encode_batch(t)], token_budget) for t in parts)
                 for parts in (parts_a, parts_b)]
    # The slope between jobs of few and many SuperBatches of one size: the steady state
    # of the pipeline (the next SuperBatch read and tokenized while one encodes), without
    # what every job pays once (its first read, its last write, scheduling).
    slope = (long - short) / (predicted[1] - predicted[0]) if predicted[1] > predicted[0] else 1.0
    efficiency = max(1.0, slope)
    if cache_key:
        path = _cache(cache_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"t_call": t_call, "efficiency": efficiency, "walls": [few, many, short, long],
                                    "predicted": predicted}))
    return EncoderCost(terms["a"] * efficiency, terms["c"] * efficiency, t_call)


def predict_job(client, spec: CorpusSpec, encoder_folder: str | Path, encoder: dict, b_min: int, n_max: int,
                cache_key: str | None = None, token_budget: int | None = None) -> EmbedPrediction:
    """`token_budget`: the workers' micro-batch size as they publish it unless given."""
    terms = encoder_cost_terms(client.cluster_info(), encoder["fingerprint"])
    token_budget = token_budget or terms.get("token_budget", DEFAULT_TOKEN_BUDGET)
    if cache_key:  # the efficiency is measured against predictions cut at this budget, on this device
        cache_key = f"{cache_key}-{terms.get('device', '')}-b{token_budget}"
    cost = calibrate_pipeline(client, encoder_folder, encoder, terms, cache_key, token_budget)
    lengths = token_lengths(spec, encoder_folder, encoder["max_seq_length"])
    return predict(lengths, b_min, n_max, cost, token_budget)
