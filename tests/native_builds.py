"""The native-op builds tests run: this CPU's own and the next narrower one it can run
(AVX2 on an AVX-512 machine, the portable build on an AVX2 one), and where the CPU lacks
AVX-512 or AVX512_BF16 the AVX-512 build too, through SIMDe's emulation of its
intrinsics (no AMX), so the vector code of every kind of CI machine is checked wherever
the suite runs."""

from shoal.nodes.worker.dtype_choice import cpu_flags
from shoal.nodes.worker.kernels import EMULATED_AVX512, default_isa, emulation_available, native_ops

NARROWER = {"AVX512": "AVX2", "AVX2": "DEFAULT", "DEFAULT": None}


def builds() -> list[str]:
    own = default_isa()
    # The emulation runs on AVX2 (SIMDe builds each 512-bit op from two 256-bit ones); an
    # AVX-512 CPU without AVX512_BF16 (Skylake to Ice Lake) takes it for the bf16 kernels.
    lacks = own == "AVX2" or (own == "AVX512" and "avx512_bf16" not in cpu_flags())
    emulated = [EMULATED_AVX512] if lacks and emulation_available() else []
    return [own] + ([NARROWER[own]] if NARROWER.get(own) else []) + emulated


def load(isa: str):
    ext = native_ops(isa)
    assert ext is not None, f"the native ops did not build for {isa}"
    return ext
