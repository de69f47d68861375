"""Which vector instruction set the native kernel is built for, from the CPU's flags."""

from shoal.nodes.worker.kernels import vector_isa

AVX2 = {"avx", "avx2", "fma", "f16c"}
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}


def test_avx512_when_every_needed_subset_is_there():
    assert vector_isa(AVX512) == "AVX512"


def test_avx2_when_avx512_is_partial_or_absent():
    assert vector_isa(AVX2) == "AVX2"
    assert vector_isa(AVX2 | {"avx512f"}) == "AVX2"  # F alone (Xeon Phi) lacks the BW/VL ops ATen uses


def test_portable_build_without_avx2_and_fma():
    assert vector_isa({"sse4_2", "avx"}) == "DEFAULT"
    assert vector_isa({"avx2"}) == "DEFAULT"
