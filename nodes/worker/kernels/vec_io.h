// Vector loads and stores of fp32 or bf16 rows as fp32 vectors (ATen's Vectorized<float>,
// built for the CPU capability kernels/__init__.py chose). A bf16 load widens in
// registers; a bf16 store rounds to nearest even, as torch's conversion does (inputs are
// finite). Shared by the attention kernels and the fused ops, with the task loop and the
// tile write-out both attention kernels use.
#pragma once
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional_base.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <atomic>
#include <cstring>

namespace shoal {

// Runs `run(task)` for tasks [0, n) on torch's threads, each thread taking the next task
// when it finishes one: tasks differ in cost (a causal chunk's later rows see more keys).
template <typename F>
void dynamic_for(int64_t n, const F& run) {
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w)
      for (int64_t t = next.fetch_add(1); t < n; t = next.fetch_add(1)) run(t);
  });
}

// Where attention writes its output, out [T, H, D]: fp32, or the model's bf16, which the
// o projection then takes as it is (an fp32 output cost a conversion pass over it, 1.8% of
// a W3-shaped prefill step). A bf16 element is rounded to nearest even, as torch's
// .to(bfloat16) rounds: the outputs are the fp32 ones, rounded.
struct OutRows {
  float* f = nullptr;
  c10::BFloat16* b = nullptr;
  OutRows at(int64_t offset) const { return {f ? f + offset : nullptr, b ? b + offset : nullptr}; }
  void set(int64_t i, float v) const {
    if (f)
      f[i] = v;
    else
      b[i] = c10::BFloat16(v);
  }
};

using Vec = at::vec::Vectorized<float>;
constexpr int VS = Vec::size();

inline Vec load_vec(const float* p) { return Vec::loadu(p); }
inline Vec load_vec(const c10::BFloat16* p) {
#if defined(CPU_CAPABILITY_AVX512)
  __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return Vec(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16)));
#elif defined(CPU_CAPABILITY_AVX2)
  __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return Vec(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16)));
#else
  float buf[VS];
  for (int i = 0; i < VS; ++i) buf[i] = static_cast<float>(p[i]);
  return Vec::loadu(buf);
#endif
}

// The bf16 bits of each lane, rounded to nearest even, in the low half of 32-bit lanes.
#if defined(CPU_CAPABILITY_AVX512)
inline __m512i bf16_bits(const Vec& v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
}
#elif defined(CPU_CAPABILITY_AVX2)
inline __m256i bf16_bits(const Vec& v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
}
#endif

inline void store_vec(float* p, const Vec& v) { v.store(p); }
inline void store_vec(c10::BFloat16* p, const Vec& v) {
#if defined(CPU_CAPABILITY_AVX512)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bf16_bits(v)));
#elif defined(CPU_CAPABILITY_AVX2)
  const __m256i b = bf16_bits(v);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1)));
#else
  float buf[VS];
  v.store(buf);
  for (int i = 0; i < VS; ++i) p[i] = c10::BFloat16(buf[i]);
#endif
}

// A finished attention tile: row-head r * G + g of `acc` (D floats each, D a multiple of
// VS) divided by its softmax sum `l`, to query row first_row + r, head h * G + g, of out
// [T, H, D].
template <typename O>
inline void write_tile_rows(const float* acc, const float* l, O* out, int64_t first_row, int64_t R, int64_t H,
                            int64_t h, int64_t G, int64_t D) {
  for (int64_t r = 0; r < R; ++r)
    for (int64_t g = 0; g < G; ++g) {
      const int64_t rh = r * G + g;
      const Vec inv(1.f / l[rh]);
      O* dst = out + ((first_row + r) * H + h * G + g) * D;
      for (int64_t d = 0; d < D; d += VS) store_vec(dst + d, Vec::loadu(acc + rh * D + d) * inv);
    }
}
inline void write_tile_rows(const float* acc, const float* l, OutRows out, int64_t first_row, int64_t R, int64_t H,
                            int64_t h, int64_t G, int64_t D) {
  if (out.f)
    write_tile_rows(acc, l, out.f, first_row, R, H, h, G, D);
  else
    write_tile_rows(acc, l, out.b, first_row, R, H, h, G, D);
}

// The value each lane has once torch stores it in T.
template <typename T> inline Vec rnd_vec(const Vec& v);
template <> inline Vec rnd_vec<float>(const Vec& v) { return v; }
template <> inline Vec rnd_vec<c10::BFloat16>(const Vec& v) {
#if defined(CPU_CAPABILITY_AVX512)
  return Vec(_mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits(v), 16)));
#elif defined(CPU_CAPABILITY_AVX2)
  return Vec(_mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(v), 16)));
#else
  float buf[VS];
  v.store(buf);
  for (int i = 0; i < VS; ++i) buf[i] = static_cast<float>(c10::BFloat16(buf[i]));
  return Vec::loadu(buf);
#endif
}

// Horizontal sum of one vector (ATen's shuffle tree).
inline float hsum(const Vec& v) {
  return at::vec::vec_reduce_all<float>([](const Vec& a, const Vec& b) { return a + b; }, v);
}

// Scalar forms, for the tails of rows that are not a whole number of vectors.
inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }
template <typename T> inline T from_float(float x);
template <> inline float from_float<float>(float x) { return x; }
template <> inline c10::BFloat16 from_float<c10::BFloat16>(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return c10::BFloat16(static_cast<uint16_t>(u >> 16), c10::BFloat16::from_bits());
}
template <typename T> inline float rnd(float x) { return to_float(from_float<T>(x)); }

}  // namespace shoal
