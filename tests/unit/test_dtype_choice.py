"""--dtype auto: the checkpoint's dtype where the device computes it natively."""

from __future__ import annotations

import json

from shoal.nodes.worker.dtype_choice import choose_dtype, cpu_native_bf16


def folder(tmp_path, dtype):
    d = tmp_path / (dtype or "none")
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"torch_dtype": dtype} if dtype else {}))
    return d


def test_auto_follows_checkpoint_and_cpu(tmp_path):
    avx2 = {"avx", "avx2", "fma"}
    bf16 = {"avx512f", "avx512_bf16"}
    amx = {"amx_bf16", "amx_tile"}
    assert cpu_native_bf16(avx2) is None and cpu_native_bf16(bf16) == "avx512_bf16" and cpu_native_bf16(amx) == "amx_bf16"
    b = folder(tmp_path, "bfloat16")
    assert choose_dtype("auto", b, flags=bf16).name == "bfloat16"
    assert choose_dtype("auto", b, flags=amx).name == "bfloat16"
    slow = choose_dtype("auto", b, flags=avx2)
    assert slow.name == "float32" and "neither AVX512_BF16 nor AMX" in slow.reason
    assert choose_dtype("auto", b, on_gpu=True, flags=avx2).name == "bfloat16"
    assert choose_dtype("auto", folder(tmp_path, "float16"), flags=bf16).name == "float32"
    assert choose_dtype("auto", folder(tmp_path, "float32"), flags=bf16).name == "float32"
    assert choose_dtype("auto", folder(tmp_path, None), flags=bf16).name == "float32"
    # An explicit dtype is taken as asked, whatever the CPU.
    assert choose_dtype("bfloat16", b, flags=avx2).name == "bfloat16"
    assert choose_dtype("float32", b, flags=bf16).name == "float32"
