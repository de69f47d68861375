"""How many sequences a step may hold when none is set: 1,024 on a GPU of 70 GiB or
more, 256 elsewhere; a value set is kept; the engine's resolved config says which."""

from __future__ import annotations

from shoal.nodes.worker.device_choice import choose_device
from shoal.nodes.worker.engine_setup import default_max_seqs

GiB = 2**30


def test_the_default_follows_the_device():
    gpu = choose_device("cuda", cuda_count=1)
    assert default_max_seqs(gpu, total_bytes=80 * GiB)[0] == 1024  # an H100
    assert default_max_seqs(gpu, total_bytes=141 * GiB)[0] == 1024  # an H200
    n, why = default_max_seqs(gpu, total_bytes=24 * GiB)  # an L4
    assert n == 256 and "24 GiB" in why
    assert default_max_seqs(choose_device("cpu", cuda_count=0))[0] == 256
    n, why = default_max_seqs(gpu, total_bytes=80 * GiB, share=2)  # two workers on one H100
    assert n == 256 and "shared by 2 workers" in why


def test_the_engine_resolves_it(tiny_model):
    from shoal.nodes.worker.engine import EngineConfig, LLMEngine

    assert LLMEngine(tiny_model, EngineConfig(device="cpu")).config.max_num_seqs == 256
    assert LLMEngine(tiny_model, EngineConfig(device="cpu", max_num_seqs=12)).config.max_num_seqs == 12
