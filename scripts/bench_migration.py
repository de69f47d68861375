"""What moving one sequence costs, by its length: shipping its KV vs re-prefilling.

Two engines of the W1 model in this process stand for the source and the target
worker. For each length L, a sequence with an L-token prompt generates a few tokens on
the source, then moves:
  ship:      export with KV + send the blob over loopback TCP (ZeroMQ, 4 MiB chunks,
             as the mover sends it) + import + the target's next step;
  re-prefill: export without KV + import + the target's next step (which prefills
             L tokens again).
Also printed: what the rule of `scheduler/kv_transfer.py` decides from this device's
calibration, and where it would switch for GPU-like parameters (H200 prefill, Llama-3-8B KV)
on a 10 Gb/s and a 100 Gb/s link.

    python scripts/bench_migration.py --lengths 128,512,1024,2048
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path


def loopback_send_s(blob: bytes, chunk: int = 4 << 20) -> float:
    """Seconds to push `blob` through a loopback TCP socket pair in chunks, acked."""
    import zmq

    ctx = zmq.Context.instance()
    rx, tx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    port = rx.bind_to_random_port("tcp://127.0.0.1")
    tx.connect(f"tcp://127.0.0.1:{port}")
    parts = [blob[i:i + chunk] for i in range(0, len(blob), chunk)]

    def receive():
        for _ in parts:
            rx.recv(copy=False)
            rx.send(b"ack")

    t = threading.Thread(target=receive)
    t.start()
    start = time.perf_counter()
    for p in parts:
        tx.send(p, copy=False)
        tx.recv()
    took = time.perf_counter() - start
    t.join()
    rx.close(0)
    tx.close(0)
    return took


def source_and_target(model: str, dtype: str):
    """Two engines of `model` (made with the `small` preset if missing) standing for the
    source and the target worker; the source's calibration; the moved sequences' settings."""
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine
    from shoal.sampling import SamplingParams

    if not Path(model, "config.json").exists():
        from shoal.nodes.worker.models.make_model import make_model

        make_model(model, preset="small", dtype="bfloat16")
    src = LLMEngine(model, EngineConfig(dtype=dtype, policy="ebplus"))
    dst = LLMEngine(model, EngineConfig(dtype=dtype, policy="mb"))
    cost = src.cost_model
    print(f"model {model} ({dtype}); calibration: "
          + (f"α_p {cost.alpha_p * 1e3:.1f} ms, β_p {cost.beta_p * 1e6:.0f} µs/token" if cost else "none"))
    return src, dst, cost, SamplingParams(max_tokens=64, ignore_eos=True)


def measure_move(src, dst, L: int, params, repeats: int, send_blob, r, tag: str) -> tuple[list, list, list, int]:
    """Moves of an L-token sequence from engine `src` to `dst`, `repeats` times each way:
    shipped (export with KV, `send_blob(kv)` seconds, import, the target's next step) and
    re-prefilled (export without KV, import, the next step prefilling L tokens again).
    Returns the ship times, the send times, the re-prefill times and the KV's bytes."""
    ship, send, redo, size = [], [], [], 0
    for k in range(repeats):
        for with_kv in (True, False):
            sid = f"{tag}-{k}-{with_kv}"
            src.add_request(sid, prompt_token_ids=[r.randrange(31999) for _ in range(L)], params=params)
            while not src.seqs[sid].output_token_ids or len(src.seqs[sid].output_token_ids) < 4:
                src.step()
            t = time.perf_counter()
            state = src.export_sequence(sid, remove=True)
            if not with_kv:
                state.kv, state.num_computed = None, 0
            moved = time.perf_counter() - t
            if with_kv:
                size = len(state.kv)
                s = send_blob(state.kv)
                send.append(s)
                moved += s
            t = time.perf_counter()
            dst.import_sequence(state)
            before = len(dst.seqs[sid].output_token_ids)
            while len(dst.seqs[sid].output_token_ids) == before:
                dst.step()
            moved += time.perf_counter() - t
            (ship if with_kv else redo).append(moved)
            dst.abort(sid)
    return ship, send, redo, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=".bench/model-small")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--lengths", default="128,512,1024,2048")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import random
    import statistics

    from shoal.scheduler.cost_model import CostModel
    from shoal.scheduler.kv_transfer import decide_kv

    src, dst, cost, params = source_and_target(args.model, args.dtype)
    r = random.Random(0)
    print(f"{'L':>6} {'KV MB':>7} {'ship ms':>9} {'(send)':>8} {'re-prefill ms':>14} {'ratio':>6}  rule says")
    for n, L in enumerate(int(x) for x in args.lengths.split(",")):
        ship, send, redo, size = measure_move(src, dst, L, params, args.repeats, loopback_send_s, r, f"m{n}")
        s_ms, r_ms = 1e3 * statistics.median(ship), 1e3 * statistics.median(redo)
        verdict = decide_kv(size, L, 2e9, cost).describe() if cost else "no calibration: ship"
        print(f"{L:>6} {size / 1e6:>7.1f} {s_ms:>9.1f} {1e3 * statistics.median(send):>8.1f} {r_ms:>14.1f} "
              f"{r_ms / s_ms:>5.1f}x  {verdict} (at 2 GB/s)")
    h200 = CostModel(8e-3, 2e-5, 0.01, 1e-4, 2e-5, 0.0, 0.0)
    per_token = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, bf16: a Llama-3-8B token
    for gbps in (10, 100):
        bw = gbps * 1e9 / 8
        grid = range(16, 32769, 16)
        ships = [L for L in grid if decide_kv(per_token * L, L, bw, h200).ship]
        if len(ships) == len(grid):
            rule = "ship at every length up to 32k tokens"
        elif not ships:
            rule = "re-prefill at every length"
        else:
            rule = f"ship up to {max(ships)} tokens, re-prefill beyond" if ships[0] == grid[0] \
                else f"re-prefill below {ships[0]} tokens, ship from there"
        print(f"GPU-like (H200 prefill α_p 8 ms, β_p 20 µs/token; 8B KV {per_token // 1024} KiB/token), "
              f"{gbps} Gb/s link: {rule}")


if __name__ == "__main__":
    main()
