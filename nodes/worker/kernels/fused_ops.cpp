// The elementwise work of a decoder layer, fused: each op reads its input once and
// writes its output once, where the torch formulation runs 8-15 small ops per call (each
// a pass over memory plus a dispatch) — at a decode step's 128 tokens the dispatches
// alone cost more than the arithmetic.
//
// Numerics follow the torch/Hugging Face formulation op by op: every intermediate that
// torch keeps in the model's dtype is rounded to it here too (`rnd`), so a bf16 model
// gives the same values as the reference path up to summation order, and fp32 is exact.
#include <ATen/core/Tensor.h>  // not torch/extension.h: a tenth of the compile time
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <cstring>
#include <type_traits>
#include <vector>

#include "softmax_exp2.h"
#include "vec_io.h"

namespace {

using shoal::Vec;
using shoal::VS;
using shoal::hsum;
using shoal::load_vec;
using shoal::store_vec;
using shoal::rnd_vec;
using shoal::to_float;
using shoal::from_float;
using shoal::rnd;

// out = w * rnd(h / rms(h)), as Hugging Face's RMSNorm: normalize in fp32, cast, scale.
template <typename T>
inline void norm_row(const float* h, float sum_sq, const T* w, T* out, int64_t n, float eps) {
  const float inv = 1.f / std::sqrt(sum_sq / n + eps);
  const Vec vinv(inv);
  int64_t i = 0;
  for (; i + VS <= n; i += VS)
    store_vec(out + i, rnd_vec<T>(load_vec(w + i) * rnd_vec<T>(Vec::loadu(h + i) * vinv)));
  for (; i < n; ++i) out[i] = from_float<T>(to_float(w[i]) * rnd<T>(h[i] * inv));
}

// h = the row as fp32 (after the residual add, when there is one); returns sum(h²).
template <typename T>
inline float load_row(const T* x, T* residual, float* h, int64_t n) {
  Vec acc(0.f);
  float tail = 0.f;
  int64_t i = 0;
  if (residual) {  // the residual stream becomes x + residual, rounded as torch's add
    for (; i + VS <= n; i += VS) {
      const Vec s = rnd_vec<T>(load_vec(x + i) + load_vec(residual + i));
      store_vec(residual + i, s);
      s.store(h + i);
      acc = at::vec::fmadd(s, s, acc);
    }
    for (; i < n; ++i) {
      const T s = from_float<T>(to_float(x[i]) + to_float(residual[i]));
      residual[i] = s;
      h[i] = to_float(s);
      tail += h[i] * h[i];
    }
  } else {
    for (; i + VS <= n; i += VS) {
      const Vec v = load_vec(x + i);
      v.store(h + i);
      acc = at::vec::fmadd(v, v, acc);
    }
    for (; i < n; ++i) {
      h[i] = to_float(x[i]);
      tail += h[i] * h[i];
    }
  }
  return hsum(acc) + tail;
}

template <typename T>
void rms_norm_impl(const T* x, T* residual, const T* w, T* out, int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> h(n);
    for (int64_t r = begin; r < end; ++r) {
      const float ss = load_row(x + r * n, residual ? residual + r * n : nullptr, h.data(), n);
      norm_row(h.data(), ss, w, out + r * n, n, eps);
    }
  });
}

// A value row into the cache: copied as it is, or rounded to nearest even into a bf16
// cache under an fp32 model (`dtype_choice.choose_kv_cache_dtype`), or widened.
template <typename T, typename C>
inline void copy_row(const T* src, C* dst, int64_t n) {
  if constexpr (std::is_same_v<T, C>) {
    std::memcpy(dst, src, n * sizeof(T));
  } else {
    int64_t i = 0;
    for (; i + VS <= n; i += VS) store_vec(dst + i, load_vec(src + i));
    for (; i < n; ++i) dst[i] = from_float<C>(to_float(src[i]));
  }
}

// One head of one token: optional RMSNorm over the head, then rotate-half RoPE:
// rnd(rnd(x * cos) + rnd(rotate_half(x) * sin)); cos and sin come rounded to T. The
// results are T values, so writing them to T rows (queries, the cache) is exact. This
// is the element-by-element form, for heads whose halves are not whole vectors; the
// others take norm_rope_head_vec below.
template <typename T, typename O>
inline void norm_rope_head(const T* src, const T* norm_w, const float* cos, const float* sin, int64_t D, float eps,
                           float* x, T* normed, O* dst) {
  if (norm_w) {
    const float ss = load_row<T>(src, nullptr, x, D);
    norm_row(x, ss, norm_w, normed, D, eps);
    load_row<T>(normed, nullptr, x, D);
  } else {
    load_row<T>(src, nullptr, x, D);
  }
  const int64_t half = D / 2;
  for (int64_t d = 0; d < D; ++d) {
    const float rot = d < half ? -x[d + half] : x[d - half];
    dst[d] = from_float<O>(rnd<T>(rnd<T>(x[d] * cos[d]) + rnd<T>(rot * sin[d])));
  }
}

