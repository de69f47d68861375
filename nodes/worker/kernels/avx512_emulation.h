// The AVX-512 build's intrinsics on a CPU without AVX-512, for tests only: SIMDe
// (Debian's libsimde-dev) implements `_mm512_*` on AVX2, so the AVX-512 forms of the
// kernels (16-float vectors, the AVX512_BF16 dot products) run on an AVX2 machine, with
// the hardware's results up to the order of float sums (SIMDe's bf16 dot products add a
// pair's products in their own order and keep denormals, which the kernels never make), and a change to them is checked wherever the suite runs
// (tests/native_builds.py; kernels/__init__.py builds it as "AVX512_EMULATED", each
// source file with this header forced in first). AMX has no emulation: that build
// compiles the AMX tiles out. What SIMDe 0.7 lacks, and the SLEEF vector maths ATen's
// 512-bit types name, is written here lane by lane.
#pragma once
#include <immintrin.h>  // GCC's declarations first: SIMDe's names then shadow them
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#define SHOAL_EMULATED_AVX512 1

namespace shoal_emulation {

template <typename V, typename T, int N>
struct Lanes {
  T v[N];
  explicit Lanes(V x) { std::memcpy(v, &x, sizeof(v)); }
  Lanes() : v{} {}
  V get() const {
    V x;
    std::memcpy(&x, v, sizeof(v));
    return x;
  }
};
using F16 = Lanes<simde__m512, float, 16>;
using D8 = Lanes<simde__m512d, double, 8>;

// fp32 -> bf16 as VCVTNE2PS2BF16 rounds: to nearest even, denormals to a signed zero, a
// NaN quieted.
inline uint16_t bf16_round(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7F800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u);
  return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

}  // namespace shoal_emulation

// -- what SIMDe 0.7.4 lacks --------------------------------------------------------------

static inline __mmask16 shoal_mm512_cmplt_epi32_mask(simde__m512i a, simde__m512i b) {
  shoal_emulation::Lanes<simde__m512i, int32_t, 16> x(a), y(b);
  __mmask16 m = 0;
  for (int i = 0; i < 16; ++i) m |= (__mmask16)((x.v[i] < y.v[i]) ? 1u << i : 0u);
  return m;
}

static inline __mmask16 shoal_mm512_cmp_epi32_mask(simde__m512i a, simde__m512i b, int pred) {
  shoal_emulation::Lanes<simde__m512i, int32_t, 16> x(a), y(b);
  __mmask16 m = 0;
  for (int i = 0; i < 16; ++i) {
    const int32_t l = x.v[i], r = y.v[i];
    const bool on[8] = {l == r, l < r, l <= r, false, l != r, !(l < r), !(l <= r), true};  // _MM_CMPINT_*
    m |= (__mmask16)(on[pred & 7] ? 1u << i : 0u);
  }
  return m;
}

static inline simde__m512 shoal_mm512_maskz_loadu_ps(__mmask16 k, const void* p) {  // reads masked lanes only
  shoal_emulation::F16 r;
  for (int i = 0; i < 16; ++i)
    if (k & (1u << i)) std::memcpy(&r.v[i], static_cast<const float*>(p) + i, 4);
  return r.get();
}

static inline void shoal_mm512_mask_storeu_ps(void* p, __mmask16 k, simde__m512 a) {  // writes masked lanes only
  shoal_emulation::F16 x(a);
  for (int i = 0; i < 16; ++i)
    if (k & (1u << i)) std::memcpy(static_cast<float*>(p) + i, &x.v[i], 4);
}

static inline float shoal_mm512_cvtss_f32(simde__m512 a) { return shoal_emulation::F16(a).v[0]; }

static inline simde__m512 shoal_mm512_cvtepi32_ps(simde__m512i a) {
  shoal_emulation::Lanes<simde__m512i, int32_t, 16> x(a);
  shoal_emulation::F16 r;
  for (int i = 0; i < 16; ++i) r.v[i] = (float)x.v[i];
  return r.get();
}

