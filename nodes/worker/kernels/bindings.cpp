// The Python module of Shoal's native CPU ops (built by kernels/__init__.py).
#include <torch/extension.h>

// paged_attention.cpp
void paged_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor tables,
                     torch::Tensor rows, torch::Tensor lens, torch::Tensor ctx, int64_t block_size, double scale,
                     torch::Tensor out);
bool supports_head_dim(int64_t D);
int64_t vector_width();
void set_bf16_dots(bool on);
bool bf16_dots_available(int64_t D);
void set_amx(bool on);
bool amx_available(int64_t D);
// fused_ops.cpp
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps);
torch::Tensor qkv_rope_cache(torch::Tensor qkv, torch::Tensor q_norm, torch::Tensor k_norm, torch::Tensor cos,
                             torch::Tensor sin, torch::Tensor positions, torch::Tensor slots, torch::Tensor k_cache,
                             torch::Tensor v_cache, int64_t H, int64_t KVH, double eps);
torch::Tensor silu_mul(torch::Tensor gate_up);
// row_top2.cpp
std::tuple<torch::Tensor, torch::Tensor> row_top2(torch::Tensor logits);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention, "attention over a paged KV cache, for decode rows and prefill chunks");
  m.def("supports_head_dim", &supports_head_dim, "whether this build computes a head dim");
  m.def("vector_width", &vector_width, "floats per vector in this build");
  m.def("set_bf16_dots", &set_bf16_dots, "let a bf16 cache use the bf16 dot-product kernels (default on)");
  m.def("bf16_dots_available", &bf16_dots_available, "whether a bf16 cache of this head dim uses bf16 dot products here");
  m.def("set_amx", &set_amx, "let prefill tiles of a bf16 cache use AMX where the CPU has it (default on)");
  m.def("amx_available", &amx_available, "whether prefill tiles of a bf16 cache of this head dim use AMX here");
  m.def("rms_norm", &rms_norm, "RMSNorm, optionally after adding the residual stream (updated in place)");
  m.def("qkv_rope_cache", &qkv_rope_cache, "qk-norm and RoPE of a fused qkv projection; K and V into the cache");
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
  m.def("row_top2", &row_top2, "each row's argmax (first on ties) and its margin over the second largest value");
}
