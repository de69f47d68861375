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

#define SHOAL_EMU_UNARY(name, fn)                                       \
  static inline simde__m512 Sleef_##name##f16(simde__m512 a) {          \
    shoal_emulation::F16 x(a);                                          \
    for (auto& e : x.v) e = fn(e);                                      \
    return x.get();                                                     \
  }                                                                     \
  static inline simde__m512d Sleef_##name##d8(simde__m512d a) {         \
    shoal_emulation::D8 x(a);                                           \
    for (auto& e : x.v) e = fn(e);                                      \
    return x.get();                                                     \
  }
#define SHOAL_EMU_BINARY(name, fn)                                             \
  static inline simde__m512 Sleef_##name##f16(simde__m512 a, simde__m512 b) {    \
    shoal_emulation::F16 x(a), y(b);                                           \
    for (int i = 0; i < 16; ++i) x.v[i] = fn(x.v[i], y.v[i]);                  \
    return x.get();                                                            \
  }                                                                            \
  static inline simde__m512d Sleef_##name##d8(simde__m512d a, simde__m512d b) { \
    shoal_emulation::D8 x(a), y(b);                                            \
    for (int i = 0; i < 8; ++i) x.v[i] = fn(x.v[i], y.v[i]);                   \
    return x.get();                                                            \
  }

// ATen names them with their accuracy suffix (u10: 1.0 ulp); the C library's are as good.
#define Sleef_acosf16_u10 Sleef_acosf16
#define Sleef_acosd8_u10 Sleef_acosd8
#define Sleef_acoshf16_u10 Sleef_acoshf16
#define Sleef_acoshd8_u10 Sleef_acoshd8
#define Sleef_asinf16_u10 Sleef_asinf16
#define Sleef_asind8_u10 Sleef_asind8
#define Sleef_asinhf16_u10 Sleef_asinhf16
#define Sleef_asinhd8_u10 Sleef_asinhd8
#define Sleef_atanf16_u10 Sleef_atanf16
#define Sleef_atand8_u10 Sleef_atand8
#define Sleef_atanhf16_u10 Sleef_atanhf16
#define Sleef_atanhd8_u10 Sleef_atanhd8
#define Sleef_atan2f16_u10 Sleef_atan2f16
#define Sleef_atan2d8_u10 Sleef_atan2d8
#define Sleef_cosf16_u10 Sleef_cosf16
#define Sleef_cosf16_u35 Sleef_cosf16
#define Sleef_cosd8_u10 Sleef_cosd8
#define Sleef_coshf16_u10 Sleef_coshf16
#define Sleef_coshd8_u10 Sleef_coshd8
#define Sleef_erff16_u10 Sleef_erff16
#define Sleef_erfd8_u10 Sleef_erfd8
#define Sleef_erfcf16_u15 Sleef_erfcf16
#define Sleef_erfcd8_u15 Sleef_erfcd8
#define Sleef_expf16_u10 Sleef_expf16
#define Sleef_expd8_u10 Sleef_expd8
#define Sleef_exp2f16_u10 Sleef_exp2f16
#define Sleef_exp2d8_u10 Sleef_exp2d8
#define Sleef_expm1f16_u10 Sleef_expm1f16
#define Sleef_expm1d8_u10 Sleef_expm1d8
#define Sleef_hypotf16_u05 Sleef_hypotf16
#define Sleef_hypotd8_u05 Sleef_hypotd8
#define Sleef_lgammaf16_u10 Sleef_lgammaf16
#define Sleef_lgammad8_u10 Sleef_lgammad8
#define Sleef_logf16_u10 Sleef_logf16
#define Sleef_logd8_u10 Sleef_logd8
#define Sleef_log10f16_u10 Sleef_log10f16
#define Sleef_log10d8_u10 Sleef_log10d8
#define Sleef_log1pf16_u10 Sleef_log1pf16
#define Sleef_log1pd8_u10 Sleef_log1pd8
#define Sleef_log2f16_u10 Sleef_log2f16
#define Sleef_log2d8_u10 Sleef_log2d8
#define Sleef_powf16_u10 Sleef_powf16
#define Sleef_powd8_u10 Sleef_powd8
#define Sleef_sinf16_u10 Sleef_sinf16
#define Sleef_sinf16_u35 Sleef_sinf16
#define Sleef_sind8_u10 Sleef_sind8
#define Sleef_sinhf16_u10 Sleef_sinhf16
#define Sleef_sinhd8_u10 Sleef_sinhd8
#define Sleef_tanf16_u10 Sleef_tanf16
#define Sleef_tand8_u10 Sleef_tand8
#define Sleef_tanhf16_u10 Sleef_tanhf16
#define Sleef_tanhd8_u10 Sleef_tanhd8

SHOAL_EMU_UNARY(acos, std::acos)
SHOAL_EMU_UNARY(acosh, std::acosh)
SHOAL_EMU_UNARY(asin, std::asin)
SHOAL_EMU_UNARY(asinh, std::asinh)
SHOAL_EMU_UNARY(atan, std::atan)
SHOAL_EMU_UNARY(atanh, std::atanh)
SHOAL_EMU_UNARY(cos, std::cos)
SHOAL_EMU_UNARY(cosh, std::cosh)
SHOAL_EMU_UNARY(erf, std::erf)
SHOAL_EMU_UNARY(erfc, std::erfc)
SHOAL_EMU_UNARY(exp, std::exp)
SHOAL_EMU_UNARY(exp2, std::exp2)
SHOAL_EMU_UNARY(expm1, std::expm1)
SHOAL_EMU_UNARY(lgamma, std::lgamma)
SHOAL_EMU_UNARY(log, std::log)
SHOAL_EMU_UNARY(log10, std::log10)
SHOAL_EMU_UNARY(log1p, std::log1p)
SHOAL_EMU_UNARY(log2, std::log2)
SHOAL_EMU_UNARY(sin, std::sin)
SHOAL_EMU_UNARY(sinh, std::sinh)
SHOAL_EMU_UNARY(tan, std::tan)
SHOAL_EMU_UNARY(tanh, std::tanh)
SHOAL_EMU_BINARY(atan2, std::atan2)
SHOAL_EMU_BINARY(copysign, std::copysign)
SHOAL_EMU_BINARY(fmod, std::fmod)
SHOAL_EMU_BINARY(hypot, std::hypot)
SHOAL_EMU_BINARY(nextafter, std::nextafter)
SHOAL_EMU_BINARY(pow, std::pow)

#undef SHOAL_EMU_UNARY
#undef SHOAL_EMU_BINARY
