// The elementwise work of a decoder layer, fused: each op reads its input once and
// writes its output once, where the torch formulation runs 8-15 small ops per call (each
// a pass over memory plus a dispatch) — at a decode step's 128 tokens the dispatches
// alone cost more than the arithmetic.
//
// Numerics follow the torch/Hugging Face formulation op by op: every intermediate that
// torch keeps in the model's dtype is rounded to it here too (`rnd`), so a bf16 model
// gives the same values as the reference path up to summation order, and fp32 is exact.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <cstring>
#include <vector>

namespace {

using Vec = at::vec::Vectorized<float>;
constexpr int64_t VS = Vec::size();

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }

// Round to nearest even, branch-free so that loops over it vectorize (inputs are finite).
template <typename T> inline T from_float(float x);
template <> inline float from_float<float>(float x) { return x; }
template <> inline c10::BFloat16 from_float<c10::BFloat16>(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return c10::BFloat16(static_cast<uint16_t>(u >> 16), c10::BFloat16::from_bits());
}
// The value `x` has once torch stores it in T.
template <typename T> inline float rnd(float x) { return to_float(from_float<T>(x)); }

inline float sum_squares(const float* h, int64_t n) {
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + VS <= n; i += VS) {
    const Vec v = Vec::loadu(h + i);
    acc = at::vec::fmadd(v, v, acc);
  }
  float buf[VS];
  acc.store(buf);
  float s = 0.f;
  for (int64_t j = 0; j < VS; ++j) s += buf[j];
  for (; i < n; ++i) s += h[i] * h[i];
  return s;
}

// out = w * rnd(h / rms(h)), as Hugging Face's RMSNorm: normalize in fp32, cast, scale.
template <typename T>
inline void norm_row(const float* h, const T* w, T* out, int64_t n, float eps) {
  const float inv = 1.f / std::sqrt(sum_squares(h, n) / n + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<T>(to_float(w[i]) * rnd<T>(h[i] * inv));
}

template <typename T>
void rms_norm_impl(const T* x, T* residual, const T* w, T* out, int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> h(n);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * n;
      if (residual) {  // the residual stream becomes x + residual, rounded as torch's add
        T* rr = residual + r * n;
        for (int64_t i = 0; i < n; ++i) {
          const T s = from_float<T>(to_float(xr[i]) + to_float(rr[i]));
          rr[i] = s;
          h[i] = to_float(s);
        }
      } else {
        for (int64_t i = 0; i < n; ++i) h[i] = to_float(xr[i]);
      }
      norm_row(h.data(), w, out + r * n, n, eps);
    }
  });
}

// One head of one token: optional RMSNorm over the head, then rotate-half RoPE:
// rnd(rnd(x * cos) + rnd(rotate_half(x) * sin)), with cos and sin rounded to T first.
template <typename T>
inline void norm_rope_head(const T* src, const T* norm_w, const float* cos, const float* sin, int64_t D, float eps,
                           float* x, T* normed, float* dst) {
  if (norm_w) {
    for (int64_t d = 0; d < D; ++d) x[d] = to_float(src[d]);
    norm_row(x, norm_w, normed, D, eps);
    for (int64_t d = 0; d < D; ++d) x[d] = to_float(normed[d]);
  } else {
    for (int64_t d = 0; d < D; ++d) x[d] = to_float(src[d]);
  }
  const int64_t half = D / 2;
  for (int64_t d = 0; d < D; ++d) {
    const float rot = d < half ? -x[d + half] : x[d - half];
    dst[d] = rnd<T>(rnd<T>(x[d] * rnd<T>(cos[d])) + rnd<T>(rot * rnd<T>(sin[d])));
  }
}