// The same for a head of NV whole vectors (NV even: each half whole vectors), in
// registers, written straight to its row (the queries' or the cache's). A head is 4
// vectors at W1's head dim; through scratch rows, with a scalar loop for the cache's copy
// and the queries written as fp32, the op ran at 11 GB/s (2,048 rows of W1's shape: 1.17
// ms a layer; 0.91 ms this way, bit-identical).
template <typename T, int NV, typename O>
inline void norm_rope_head_vec(const T* src, const T* norm_w, const Vec* c, const Vec* s, float eps, O* dst) {
  static_assert(NV % 2 == 0, "rotate-half takes whole vectors from each half");
  constexpr int HV = NV / 2;
  Vec x[NV];
  for (int i = 0; i < NV; ++i) x[i] = load_vec(src + i * VS);
  if (norm_w) {  // as norm_row: sum of squares lane-wise, then across lanes
    Vec acc(0.f);
    for (int i = 0; i < NV; ++i) acc = at::vec::fmadd(x[i], x[i], acc);
    const Vec inv(1.f / std::sqrt(hsum(acc) / (NV * VS) + eps));
    for (int i = 0; i < NV; ++i) x[i] = rnd_vec<T>(load_vec(norm_w + i * VS) * rnd_vec<T>(x[i] * inv));
  }
  for (int i = 0; i < HV; ++i) {
    const Vec lo = x[i], hi = x[HV + i];
    store_vec(dst + i * VS, rnd_vec<T>(rnd_vec<T>(lo * c[i]) + rnd_vec<T>(hi.neg() * s[i])));
    store_vec(dst + (HV + i) * VS, rnd_vec<T>(rnd_vec<T>(hi * c[HV + i]) + rnd_vec<T>(lo * s[HV + i])));
  }
}

template <typename T, int NV, typename C>
void qkv_rope_rows_vec(const T* qkv, const T* q_norm, const T* k_norm, const float* cos, const float* sin,
                       const int64_t* positions, const int64_t* slots, C* k_cache, C* v_cache, T* q_out,
                       int64_t rows, int64_t H, int64_t KVH, float eps) {
  constexpr int64_t D = NV * VS;
  const int64_t width = (H + 2 * KVH) * D;
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* row = qkv + r * width;
      Vec c[NV], s[NV];  // the step's tables, cast to T as torch casts them
      for (int i = 0; i < NV; ++i) {
        c[i] = rnd_vec<T>(Vec::loadu(cos + positions[r] * D + i * VS));
        s[i] = rnd_vec<T>(Vec::loadu(sin + positions[r] * D + i * VS));
      }
      for (int64_t h = 0; h < H; ++h)
        norm_rope_head_vec<T, NV>(row + h * D, q_norm, c, s, eps, q_out + (r * H + h) * D);
      C* kd = k_cache + slots[r] * KVH * D;
      for (int64_t h = 0; h < KVH; ++h) norm_rope_head_vec<T, NV>(row + (H + h) * D, k_norm, c, s, eps, kd + h * D);
      copy_row(row + (H + KVH) * D, v_cache + slots[r] * KVH * D, KVH * D);
    }
  });
}

