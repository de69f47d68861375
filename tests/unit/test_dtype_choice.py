"""--dtype auto: the checkpoint's dtype where the device computes it natively; the KV
cache keeps a bf16 checkpoint's bf16 even where auto computes it in fp32."""

from __future__ import annotations

import json

import pytest

from shoal.nodes.worker.dtype_choice import choose_dtype, choose_kv_cache_dtype, cpu_native_bf16


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


def test_kv_cache_dtype(tmp_path):
    avx2, bf16 = {"avx", "avx2", "fma"}, {"avx512f", "avx512_bf16"}
    b, h, f = folder(tmp_path, "bfloat16"), folder(tmp_path, "float16"), folder(tmp_path, "float32")

    def kv(model, dtype="auto", kv_dtype="auto", flags=avx2, on_gpu=False):
        return choose_kv_cache_dtype(kv_dtype, dtype, choose_dtype(dtype, model, on_gpu=on_gpu, flags=flags), model)

    kept = kv(b)  # fp32 compute on AVX2, the checkpoint's bf16 in the cache
    assert kept.name == "bfloat16" and "under float32 compute" in kept.reason
    native = kv(b, flags=bf16)
    assert native.name == "bfloat16" and native.reason == "the compute dtype (bfloat16)"
    assert kv(b, on_gpu=True).name == "bfloat16"
    assert kv(b, dtype="float32").name == "float32"  # fp32 asked for outright: fp32 throughout
    assert kv(h).name == "float32"  # float16 checkpoints: only bf16 caches widen in the kernels
    assert kv(f).name == "float32" and kv(f, flags=bf16).name == "float32"
    asked = kv(f, kv_dtype="bfloat16")
    assert asked.name == "bfloat16" and asked.reason == "--kv-cache-dtype bfloat16"
    assert kv(b, kv_dtype="float32").name == "float32"
    with pytest.raises(ValueError, match="unknown KV cache dtype 'int8'"):
        kv(b, kv_dtype="int8")


def test_an_encoder_on_a_gpu_computes_in_float16_unless_asked(tmp_path):
    from shoal.nodes.worker.dtype_choice import choose_encoder_dtype

    f = folder(tmp_path, "float32")
    assert choose_encoder_dtype("auto", f, on_gpu=True).name == "float16"
    assert choose_encoder_dtype("float32", f, on_gpu=True).name == "float32"
    assert choose_encoder_dtype("auto", f, on_gpu=False).name == "float32"