template <typename T>
void qkv_rope_impl(const T* qkv, const T* q_norm, const T* k_norm, const float* cos, const float* sin,
                   const int64_t* positions, const int64_t* slots, T* k_cache, T* v_cache, float* q_out,
                   int64_t rows, int64_t H, int64_t KVH, int64_t D, float eps) {
  const int64_t width = (H + 2 * KVH) * D;
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> x(D), k(D);
    std::vector<T> normed(D);
    for (int64_t r = begin; r < end; ++r) {
      const T* row = qkv + r * width;
      const float* c = cos + positions[r] * D;
      const float* s = sin + positions[r] * D;
      for (int64_t h = 0; h < H; ++h)
        norm_rope_head(row + h * D, q_norm, c, s, D, eps, x.data(), normed.data(), q_out + (r * H + h) * D);
      T* kd = k_cache + slots[r] * KVH * D;
      T* vd = v_cache + slots[r] * KVH * D;
      for (int64_t h = 0; h < KVH; ++h) {
        norm_rope_head(row + (H + h) * D, k_norm, c, s, D, eps, x.data(), normed.data(), k.data());
        for (int64_t d = 0; d < D; ++d) kd[h * D + d] = from_float<T>(k[d]);  // exact: k is T-valued
      }
      std::memcpy(vd, row + (H + KVH) * D, KVH * D * sizeof(T));
    }
  });
}

// silu(gate) * up over [rows, 2 * I] -> [rows, I]: torch computes silu as
// x / (1 + exp(-x)) in fp32 and stores it in T before the product.
template <typename T>
void silu_mul_impl(const T* gate_up, T* out, int64_t rows, int64_t I) {
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> g(I);
    for (int64_t r = begin; r < end; ++r) {
      const T* gr = gate_up + r * 2 * I;
      const T* ur = gr + I;
      for (int64_t i = 0; i < I; ++i) g[i] = to_float(gr[i]);
      int64_t i = 0;
      for (; i + VS <= I; i += VS) {
        const Vec v = Vec::loadu(g.data() + i);
        (v / (Vec(1.f) + v.neg().exp())).store(g.data() + i);
      }
      for (; i < I; ++i) g[i] = g[i] / (1.f + std::exp(-g[i]));
      T* o = out + r * I;
      for (int64_t j = 0; j < I; ++j) o[j] = from_float<T>(rnd<T>(g[j]) * to_float(ur[j]));
    }
  });
}

void check_model_tensor(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_contiguous() && (t.dtype() == torch::kFloat32 || t.dtype() == torch::kBFloat16),
              name, " must be contiguous float32 or bfloat16");
}

}  // namespace

// x: [rows, n]; residual: [rows, n] (updated in place to x + residual) or empty;
// weight: [n]. Returns the normalized rows in x's dtype.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor residual, torch::Tensor weight, double eps) {
  check_model_tensor(x, "x");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && weight.size(0) == x.size(1) && weight.dtype() == x.dtype() &&
              weight.is_contiguous(), "rms_norm: x [rows, n] and weight [n] of one dtype");
  const bool has_res = residual.numel() > 0;
  if (has_res)
    TORCH_CHECK(residual.sizes() == x.sizes() && residual.dtype() == x.dtype() && residual.is_contiguous(),
                "rms_norm: residual must be like x");
  auto out = torch::empty_like(x);
  if (x.dtype() == torch::kFloat32) {
    rms_norm_impl<float>(x.data_ptr<float>(), has_res ? residual.data_ptr<float>() : nullptr,
                         weight.data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1), (float)eps);
  } else {
    using B = c10::BFloat16;
    rms_norm_impl<B>(x.data_ptr<B>(), has_res ? residual.data_ptr<B>() : nullptr, weight.data_ptr<B>(),
                     out.data_ptr<B>(), x.size(0), x.size(1), (float)eps);
  }
  return out;
}

