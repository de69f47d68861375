// Decode attention read straight through block tables: one query token per sequence,
// keys and values read once from the paged cache, no gathered copy.
// Parallel over (sequence, kv head); each query head of the group is scored against
// the same key row while it is in cache.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <cmath>
#include <vector>
#include <algorithm>

// Loads one cache row (all kv heads of one token) as float.
static inline void load_row(const float* src, float* dst, int64_t n) {
  std::copy(src, src + n, dst);
}
static inline void load_row(const c10::BFloat16* src, float* dst, int64_t n) {
  const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<uint32_t>(s[i]) << 16;
}

// One task per sequence: each token's row (every kv head) is read once and scored
// against all query heads, so the cache is streamed exactly once per step and layer.
template <typename T>
static void decode_attention_impl(const float* q, const T* k_cache, const T* v_cache,
                                  const int64_t* tables, const int64_t* ctx_lens, float* out,
                                  int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t max_blocks,
                                  int64_t block_size, float scale) {
  const int64_t G = H / KVH;
  const int64_t row = KVH * D;
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, buf(row), acc(H * D);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n = ctx_lens[b];
      const int64_t* table = tables + b * max_blocks;
      const float* qb = q + b * H * D;
      scores.resize(H * n);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t slot = table[t / block_size] * block_size + t % block_size;
        load_row(k_cache + slot * row, buf.data(), row);
        for (int64_t hq = 0; hq < H; ++hq) {
          const float* k = buf.data() + (hq / G) * D;
          const float* qh = qb + hq * D;
          float s = 0.f;
          for (int64_t d = 0; d < D; ++d) s += qh[d] * k[d];
          scores[hq * n + t] = s * scale;
        }
      }
      for (int64_t hq = 0; hq < H; ++hq) {
        float* sg = scores.data() + hq * n;
        const float m = *std::max_element(sg, sg + n);
        float sum = 0.f;
        for (int64_t t = 0; t < n; ++t) { sg[t] = std::exp(sg[t] - m); sum += sg[t]; }
        const float inv = 1.f / sum;
        for (int64_t t = 0; t < n; ++t) sg[t] *= inv;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t t = 0; t < n; ++t) {
        const int64_t slot = table[t / block_size] * block_size + t % block_size;
        load_row(v_cache + slot * row, buf.data(), row);
        for (int64_t hq = 0; hq < H; ++hq) {
          const float p = scores[hq * n + t];
          const float* v = buf.data() + (hq / G) * D;
          float* a = acc.data() + hq * D;
          for (int64_t d = 0; d < D; ++d) a[d] += p * v[d];
        }
      }
      std::copy(acc.begin(), acc.end(), out + b * H * D);
    }
  });
}

// q: [B, H, D] float32; k_cache, v_cache: [slots, KVH, D] (float32 or bfloat16);
// tables: [B, max_blocks] int64; ctx_lens: [B] int64. Returns [B, H, D] float32.
torch::Tensor paged_decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                                     torch::Tensor tables, torch::Tensor ctx_lens,
                                     int64_t block_size, double scale) {
  TORCH_CHECK(q.dtype() == torch::kFloat32 && q.is_contiguous(), "q must be contiguous float32");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "cache halves must be contiguous");
  TORCH_CHECK(tables.dtype() == torch::kInt64 && ctx_lens.dtype() == torch::kInt64, "tables and lengths are int64");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(), "q [B,H,D], caches [slots,KVH,D]");
  TORCH_CHECK(k_cache.dtype() == v_cache.dtype(), "k and v caches differ in dtype");
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(1);
  TORCH_CHECK(k_cache.size(2) == D && KVH > 0 && H % KVH == 0, "head shapes do not match");
  TORCH_CHECK(tables.dim() == 2 && tables.size(0) == B && ctx_lens.numel() == B, "one table and length per sequence");
  TORCH_CHECK(B == 0 || (ctx_lens.min().item<int64_t>() >= 1 &&
              ctx_lens.max().item<int64_t>() <= tables.size(1) * block_size), "context lengths out of range");
  TORCH_CHECK(tables.numel() == 0 || (tables.min().item<int64_t>() >= 0 &&
              (tables.max().item<int64_t>() + 1) * block_size <= k_cache.size(0)), "block id outside the cache");
  auto out = torch::empty_like(q);
  auto t = tables.contiguous();
  auto c = ctx_lens.contiguous();
  if (k_cache.dtype() == torch::kFloat32) {
    decode_attention_impl<float>(q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                                 t.data_ptr<int64_t>(), c.data_ptr<int64_t>(), out.data_ptr<float>(),
                                 B, H, KVH, D, t.size(1), block_size, (float)scale);
  } else if (k_cache.dtype() == torch::kBFloat16) {
    decode_attention_impl<c10::BFloat16>(q.data_ptr<float>(), k_cache.data_ptr<c10::BFloat16>(),
                                         v_cache.data_ptr<c10::BFloat16>(), t.data_ptr<int64_t>(),
                                         c.data_ptr<int64_t>(), out.data_ptr<float>(),
                                         B, H, KVH, D, t.size(1), block_size, (float)scale);
  } else {
    TORCH_CHECK(false, "unsupported cache dtype");
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode_attention", &paged_decode_attention, "decode attention over a paged KV cache");
}
