"""The profiled step that sizes a GPU's KV cache (`gpu_memory.size_on_gpu`), run on the
CPU: torch's CUDA memory calls answer from given figures, so the step itself (its
sequences, block tables, model forward and sampling) runs as it will on a GPU, and the
sizing takes the figures it is given."""

from __future__ import annotations

import torch

from shoal.nodes.worker import gpu_memory, sampling_launch
from shoal.nodes.worker.ops_backend import TorchOps
from shoal.sampling import MAX_LOGPROBS

GiB = 2**30


def test_the_profiled_step_runs_and_sizes_the_cache(tiny_model, monkeypatch):
    from shoal.nodes.worker.models.loader import load_decoder

    model, _ = load_decoder(tiny_model, "float32")
    launched, calls = [], []
    real = sampling_launch.launch_sampling
    monkeypatch.setattr(sampling_launch, "launch_sampling", lambda *a: launched.append(real(*a)) or launched[-1])
    for name in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, name=name: calls.append(name))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: 1 * GiB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: 4 * GiB)  # the step's peak: 3 GiB more
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (70 * GiB, 80 * GiB))
    size, why = gpu_memory.size_on_gpu(model, torch.float32, TorchOps(), tokens=256, rows=8, block_size=16,
                                       utilization=0.9)
    # One row per sequence, through the engine's sampling launch, every row asking for
    # every figure: what a job asking all of them at once allocates is what was measured.
    assert len(launched) == 1 and len(launched[0].seqs) == 8
    got = launched[0].figures()
    assert launched[0].rows["logprob_rows"] == list(range(8)) and len(got["lp_values"][0]) == MAX_LOGPROBS
    assert len(got["margins"]) == 8 and launched[0].rows["sampled_rows"] == list(range(8)) and len(got["lo"]) == 8
    p = launched[0].seqs[0].params
    assert p.penalized and p.logit_bias and p.min_tokens and not p.greedy
    assert calls.count("reset_peak_memory_stats") == 1 and "empty_cache" in calls
    assert size == int(80 * GiB * 0.9) - 10 * GiB - 3 * GiB and "--gpu-memory-utilization" in why
    # Decode graphs keep their logits between steps: the cache leaves room for them.
    from shoal.nodes.worker.decode_graphs import graph_output_bytes, graph_sizes

    kept = graph_output_bytes(model, 64)
    # One fp32 logits buffer of the largest size (64 rows), which every size writes.
    assert kept == graph_sizes(64)[-1] * model.cfg.vocab_size * 4 == 64 * model.cfg.vocab_size * 4
    with_graphs, why = gpu_memory.size_on_gpu(model, torch.float32, TorchOps(), tokens=256, rows=8, block_size=16,
                                              utilization=0.9, graph_bytes=kept)
    assert with_graphs == size - kept and "decode graphs" in why