template <typename T, typename C>
void qkv_rope_impl(const T* qkv, const T* q_norm, const T* k_norm, const float* cos, const float* sin,
                   const int64_t* positions, const int64_t* slots, C* k_cache, C* v_cache, T* q_out,
                   int64_t rows, int64_t H, int64_t KVH, int64_t D, float eps) {
  // The even vector counts among the head dims paged attention computes.
  switch (D % VS == 0 ? D / VS : 0) {
#define SHOAL_CASE(nv) \
  case nv: return qkv_rope_rows_vec<T, nv, C>(qkv, q_norm, k_norm, cos, sin, positions, slots, k_cache, v_cache, q_out, rows, H, KVH, eps);
    SHOAL_CASE(2) SHOAL_CASE(4) SHOAL_CASE(6) SHOAL_CASE(8) SHOAL_CASE(10) SHOAL_CASE(12) SHOAL_CASE(16) SHOAL_CASE(32)
#undef SHOAL_CASE
    default: break;  // other head dims: element by element, through scratch rows
  }
  const int64_t width = (H + 2 * KVH) * D;
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> x(D), c(D), s(D);
    std::vector<T> normed(D);
    for (int64_t r = begin; r < end; ++r) {
      const T* row = qkv + r * width;
      for (int64_t d = 0; d < D; ++d) {  // the step's tables, cast to T as torch casts them
        c[d] = rnd<T>(cos[positions[r] * D + d]);
        s[d] = rnd<T>(sin[positions[r] * D + d]);
      }
      for (int64_t h = 0; h < H; ++h)
        norm_rope_head(row + h * D, q_norm, c.data(), s.data(), D, eps, x.data(), normed.data(),
                       q_out + (r * H + h) * D);
      C* kd = k_cache + slots[r] * KVH * D;
      C* vd = v_cache + slots[r] * KVH * D;
      for (int64_t h = 0; h < KVH; ++h)
        norm_rope_head(row + (H + h) * D, k_norm, c.data(), s.data(), D, eps, x.data(), normed.data(), kd + h * D);
      copy_row(row + (H + KVH) * D, vd, KVH * D);
    }
  });
}

// exp(-g) for a bf16 model's silu, whose result is rounded to bf16 next. On AVX-512 it is
// 2^(-g log2 e) by softmax_exp2.h's degree-5 polynomial (relative error 2.2e-7; outputs
// identical to torch's on 4.4M random inputs): 9-14% off this op on a 2-core Xeon
// (interleaved: 2,048 rows of 2 x 2,048, 3.24 -> 2.95 ms; 128 rows, 0.170 -> 0.147 ms),
// which the exponential bounds. t is capped at 126 so that 2^t stays finite: g < -87
// gives g / 2^126, a bf16 number ~1e-36, where torch's overflowed exp gives -0.
inline Vec neg_exp_for_bf16(const Vec& g) {
#if defined(CPU_CAPABILITY_AVX512)
  return Vec(shoal::exp2_poly<5>(_mm512_min_ps(_mm512_mul_ps(g, _mm512_set1_ps(-shoal::LOG2E)), _mm512_set1_ps(126.f))));
#else
  // ATen's inline polynomial (a few fp32 ulp, gone in the bf16 rounding that follows:
  // identical outputs on 4M random inputs), 7% off Sleef's exp here.
  return g.neg().exp_u20();
#endif
}

// silu(gate) * up over [rows, 2 * I] -> [rows, I]: torch computes silu as
// x / (1 + exp(-x)) in fp32 and stores it in T before the product.
template <typename T>
void silu_mul_impl(const T* gate_up, T* out, int64_t rows, int64_t I) {
  at::parallel_for(0, rows, 8, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* gr = gate_up + r * 2 * I;
      const T* ur = gr + I;
      T* o = out + r * I;
      int64_t i = 0;
      for (; i + VS <= I; i += VS) {
        // fp32 keeps Sleef's exp, as torch computes it.
        const Vec g = load_vec(gr + i);
        const Vec e = std::is_same_v<T, float> ? g.neg().exp() : neg_exp_for_bf16(g);
        const Vec act = rnd_vec<T>(g / (Vec(1.f) + e));
        store_vec(o + i, rnd_vec<T>(act * load_vec(ur + i)));
      }
      for (; i < I; ++i) {
        const float g = to_float(gr[i]);
        o[i] = from_float<T>(rnd<T>(g / (1.f + std::exp(-g))) * to_float(ur[i]));
      }
    }
  });
}

void check_model_tensor(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_contiguous() && (t.dtype() == at::kFloat || t.dtype() == at::kBFloat16),
              name, " must be contiguous float32 or bfloat16");
}

}  // namespace

