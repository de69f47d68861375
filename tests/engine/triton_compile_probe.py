"""Compiles the engine's Triton kernels for named GPUs, without one: a child process of
`test_triton_gpu_compile.py`, because a test process may have Triton's interpreter on
(`TRITON_INTERPRET=1` is read when a kernel is decorated, and an interpreted kernel
cannot be compiled). Reads a JSON list of jobs on stdin, prints a JSON list of results.

A job: {"kind": "attention", "cap": 90, "dtype": "bf16", "group": 2, "dim": 128,
"max_len": 512} -> {"tried": [[block_m, block_n, shared bytes, machine code?], ...]}, the
launcher's tiles in order up to the first that fits the target's shared memory; or
{"kind": "fused", "cap": 90, "dtype": "bf16"} -> {"kernels": [[name, shared, machine
code?], ...]}. A job whose compile raises gives {"error": "..."}.

Every pointer and integer argument is declared divisible by 16, as the runtime declares
them for the engine's tensors (aligned allocations, sizes and strides in multiples of
16): without those hints Triton neither vectorizes nor pipelines the loads, and the
shared memory it reports is up to 2.5x too small.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

assert os.environ.get("TRITON_INTERPRET", "0") != "1", "run without Triton's interpreter"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from shoal.nodes.worker.kernels import triton_attention, triton_fused_ops  # noqa: E402

SHARED_LIMIT = {90: 232448, 89: 101376, 80: 166912}  # bytes a block may opt in to
TRITON_TYPE = {"bf16": "*bf16", "fp32": "*fp32"}
# Integer arguments not always multiples of 16 in the engine's launches (a block table's
# width, a configurable block size); the rest are, for the shapes compiled here.
UNALIGNED = {"block_size", "stride_tb"}


def compile_for(fn, cap: int, types: dict[str, str], constants: dict):
    """`fn` compiled for compute capability `cap`: every argument typed by `types` or, for
    the rest, an i32 (sizes and strides) or a constexpr from `constants`."""
    sig = {name: "constexpr" if name in constants else types.get(name, "i32") for name in fn.arg_names}
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
               if name not in constants and sig[name] != "fp32" and name not in UNALIGNED}
    return triton.compile(ASTSource(fn, sig, constexprs=constants, attrs=aligned), target=GPUTarget("cuda", cap, 32))


def attention(cap: int, dtype: str, group: int, dim: int, max_len: int) -> dict:
    types = {n: TRITON_TYPE[dtype] for n in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")}
    types.update({n: "*i64" for n in ("table_ptr", "rows_ptr", "lens_ptr", "ctx_ptr")})  # the runner's int64 tensors
    types["scale"] = "fp32"
    g_pad = triton.next_power_of_2(group)
    tried = []
    for block_m, block_n in triton_attention.tile_candidates(triton_attention.tile_rows(max_len, group), 64, g_pad):
        kernel = compile_for(triton_attention._paged_attention_kernel, cap, types, dict(
            G=group, G_PAD=g_pad, D=dim, D_PAD=max(16, triton.next_power_of_2(dim)), BLOCK_M=block_m,
            BLOCK_N=block_n, IEEE=dtype == "fp32", WIDEN=False))
        tried.append([block_m, block_n, kernel.metadata.shared, bool(kernel.asm.get("cubin"))])
        if kernel.metadata.shared <= SHARED_LIMIT[cap]:
            break
    return {"tried": tried}


def fused(cap: int, dtype: str) -> dict:
    ptr = TRITON_TYPE[dtype]
    hidden, inter, heads, kv_heads, dim = 2048, 6144, 16, 8, 128  # the qwen3-1.7b preset
    kernels = {
        "rms_norm": compile_for(triton_fused_ops._rms_norm_kernel, cap,
                                {"x_ptr": ptr, "res_ptr": ptr, "w_ptr": ptr, "out_ptr": ptr, "eps": "fp32"},
                                dict(HAS_RES=True, BLOCK=triton.next_power_of_2(hidden))),
        "silu_mul": compile_for(triton_fused_ops._silu_mul_kernel, cap, {"gu_ptr": ptr, "out_ptr": ptr},
                                dict(BLOCK=min(1024, triton.next_power_of_2(inter)))),
        "qkv_rope_cache": compile_for(
            triton_fused_ops._qkv_rope_cache_kernel, cap,
            {"qkv_ptr": ptr, "norm_ptr": ptr, "cos_ptr": "*fp32", "sin_ptr": "*fp32", "pos_ptr": "*i64",
             "slot_ptr": "*i64", "kc_ptr": ptr, "vc_ptr": ptr, "q_ptr": ptr, "eps": "fp32"},
            dict(H=heads, KVH=kv_heads, D=dim, NORM=True)),
    }
    return {"kernels": [[name, k.metadata.shared, bool(k.asm.get("cubin"))] for name, k in kernels.items()]}


def run(job: dict) -> dict:
    args = {k: v for k, v in job.items() if k != "kind"}
    try:
        return attention(**args) if job["kind"] == "attention" else fused(**args)
    except Exception as e:  # the test names the job and the compiler's complaint
        return {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}


if __name__ == "__main__":
    print(json.dumps([run(job) for job in json.load(sys.stdin)]))