// float -> int32 by the rounding mode of `_MM_FROUND_*` (0 nearest even, 1 down, 2 up,
// 3 toward zero, 4 the current mode: nearest even); NaN or out of range gives INT32_MIN,
// the instruction's "integer indefinite".
static inline simde__m512i shoal_mm512_cvt_roundps_epi32(simde__m512 a, int rounding) {
  shoal_emulation::F16 x(a);
  shoal_emulation::Lanes<simde__m512i, int32_t, 16> r;
  for (int i = 0; i < 16; ++i) {
    const float f = x.v[i];
    const int mode = rounding & 7;
    const float t = mode == 1 ? std::floor(f) : mode == 2 ? std::ceil(f) : mode == 3 ? std::trunc(f) : std::nearbyint(f);
    r.v[i] = (t >= -2147483648.0f && t < 2147483648.0f) ? (int32_t)t : INT32_MIN;
  }
  return r.get();
}

static inline simde__m512i shoal_mm512_cvtps_epi32(simde__m512 a) { return shoal_mm512_cvt_roundps_epi32(a, 4); }

static inline simde__m256i shoal_mm512_cvtepi32_epi16(simde__m512i a) {  // truncates, as vpmovdw does
  shoal_emulation::Lanes<simde__m512i, int32_t, 16> x(a);
  shoal_emulation::Lanes<simde__m256i, int16_t, 16> r;
  for (int i = 0; i < 16; ++i) r.v[i] = (int16_t)x.v[i];
  return r.get();
}

static inline simde__m512i shoal_mm512_cvtepu16_epi32(simde__m256i a) {
  shoal_emulation::Lanes<simde__m256i, uint16_t, 16> x(a);
  shoal_emulation::Lanes<simde__m512i, int32_t, 16> r;
  for (int i = 0; i < 16; ++i) r.v[i] = x.v[i];
  return r.get();
}

// 32 bf16: lanes 0-15 from b, 16-31 from a.
static inline simde__m512bh shoal_mm512_cvtne2ps_pbh(simde__m512 a, simde__m512 b) {
  shoal_emulation::F16 x(a), y(b);
  shoal_emulation::Lanes<simde__m512bh, uint16_t, 32> r;
  for (int i = 0; i < 16; ++i) {
    r.v[i] = shoal_emulation::bf16_round(y.v[i]);
    r.v[16 + i] = shoal_emulation::bf16_round(x.v[i]);
  }
  return r.get();
}

static inline float shoal_mm512_reduce_add_ps(simde__m512 a) {  // pairwise, as GCC's sequence adds
  shoal_emulation::F16 x(a);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) x.v[i] += x.v[i + w];
  return x.v[0];
}

// GCC's tree, each level max(high half, low half) as maxps takes it: where either is NaN,
// the second (the low half's lane) is the result.
static inline float shoal_mm512_reduce_max_ps(simde__m512 a) {
  shoal_emulation::F16 x(a);
  for (int w = 8; w >= 1; w /= 2)
    for (int i = 0; i < w; ++i) x.v[i] = x.v[i + w] > x.v[i] ? x.v[i + w] : x.v[i];
  return x.v[0];
}

// GCC defines these names for its own types: the kernels' (and ATen's) calls go to the
// ones above; SIMDe 0.7.4 has the last without its native alias.
#define _mm512_cmp_epi32_mask shoal_mm512_cmp_epi32_mask
#define _mm512_maskz_loadu_ps shoal_mm512_maskz_loadu_ps
#define _mm512_mask_storeu_ps shoal_mm512_mask_storeu_ps
#define _mm512_cvtss_f32 shoal_mm512_cvtss_f32
#define _mm512_cvtepi32_ps shoal_mm512_cvtepi32_ps
#define _mm512_cvt_roundps_epi32 shoal_mm512_cvt_roundps_epi32
#define _mm512_cvtps_epi32 shoal_mm512_cvtps_epi32
#define _mm512_cmplt_epi32_mask shoal_mm512_cmplt_epi32_mask
#define _mm512_cvtepi32_epi16 shoal_mm512_cvtepi32_epi16
#define _mm512_cvtepu16_epi32 shoal_mm512_cvtepu16_epi32
#define _mm512_cvtne2ps_pbh shoal_mm512_cvtne2ps_pbh
#define _mm512_reduce_add_ps shoal_mm512_reduce_add_ps
#define _mm512_reduce_max_ps shoal_mm512_reduce_max_ps
#define _mm512_shuffle_f32x4(a, b, imm) simde_mm512_shuffle_f32x4(a, b, imm)

