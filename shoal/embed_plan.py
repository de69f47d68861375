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
    return state_dir() / "calibration" / f"embed-pipeline-{safe}.json"


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


CALIBRATION_TEXTS = 384


def calibrate_pipeline(client, encoder_folder: str | Path, encoder: dict, terms: dict,
                       cache_key: str | None = None, token_budget: int = DEFAULT_TOKEN_BUDGET) -> EncoderCost:
    """The encoder's terms as the cluster's pipeline delivers them, from calibration jobs
    of texts of its own (cached under `cache_key`; their files go to a temporary folder
    storage must be able to read: this machine, for a local cluster):

    - t_call: two jobs of one-text partitions that differ only in how many they hold;
      the slope is the time per call.
    - efficiency: one SuperBatch of calibration texts, measured against what the
      worker's own calibration (a, c) predicts for it: the share of the device the
      encoder gets beside the rest of the pipeline (tokenizing, Arrow, Parquet writes,
      the other nodes on the same host), applied to a and c."""
    if cache_key and _cache(cache_key).exists():
        rec = json.loads(_cache(cache_key).read_text())
        return EncoderCost(terms["a"] * rec["efficiency"], terms["c"] * rec["efficiency"], rec["t_call"])
    texts = _calibration_texts(encoder_folder, CALIBRATION_TEXTS)
    with tempfile.TemporaryDirectory(prefix="shoal-calibrate-") as tmp:
        few, many = (_run(client, encoder, Path(tmp) / f"calls-{n}", [[f"calibration text {i}"] for i in range(n)], 1)
                     for n in CALIBRATION_PARTITIONS)
        one_superbatch = _run(client, encoder, Path(tmp) / "superbatch", [texts], len(texts))
    t_call = max(0.0, (many - few) / (CALIBRATION_PARTITIONS[1] - CALIBRATION_PARTITIONS[0]))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(encoder_folder) / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=encoder["max_seq_length"])
    lengths = [len(e.ids) for e in tok.encode_batch(texts)]
    isolated = EncoderCost(terms["a"], terms["c"], 0.0).encode(lengths, token_budget)
    efficiency = max(1.0, (one_superbatch - t_call) / isolated) if isolated > 0 else 1.0
    if cache_key:
        path = _cache(cache_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"t_call": t_call, "efficiency": efficiency, "walls": [few, many, one_superbatch]}))
    return EncoderCost(terms["a"] * efficiency, terms["c"] * efficiency, t_call)


def predict_job(client, spec: CorpusSpec, encoder_folder: str | Path, encoder: dict, b_min: int, n_max: int,
                cache_key: str | None = None, token_budget: int = DEFAULT_TOKEN_BUDGET) -> EmbedPrediction:
    terms = encoder_cost_terms(client.cluster_info(), encoder["fingerprint"])
    cost = calibrate_pipeline(client, encoder_folder, encoder, terms, cache_key, token_budget)
    lengths = token_lengths(spec, encoder_folder, encoder["max_seq_length"])
    return predict(lengths, b_min, n_max, cost, token_budget)