// x: [rows, n]; residual: [rows, n] (updated in place to x + residual) or empty;
// weight: [n]. Returns the normalized rows in x's dtype.
at::Tensor rms_norm(at::Tensor x, at::Tensor residual, at::Tensor weight, double eps) {
  check_model_tensor(x, "x");
  TORCH_CHECK(x.dim() == 2 && weight.dim() == 1 && weight.size(0) == x.size(1) && weight.dtype() == x.dtype() &&
              weight.is_contiguous(), "rms_norm: x [rows, n] and weight [n] of one dtype");
  const bool has_res = residual.numel() > 0;
  if (has_res)
    TORCH_CHECK(residual.sizes() == x.sizes() && residual.dtype() == x.dtype() && residual.is_contiguous(),
                "rms_norm: residual must be like x");
  auto out = at::empty_like(x);
  if (x.dtype() == at::kFloat) {
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
// each row's key and value into the cache halves ([slots, KVH, D], fp32 or bf16: rounded
// to it) at its slot; returns the rotated queries [rows, H, D] in qkv's dtype for the attention kernel.
at::Tensor qkv_rope_cache(at::Tensor qkv, at::Tensor q_norm, at::Tensor k_norm, at::Tensor cos, at::Tensor sin,
                          at::Tensor positions, at::Tensor slots, at::Tensor k_cache, at::Tensor v_cache, int64_t H,
                          int64_t KVH, double eps) {
  check_model_tensor(qkv, "qkv");
  TORCH_CHECK(qkv.dim() == 2 && H > 0 && KVH > 0 && qkv.size(1) % (H + 2 * KVH) == 0, "qkv: [rows, (H + 2 KVH) D]");
  const int64_t rows = qkv.size(0), D = qkv.size(1) / (H + 2 * KVH);
  const bool norm = q_norm.numel() > 0;
  if (norm)
    TORCH_CHECK(q_norm.numel() == D && k_norm.numel() == D && q_norm.dtype() == qkv.dtype() &&
                k_norm.dtype() == qkv.dtype() && q_norm.is_contiguous() && k_norm.is_contiguous(),
                "q_norm and k_norm: [head_dim] in qkv's dtype");
  TORCH_CHECK(cos.dtype() == at::kFloat && sin.sizes() == cos.sizes() && cos.dim() == 2 && cos.size(1) == D &&
              cos.is_contiguous() && sin.is_contiguous(), "cos, sin: fp32 [positions, head_dim]");
  TORCH_CHECK(positions.dtype() == at::kLong && slots.dtype() == at::kLong && positions.numel() == rows &&
              slots.numel() == rows && positions.is_contiguous() && slots.is_contiguous(), "positions, slots: [rows] int64");
  TORCH_CHECK((k_cache.dtype() == at::kFloat || k_cache.dtype() == at::kBFloat16) && v_cache.dtype() == k_cache.dtype() &&
              k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 3 && k_cache.size(1) == KVH &&
              k_cache.size(2) == D && v_cache.sizes() == k_cache.sizes(),
              "cache halves: [slots, KVH, D], both float32 or both bfloat16");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(pos[r] >= 0 && pos[r] < cos.size(0), "position outside the rotary table");
    TORCH_CHECK(slot[r] >= 0 && slot[r] < k_cache.size(0), "slot outside the cache");
  }
  auto q = at::empty({rows, H, D}, qkv.options());
  using B = c10::BFloat16;
  const bool bf16_cache = k_cache.dtype() == at::kBFloat16;
  // One call per (model, cache) dtype pair; `cache` only carries the cache's type.
  const auto run = [&](auto* qkv_p, auto* cache) {
    using T = std::remove_pointer_t<decltype(qkv_p)>;
    using C = std::remove_pointer_t<decltype(cache)>;
    qkv_rope_impl<T, C>(qkv_p, norm ? q_norm.data_ptr<T>() : nullptr, norm ? k_norm.data_ptr<T>() : nullptr,
                        cos.data_ptr<float>(), sin.data_ptr<float>(), pos, slot, k_cache.data_ptr<C>(),
                        v_cache.data_ptr<C>(), q.data_ptr<T>(), rows, H, KVH, D, (float)eps);
  };
  if (qkv.dtype() == at::kFloat)
    bf16_cache ? run(qkv.data_ptr<float>(), (B*)nullptr) : run(qkv.data_ptr<float>(), (float*)nullptr);
  else
    bf16_cache ? run(qkv.data_ptr<B>(), (B*)nullptr) : run(qkv.data_ptr<B>(), (float*)nullptr);
  return q;
}

// gate_up: [rows, 2 I] (gate, then up) -> silu(gate) * up: [rows, I].
at::Tensor silu_mul(at::Tensor gate_up) {
  check_model_tensor(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "gate_up: [rows, 2 I]");
  const int64_t rows = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = at::empty({rows, I}, gate_up.options());
  if (gate_up.dtype() == at::kFloat) {
    silu_mul_impl<float>(gate_up.data_ptr<float>(), out.data_ptr<float>(), rows, I);
  } else {
    using B = c10::BFloat16;
    silu_mul_impl<B>(gate_up.data_ptr<B>(), out.data_ptr<B>(), rows, I);
  }
  return out;
}