// -- SLEEF's 16-float and 8-double functions, which ATen's vec512 types name -------------
// With the accuracy suffix ATen names each by (u10: within 1.0 ulp); the C library's are
// as good.

#define SHOAL_EMU_UNARY(name, suffix, fn)                                 \
  static inline simde__m512 Sleef_##name##f16##suffix(simde__m512 a) {    \
    shoal_emulation::F16 x(a);                                            \
    for (auto& e : x.v) e = fn(e);                                        \
    return x.get();                                                       \
  }                                                                       \
  static inline simde__m512d Sleef_##name##d8##suffix(simde__m512d a) {   \
    shoal_emulation::D8 x(a);                                             \
    for (auto& e : x.v) e = fn(e);                                        \
    return x.get();                                                       \
  }
#define SHOAL_EMU_BINARY(name, suffix, fn)                                                \
  static inline simde__m512 Sleef_##name##f16##suffix(simde__m512 a, simde__m512 b) {     \
    shoal_emulation::F16 x(a), y(b);                                                      \
    for (int i = 0; i < 16; ++i) x.v[i] = fn(x.v[i], y.v[i]);                             \
    return x.get();                                                                       \
  }                                                                                       \
  static inline simde__m512d Sleef_##name##d8##suffix(simde__m512d a, simde__m512d b) {   \
    shoal_emulation::D8 x(a), y(b);                                                       \
    for (int i = 0; i < 8; ++i) x.v[i] = fn(x.v[i], y.v[i]);                              \
    return x.get();                                                                       \
  }

SHOAL_EMU_UNARY(acos, _u10, std::acos)
SHOAL_EMU_UNARY(acosh, _u10, std::acosh)
SHOAL_EMU_UNARY(asin, _u10, std::asin)
SHOAL_EMU_UNARY(asinh, _u10, std::asinh)
SHOAL_EMU_UNARY(atan, _u10, std::atan)
SHOAL_EMU_UNARY(atanh, _u10, std::atanh)
SHOAL_EMU_UNARY(cos, _u10, std::cos)
SHOAL_EMU_UNARY(cos, _u35, std::cos)
SHOAL_EMU_UNARY(cosh, _u10, std::cosh)
SHOAL_EMU_UNARY(erf, _u10, std::erf)
SHOAL_EMU_UNARY(erfc, _u15, std::erfc)
SHOAL_EMU_UNARY(exp, _u10, std::exp)
SHOAL_EMU_UNARY(exp2, _u10, std::exp2)
SHOAL_EMU_UNARY(expm1, _u10, std::expm1)
SHOAL_EMU_UNARY(lgamma, _u10, std::lgamma)
SHOAL_EMU_UNARY(log, _u10, std::log)
SHOAL_EMU_UNARY(log10, _u10, std::log10)
SHOAL_EMU_UNARY(log1p, _u10, std::log1p)
SHOAL_EMU_UNARY(log2, _u10, std::log2)
SHOAL_EMU_UNARY(sin, _u10, std::sin)
SHOAL_EMU_UNARY(sin, _u35, std::sin)
SHOAL_EMU_UNARY(sinh, _u10, std::sinh)
SHOAL_EMU_UNARY(tan, _u10, std::tan)
SHOAL_EMU_UNARY(tanh, _u10, std::tanh)
SHOAL_EMU_BINARY(atan2, _u10, std::atan2)
SHOAL_EMU_BINARY(copysign, , std::copysign)
SHOAL_EMU_BINARY(fmod, , std::fmod)
SHOAL_EMU_BINARY(hypot, _u05, std::hypot)
SHOAL_EMU_BINARY(nextafter, , std::nextafter)
SHOAL_EMU_BINARY(pow, _u10, std::pow)

#undef SHOAL_EMU_UNARY
#undef SHOAL_EMU_BINARY