// qkv: [rows, (H + 2 KVH) D], the fused projection; q_norm, k_norm: [D] or empty (no
// qk-norm); cos, sin: fp32 tables [positions, D]; positions, slots: [rows] int64. Writes
// each row's key and value into the cache halves ([slots, KVH, D], qkv's dtype) at its
// slot; returns the rotated queries as fp32 [rows, H, D] for the attention kernel.
torch::Tensor qkv_rope_cache(torch::Tensor qkv, torch::Tensor q_norm, torch::Tensor k_norm, torch::Tensor cos,
                             torch::Tensor sin, torch::Tensor positions, torch::Tensor slots, torch::Tensor k_cache,
                             torch::Tensor v_cache, int64_t H, int64_t KVH, double eps) {
  check_model_tensor(qkv, "qkv");
  TORCH_CHECK(qkv.dim() == 2 && H > 0 && KVH > 0 && qkv.size(1) % (H + 2 * KVH) == 0, "qkv: [rows, (H + 2 KVH) D]");
  const int64_t rows = qkv.size(0), D = qkv.size(1) / (H + 2 * KVH);
  const bool norm = q_norm.numel() > 0;
  if (norm)
    TORCH_CHECK(q_norm.numel() == D && k_norm.numel() == D && q_norm.dtype() == qkv.dtype() &&
                k_norm.dtype() == qkv.dtype() && q_norm.is_contiguous() && k_norm.is_contiguous(),
                "q_norm and k_norm: [head_dim] in qkv's dtype");
  TORCH_CHECK(cos.dtype() == torch::kFloat32 && sin.sizes() == cos.sizes() && cos.dim() == 2 && cos.size(1) == D &&
              cos.is_contiguous() && sin.is_contiguous(), "cos, sin: fp32 [positions, head_dim]");
  TORCH_CHECK(positions.dtype() == torch::kInt64 && slots.dtype() == torch::kInt64 && positions.numel() == rows &&
              slots.numel() == rows && positions.is_contiguous() && slots.is_contiguous(), "positions, slots: [rows] int64");
  TORCH_CHECK(k_cache.dtype() == qkv.dtype() && v_cache.dtype() == qkv.dtype() && k_cache.is_contiguous() &&
              v_cache.is_contiguous() && k_cache.dim() == 3 && k_cache.size(1) == KVH && k_cache.size(2) == D &&
              v_cache.sizes() == k_cache.sizes(), "cache halves: [slots, KVH, D] in qkv's dtype");
  if (rows) {
    TORCH_CHECK(positions.min().item<int64_t>() >= 0 && positions.max().item<int64_t>() < cos.size(0), "position outside the rotary table");
    TORCH_CHECK(slots.min().item<int64_t>() >= 0 && slots.max().item<int64_t>() < k_cache.size(0), "slot outside the cache");
  }
  auto q = torch::empty({rows, H, D}, qkv.options().dtype(torch::kFloat32));
  if (qkv.dtype() == torch::kFloat32) {
    qkv_rope_impl<float>(qkv.data_ptr<float>(), norm ? q_norm.data_ptr<float>() : nullptr,
                         norm ? k_norm.data_ptr<float>() : nullptr, cos.data_ptr<float>(), sin.data_ptr<float>(),
                         positions.data_ptr<int64_t>(), slots.data_ptr<int64_t>(), k_cache.data_ptr<float>(),
                         v_cache.data_ptr<float>(), q.data_ptr<float>(), rows, H, KVH, D, (float)eps);
  } else {
    using B = c10::BFloat16;
    qkv_rope_impl<B>(qkv.data_ptr<B>(), norm ? q_norm.data_ptr<B>() : nullptr, norm ? k_norm.data_ptr<B>() : nullptr,
                     cos.data_ptr<float>(), sin.data_ptr<float>(), positions.data_ptr<int64_t>(),
                     slots.data_ptr<int64_t>(), k_cache.data_ptr<B>(), v_cache.data_ptr<B>(), q.data_ptr<float>(),
                     rows, H, KVH, D, (float)eps);
  }
  return q;
}

// gate_up: [rows, 2 I] (gate, then up) -> silu(gate) * up: [rows, I].
torch::Tensor silu_mul(torch::Tensor gate_up) {
  check_model_tensor(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "gate_up: [rows, 2 I]");
  const int64_t rows = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = torch::empty({rows, I}, gate_up.options());
  if (gate_up.dtype() == torch::kFloat32) {
    silu_mul_impl<float>(gate_up.data_ptr<float>(), out.data_ptr<float>(), rows, I);
  } else {
    using B = c10::BFloat16;
    silu_mul_impl<B>(gate_up.data_ptr<B>(), out.data_ptr<B>(), rows, I);
  }
  return out;
}
