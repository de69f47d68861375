"""Predicting an embedding job before it runs, from the cluster's own calibration.

The encoder's terms (a per micro-batch, c per padded token) are measured by each
worker on its device at startup, on token ids of its own, and published with its
membership (`ClusterInfo`). The per-call overhead t_call of the cluster pipeline (a
SuperBatch's messages, its storage read and write, scheduling) is measured by running
two small embedding jobs of calibration texts (never the job's) that differ only in
how many one-text partitions they hold: t_call is the slope. The job's own texts are
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
    return state_dir() / "calibration" / f"embed-calls-{safe}.json"


def measure_call_overhead(client, encoder: dict, cache_key: str | None = None) -> float:
    """t_call of the cluster at `client`: from two calibration jobs (cached under
    `cache_key` if given). Their files go to a temporary folder storage must be able
    to read (the local machine for a local cluster)."""
    if cache_key and _cache(cache_key).exists():
        return json.loads(_cache(cache_key).read_text())["t_call"]
    walls = []
    with tempfile.TemporaryDirectory(prefix="shoal-calibrate-") as tmp:
        for n in CALIBRATION_PARTITIONS:
            paths = []
            for i in range(n):
                path = Path(tmp) / f"in-{n}" / f"cal-{i:03d}.jsonl"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(orjson.dumps({"id": f"c{i}", "text": f"calibration text {i}"}) + b"\n")
                paths.append(str(path))
            job = client.embed(paths, Path(tmp) / f"out-{n}", encoder, b_min=1, n_max=1,
                               job_key=f"calibrate-{time.time_ns()}-{n}")
            t = time.perf_counter()
            job.wait_until_done(poll=0.01, timeout=600)
            walls.append(time.perf_counter() - t)
    a, b = CALIBRATION_PARTITIONS
    t_call = max(0.0, (walls[1] - walls[0]) / (b - a))
    if cache_key:
        path = _cache(cache_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"t_call": t_call, "walls": walls, "partitions": list(CALIBRATION_PARTITIONS)}))
    return t_call


def predict_job(client, spec: CorpusSpec, encoder_folder: str | Path, encoder: dict, b_min: int, n_max: int,
                cache_key: str | None = None, token_budget: int = 8192) -> EmbedPrediction:
    terms = encoder_cost_terms(client.cluster_info(), encoder["fingerprint"])
    cost = EncoderCost(terms["a"], terms["c"], measure_call_overhead(client, encoder, cache_key))
    lengths = token_lengths(spec, encoder_folder, encoder["max_seq_length"])
    return predict(lengths, b_min, n_max, cost, token_budget)
