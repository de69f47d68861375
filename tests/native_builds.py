"""The native-op builds tests run: this CPU's own and the next narrower one it can run
(AVX2 on an AVX-512 machine, the portable build on an AVX2 one), so the vector code of
both kinds of CI machine is checked wherever the suite runs."""

from shoal.nodes.worker.kernels import default_isa, native_ops

NARROWER = {"AVX512": "AVX2", "AVX2": "DEFAULT", "DEFAULT": None}


def builds() -> list[str]:
    own = default_isa()
    return [own] + ([NARROWER[own]] if NARROWER[own] else [])


def load(isa: str):
    ext = native_ops(isa)
    assert ext is not None, f"the native ops did not build for {isa}"
    return ext
