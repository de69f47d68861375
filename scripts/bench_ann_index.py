"""Approximate indexes against exact search: recall@10, build time, memory and queries/s,
at 1M (and, with --rows 10000000, 10M) random 384-dimension vectors.

The vectors are random with the structure embeddings have: a random linear map of
32-dimension Gaussian vectors into 384 dimensions plus noise (0.3 per coordinate against
1), normalized. Their intrinsic dimension is a few tens, as sentence embeddings' is.
(On isotropic Gaussian vectors no approximate index beats exact search: at 200k rows
ivf reaches recall@10 0.40 scanning 14% of its lists, hnsw 0.28 at ef 256.) Queries are
drawn the same way.

Each kind is written with Shoal's own index writer in 1M-row shards (as storage nodes
would hold them), loaded the way a storage node loads it (`IndexShard`), and searched in
batches of --batch queries, the way workers send them. Ground truth is Shoal's exact
search. Peers in the same run: faiss's exact `IndexFlatIP` over the same shards (what a
user would write by hand). Memory: the resident set added by loading the shards, in a
fresh process per kind. Results go to --json, and a PNG plot beside it.

    python scripts/bench_ann_index.py                         # 1M rows: exact, ivf, hnsw
    python scripts/bench_ann_index.py --rows 10000000 --kinds ivf --keep   # writes ~30 GB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CHUNK = 100_000
SHARD_ROWS = 1_000_000


def vectors(start: int, count: int, dim: int, rank: int, noise: float, seed: int) -> np.ndarray:
    """Rows [start, start+count) of the data set, the same whichever chunk asks."""
    basis = np.random.default_rng(12345).standard_normal((rank, dim)).astype(np.float32) / np.sqrt(rank)
    out = []
    for c in range(start // CHUNK, (start + count + CHUNK - 1) // CHUNK):
        rng = np.random.default_rng([seed, c])
        x = rng.standard_normal((CHUNK, rank), dtype=np.float32) @ basis
        x += noise * rng.standard_normal((CHUNK, dim), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        lo, hi = max(start, c * CHUNK) - c * CHUNK, min(start + count, (c + 1) * CHUNK) - c * CHUNK
        out.append(x[lo:hi])
    return np.concatenate(out)


def build(folder: Path, kind: str, args) -> float:
    from shoal.vector_index import ShardWriter

    shards = max(1, args.rows // SHARD_ROWS)
    t = time.perf_counter()
    w = ShardWriter(folder, args.rows, shards, "bench-encoder", args.dim, kind)
    for start in range(0, args.rows, CHUNK):
        n = min(CHUNK, args.rows - start)
        ids = [f"p{i:09d}" for i in range(start, start + n)]
        w.add(ids, [""] * n, vectors(start, n, args.dim, args.rank, args.noise, seed=0))
    w.finish()
    return time.perf_counter() - t


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(folder: str, kind: str, queries_file: str, batch: int, k: int, peer: bool) -> None:
    """Loads every shard as a storage node does, then searches: one JSON line on stdout."""
    from shoal.nodes.storage.index_shard import IndexShard
    from shoal.topk import merge
    from shoal.vector_index import read_manifest

    queries = np.load(queries_file)
    meta = read_manifest(folder)
    if kind == "exact" and meta["rows"] > 2 * SHARD_ROWS:
        return streamed_exact(folder, meta, queries, batch, k)
    before = rss()
    t = time.perf_counter()
    shards = [IndexShard(folder, s) for s in range(len(meta["shards"]))]
    load_s, memory = time.perf_counter() - t, rss() - before
    hits = []
    t = time.perf_counter()
    for b in range(0, len(queries), batch):
        q = queries[b:b + batch]
        per = [s.search(q, k) for s in shards]
        hits += [[h["id"] for h in merge([p[i] for p in per], k)] for i in range(len(q))]
    search_s = time.perf_counter() - t
    out = {"kind": kind, "load_s": load_s, "memory_bytes": memory, "qps": len(queries) / search_s, "hits": hits,
           "ann": meta["shards"][0].get("ann")}
    if peer:  # faiss's exact search over the same vectors, the same batches
        import faiss

        flats = []
        for s in shards:
            index = faiss.IndexFlatIP(meta["dim"])
            index.add(s.vectors)
            flats.append(index)
        t = time.perf_counter()
        for b in range(0, len(queries), batch):
            for index in flats:
                index.search(queries[b:b + batch], k)
        out["faiss_flat_qps"] = len(queries) / (time.perf_counter() - t)
    print(json.dumps(out), flush=True)


def streamed_exact(folder: str, meta: dict, queries: np.ndarray, batch: int, k: int) -> None:
    """Exact search past one machine's memory (three times the vectors' size per shard):
    one shard loaded at a time. Memory is one shard's; queries/s is over every shard,
    searched in turn, their loading left out."""
    import gc

    from shoal.nodes.storage.index_shard import IndexShard
    from shoal.topk import merge

    per_query: list[list] = [[] for _ in queries]
    search_s, memory = 0.0, 0
    for s in range(len(meta["shards"])):
        before = rss()
        shard = IndexShard(folder, s)
        memory = max(memory, rss() - before)
        t = time.perf_counter()
        for b in range(0, len(queries), batch):
            for i, hits in enumerate(shard.search(queries[b:b + batch], k)):
                per_query[b + i].append(hits)
        search_s += time.perf_counter() - t
        del shard
        gc.collect()
    hits = [[h["id"] for h in merge(p, k)] for p in per_query]
    print(json.dumps({"kind": "exact", "load_s": None, "memory_bytes": memory, "qps": len(queries) / search_s,
                      "hits": hits, "ann": None, "note": "shard by shard: memory is one shard's"}), flush=True)


def plot(results: list[dict], path: Path) -> None:
    from plots import pyplot

    plt = pyplot()
    if plt is None:
        print(f"(no plot: pip install matplotlib, then run again for {path})")
        return
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for r in results:
        ax.scatter(r["recall"], r["qps"], s=40)
        ax.annotate(f"{r['kind']} ({r['rows'] / 1e6:g}M)", (r["recall"], r["qps"]), textcoords="offset points",
                    xytext=(6, 4), fontsize=8)
        if r.get("faiss_flat_qps"):
            ax.scatter(1.0, r["faiss_flat_qps"], marker="x", color="gray")
            ax.annotate(f"faiss flat ({r['rows'] / 1e6:g}M)", (1.0, r["faiss_flat_qps"]), textcoords="offset points",
                        xytext=(-80, -12), fontsize=8, color="gray")
    ax.set_xlabel("recall@10 against exact search")
    ax.set_ylabel("queries/s (one storage process)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--kinds", default="exact,ivf,hnsw")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--rank", type=int, default=32, help="intrinsic dimension of the vectors")
    ap.add_argument("--noise", type=float, default=0.3)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=64, help="queries per search call")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--dir", default=".bench/ann", help="where the indexes are written")
    ap.add_argument("--keep", action="store_true", help="keep the indexes (default: each is deleted after its run)")
    ap.add_argument("--json", default=".bench/ann/results.json")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        folder, kind, qfile, batch, peer = args.child
        return child(folder, kind, qfile, int(batch), args.k, peer == "1")

    import shutil

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_generate import cpu_summary

    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    qfile = root / "queries.npy"
    np.save(qfile, vectors(0, args.queries, args.dim, args.rank, args.noise, seed=1))
    kinds = args.kinds.split(",")
    print(f"{args.rows} vectors of dimension {args.dim} (intrinsic {args.rank}), {args.queries} queries in batches of "
          f"{args.batch}; {cpu_summary()}", flush=True)
    results, truth = [], None
    for kind in (["exact"] if "exact" in kinds else []) + [k for k in kinds if k != "exact"]:
        folder = root / f"{kind}-{args.rows}"
        build_s = build(folder, kind, args)
        disk = sum(f.stat().st_size for f in folder.iterdir() if f.suffix in (".faiss", ".safetensors")
                   and (kind == "exact") == (f.suffix == ".safetensors"))
        peer = kind == "exact" and args.rows <= 2 * SHARD_ROWS
        line = subprocess.run([sys.executable, __file__, "--child", str(folder), kind, str(qfile), str(args.batch),
                               "1" if peer else "0", "--k", str(args.k)],
                              capture_output=True, text=True, check=True).stdout.splitlines()[-1]
        r = json.loads(line)
        if kind == "exact":
            truth = r["hits"]
        recall = float(np.mean([len(set(a) & set(b)) / args.k for a, b in zip(r.pop("hits"), truth)])) if truth else None
        r.update(rows=args.rows, build_s=build_s, disk_bytes=disk, recall=recall)
        results.append(r)
        print(f"{kind:>6}: recall@{args.k} {recall if recall is None else f'{recall:.4f}'}  build {build_s:7.1f} s  "
              f"memory {r['memory_bytes'] / 2**30:5.2f} GiB  index on disk {disk / 2**30:5.2f} GiB  "
              f"{r['qps']:8.0f} queries/s  search defaults {r['ann']}"
              + (f"  (faiss IndexFlatIP: {r['faiss_flat_qps']:.0f} queries/s)" if r.get("faiss_flat_qps") else ""),
              flush=True)
        if not args.keep:
            shutil.rmtree(folder)
    exact = next((r for r in results if r["kind"] == "exact"), None)
    if exact:
        for r in results:
            if r["kind"] != "exact":
                print(f"{r['kind']}: {r['qps'] / exact['qps']:.1f}x Shoal's exact search"
                      + (f", {r['qps'] / exact['faiss_flat_qps']:.1f}x faiss IndexFlatIP" if exact.get("faiss_flat_qps")
                         else ""), flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "cpu": cpu_summary(), "results": results}, indent=2))
    plot(results, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
