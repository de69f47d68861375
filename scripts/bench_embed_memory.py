"""W2 memory: each node's peak RSS stays flat from N to 10·N texts.

A tiny random-weight encoder of MiniLM's architecture (hidden 32, 2 layers, MiniLM's
tokenizer) keeps the run fast, so N can be large enough that buffering the corpus
anywhere would show. For each N a fresh local cluster embeds W2 texts in 1,000
partitions; before it stops, each node's peak RSS (VmHWM) is read from /proc. Also
reported: the pipeline's own high-water counters and the time to first output.

    python scripts/bench_embed_memory.py --texts 200000 2000000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from bench_embed import minilm, run_job  # noqa: E402
from workloads import vocabulary_words, w2_partition_sizes, w2_texts, write_w2_corpus  # noqa: E402

import shoal  # noqa: E402
from shoal.transport.rpc import RpcClient  # noqa: E402


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--texts", type=int, nargs="+", default=[200_000, 2_000_000])
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--b-min", type=int, default=4096)
    ap.add_argument("--n-max", type=int, default=4096)
    args = ap.parse_args()
    from shoal.nodes.worker.models.make_encoder import make_encoder

    tmp = Path(tempfile.mkdtemp(prefix="bench-embed-mem-"))
    enc = str(make_encoder(tmp / "tiny-encoder", minilm(), hidden=32))
    words = vocabulary_words(enc)
    rows = {}
    for n in args.texts:
        t = time.perf_counter()
        paths = write_w2_corpus(tmp / f"in-{n}", w2_texts(words, n, seed=n),
                                w2_partition_sizes(n, args.partitions, 1.72, seed=2))
        print(f"{n} texts written in {time.perf_counter() - t:.0f}s", flush=True)
        with shoal.LocalCluster(encoder=enc, workers=1, state_dir=tmp / f"c-{n}") as c:
            wall, first = run_job(shoal.Client(c.router), paths, tmp / f"out-{n}", enc, args.b_min, args.n_max)
            hw = RpcClient(c.nodes["worker-0"][2]).request("StatsQuery", {}, timeout=10)["stats"]["superbatches"]["highwater"]
            rss = {name: peak_rss_mb(proc.pid) for name, (proc, _, _) in c.nodes.items()}
        rows[n] = rss
        print(f"{n} texts: {wall:.0f}s ({n / wall:.0f} texts/s), first output after {first:.1f}s; worker high water: "
              f"{hw['texts_buffered']} texts, {hw['superbatches_held']} SuperBatches; peak RSS MB: "
              + ", ".join(f"{k} {v:.0f}" for k, v in sorted(rss.items())), flush=True)
    lo, hi = rows[args.texts[0]], rows[args.texts[-1]]
    growth = {k: hi[k] - lo[k] for k in lo}
    print(f"peak RSS growth from {args.texts[0]} to {args.texts[-1]} texts (MB): "
          + ", ".join(f"{k} {v:+.1f}" for k, v in sorted(growth.items()))
          + f"; largest {max(growth.values()):+.1f} MB (target < 50)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
