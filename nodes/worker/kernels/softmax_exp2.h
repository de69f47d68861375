// 2^t for a softmax's probabilities, where the result is rounded to bf16 next (P V's
// operand): round(t) goes into the exponent field as an integer and a degree-4
// polynomial takes the fraction in [-0.5, 0.5] (relative error 2.7e-6, under a thousandth
// of a bf16 rounding step). Ten vector instructions where ATen's exp_u20 takes twenty (the
// clamps, conversions and blends a general exp needs): the softmax is the largest of the
// AMX prefill kernel's three phases. Arguments are log2 of probabilities, t <= ~0:
// t below -125 (or -inf, or NaN) gives exactly 0, as a masked key must. The same
// construction with one more term serves the bf16 silu (fused_ops.cpp) and, in 8 lanes
// on AVX2 as well, the fp32 prefill tiles' softmax (paged_attention.cpp; relative error
// 2.2e-7, two fp32 ulps).
#pragma once
#if defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>

namespace shoal {

constexpr float LOG2E = 1.4426950408889634f;

// 2^t with round(t) put into the exponent field and a polynomial of degree DEGREE of the
// fraction; t below -125 (or -inf, or NaN) gives exactly 0. DEGREE 4: relative error
// 2.7e-6; DEGREE 5: 2.2e-7 (for the silu of fused_ops.cpp, whose activations torch
// rounds to bf16 straight from fp32: at 2.7e-6 one in 900 of them rounded the other way).
template <int DEGREE>
inline __m512 exp2_poly(__m512 t) {
  static_assert(DEGREE == 4 || DEGREE == 5, "fits for degrees 4 and 5");
  const __mmask16 live = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-125.f), _CMP_GE_OQ);  // 2^-125 x [0.7, 1.5) is normal
  const __m512 magic = _mm512_set1_ps(12582912.f);  // 1.5 x 2^23: t + magic holds round(t) in its low bits
  const __m512 v = _mm512_add_ps(t, magic);
  const __m512 f = _mm512_sub_ps(t, _mm512_sub_ps(v, magic));
  // Least-squares fits of 2^f, weighted to relative error, on Chebyshev nodes of [-0.5, 0.5].
  __m512 p;
  if constexpr (DEGREE == 4) {
    p = _mm512_fmadd_ps(_mm512_set1_ps(0.009560510516166687f), f, _mm512_set1_ps(0.05591703951358795f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24024981260299683f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931219696998596f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.9999991655349731f));
  } else {
    p = _mm512_fmadd_ps(_mm512_set1_ps(0.0013266970636323094f), f, _mm512_set1_ps(0.009675459936261177f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05550742521882057f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24022121727466583f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931469440460205f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0000001192092896f));
  }
  // bits(v) << 23 is round(t) << 23: magic's own bits shift out of the word.
  return _mm512_castsi512_ps(
      _mm512_maskz_add_epi32(live, _mm512_castps_si512(p), _mm512_slli_epi32(_mm512_castps_si512(v), 23)));
}

inline __m512 exp2_softmax(__m512 t) { return exp2_poly<4>(t); }

}  // namespace shoal
#elif defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>

namespace shoal {

constexpr float LOG2E = 1.4426950408889634f;

// The same construction in 8 lanes (the fp32 prefill tiles of paged_attention.cpp).
template <int DEGREE>
inline __m256 exp2_poly(__m256 t) {
  static_assert(DEGREE == 5, "fit for degree 5");
  const __m256 live = _mm256_cmp_ps(t, _mm256_set1_ps(-125.f), _CMP_GE_OQ);
  const __m256 magic = _mm256_set1_ps(12582912.f);
  const __m256 v = _mm256_add_ps(t, magic);
  const __m256 f = _mm256_sub_ps(t, _mm256_sub_ps(v, magic));
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(0.0013266970636323094f), f, _mm256_set1_ps(0.009675459936261177f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.05550742521882057f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.24022121727466583f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.6931469440460205f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0000001192092896f));
  const __m256i r = _mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(v), 23));
  return _mm256_and_ps(_mm256_castsi256_ps(r), live);
}

}  // namespace shoal
#endif
