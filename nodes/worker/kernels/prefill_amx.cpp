// Prefill attention tiles by AMX (the tile matrix unit of Intel Xeons since Sapphire
// Rapids), where the CPU has it: Q K^T and P V as tdpbf16ps, each one 16 x 16 x 32
// multiply-adds of bf16 pairs into fp32, about four times the products per cycle of
// the vdpbf16ps loops in prefill_bf16.cpp, whose packing, task list and numerics this
// shares: scores in fp32, the softmax online over blocks of keys, probabilities rounded
// to bf16 for P V and their sum l taken over the rounded values.
//
// A tile is 16 row-heads (query rows x the query heads of one KV head) against a block
// of 64 keys:
//   Q K^T: 4 score tiles (16 keys each) += Q tile (16 row-heads x 32 dims) x K tile
//          (16 dim pairs x 16 keys, as prefill_bf16.cpp packs K), per 32 dims;
//   softmax on the stored scores with AVX-512 (one vector exp per block for every
//          row-head's rescale);
//   P V:   4 output tiles (16 dims each) += P tile (16 row-heads x 32 keys) x V tile
//          (16 key pairs x 16 dims, as packed), per 32 keys; stored, then added to the
//          row-heads' fp32 accumulators after their rescale (a tile register cannot be
//          scaled in place).
// Tile registers: tmm0-3 scores or outputs, tmm4 the A operand (Q or P), tmm5 the B
// operand (K or V).
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "bf16_pack.h"
#include "vec_io.h"

#if defined(CPU_CAPABILITY_AVX512)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SHOAL_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,amx-tile,amx-bf16")))

namespace {

constexpr int64_t M = 16;                 // row-heads per tile
constexpr int64_t KB = shoal::PACK_KEYS;  // keys per softmax block: 4 score tiles
static_assert(KB == 64, "a block is 4 score tiles and 2 P tiles");
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

struct alignas(64) TileConfig {  // LDTILECFG's 64-byte operand, palette 1
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The CPU has AMX tiles and bf16 products, and Linux lets this process use them: it
// hands out the 8 KB of tile state only to a process that asks (the call is idempotent;
// oneDNN makes it too).
bool request_amx() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;  // AMX-TILE, AMX-BF16
  constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

SHOAL_AMX void load_tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 6; ++t) {  // every tile used here is 16 rows of 64 bytes
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

template <int NQ>  // D / 32: Q's tiles along a row-head's dims
SHOAL_AMX void tile_impl(const float* q, const shoal::Packed& p, int64_t row0, int64_t len, int64_t ctx, int64_t i0,
                         int64_t R, int64_t h, int64_t G, int64_t H, float scale, float* out) {
  constexpr int64_t D = NQ * 32, DP = D / 2, NO = D / 16;
  static_assert(NO % 4 == 0, "outputs go 4 tiles (64 dims) at a time");
  const int64_t RG = R * G, groups = (RG + M - 1) / M, base = ctx - len, nmax = base + i0 + R;
  std::vector<c10::BFloat16> qa(groups * M * D, c10::BFloat16(0.f));  // bf16 queries, one row-head per row
  std::vector<float> acc(groups * M * D, 0.f), m(groups * M, NEG_INF), l(RG);
  std::vector<__m512> lsum(groups * M, _mm512_setzero_ps());  // softmax sums, lane by lane
  std::vector<int64_t> seen(groups * M, 0);                   // keys each row-head sees
  for (int64_t r = 0; r < R; ++r)
    for (int64_t g = 0; g < G; ++g) {
      const float* src = q + ((row0 + i0 + r) * H + h * G + g) * D;
      for (int64_t d = 0; d < D; d += shoal::VS)  // rounded to nearest even, as torch rounds
        shoal::store_vec(qa.data() + (r * G + g) * D + d, shoal::Vec::loadu(src + d));
      seen[r * G + g] = base + i0 + r + 1;
    }
  alignas(64) float sb[M][KB];     // a group's scores for the block
  alignas(64) uint16_t pb[M][KB];  // its probabilities, bf16
  alignas(64) float ob[M][64];     // 4 output tiles
  alignas(64) float mold[M], mnew[M], cr[M];
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512bh ones = (__m512bh)_mm512_set1_epi16((short)0x3f80);  // bf16 1.0
  load_tile_config();
  for (int64_t start = 0; start < nmax; start += KB) {
    const uint32_t* kblk = p.k.data() + (start / 16) * DP * 16;
    const uint32_t* vblk = p.v.data() + (start / 2) * D;
    for (int64_t g0 = 0; g0 < groups; ++g0) {
      const int64_t first = g0 * M, rows = std::min(M, RG - first);
      if (seen[first + rows - 1] <= start) continue;  // causal: no row-head of the group sees this block
      // Q K^T: score tile j holds keys start + 16 j .. + 15.
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int c = 0; c < NQ; ++c) {
        _tile_loadd(4, qa.data() + first * D + c * 32, D * 2);
        const uint32_t* kc = kblk + 16 * c * 16;  // dim pairs 16 c .. 16 c + 15 of the first 16 keys
        _tile_loadd(5, kc, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(5, kc + DP * 16, 64);
        _tile_dpbf16ps(1, 4, 5);
        _tile_loadd(5, kc + 2 * DP * 16, 64);
        _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(5, kc + 3 * DP * 16, 64);
        _tile_dpbf16ps(3, 4, 5);
      }
      _tile_stored(0, &sb[0][0], KB * 4);
      _tile_stored(1, &sb[0][16], KB * 4);
      _tile_stored(2, &sb[0][32], KB * 4);
      _tile_stored(3, &sb[0][48], KB * 4);
      // The softmax: scale, the unseen keys out, block maxima, then every row-head's
      // rescale exp(m_old - m_new) as one vector (0 on its first block: m_old = -inf).
      __m512 s[M][4];
      int64_t n[M];
      for (int64_t r = 0; r < M; ++r) {
        mold[r] = mnew[r] = 0.f;
        n[r] = r < rows ? std::clamp<int64_t>(seen[first + r] - start, 0, KB) : 0;
        if (n[r] == 0) continue;
        __m512 mx = _mm512_set1_ps(NEG_INF);
        for (int t = 0; t < 4; ++t) {
          s[r][t] = _mm512_mul_ps(_mm512_load_ps(&sb[r][16 * t]), _mm512_set1_ps(scale));
          if (n[r] < KB)
            s[r][t] = _mm512_mask_mov_ps(_mm512_set1_ps(NEG_INF),
                                         _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32((int)std::clamp<int64_t>(n[r] - 16 * t, 0, 16))),
                                         s[r][t]);
          mx = _mm512_max_ps(mx, s[r][t]);
        }
        mold[r] = m[first + r];
        mnew[r] = std::max(m[first + r], _mm512_reduce_max_ps(mx));
      }
      (at::vec::Vectorized<float>(_mm512_load_ps(mold)) - at::vec::Vectorized<float>(_mm512_load_ps(mnew))).exp_u20().store(cr);
      for (int64_t r = 0; r < M; ++r) {
        if (n[r] == 0) {  // sees nothing here (or a padding row): P = 0, accumulators kept
          std::memset(pb[r], 0, sizeof(pb[r]));
          cr[r] = 1.f;
          continue;
        }
        const int64_t rh = first + r;
        const at::vec::Vectorized<float> mx(mnew[r]);
        __m512 e[4];
        for (int t = 0; t < 4; ++t) e[t] = (at::vec::Vectorized<float>(s[r][t]) - mx).exp_u20();
        const __m512bh p01 = _mm512_cvtne2ps_pbh(e[1], e[0]), p23 = _mm512_cvtne2ps_pbh(e[3], e[2]);
        _mm512_store_si512(&pb[r][0], (__m512i)p01);
        _mm512_store_si512(&pb[r][32], (__m512i)p23);
        lsum[rh] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(_mm512_mul_ps(lsum[rh], _mm512_set1_ps(cr[r])), p01, ones), p23, ones);
        m[rh] = mnew[r];
      }
      // P V, 64 dims at a time; the second 32 keys only where some row-head sees them.
      const bool upper = seen[first + rows - 1] > start + 32;
      for (int64_t oc = 0; oc < NO / 4; ++oc) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int kh = 0; kh < (upper ? 2 : 1); ++kh) {
          _tile_loadd(4, &pb[0][32 * kh], KB * 2);
          const uint32_t* vc = vblk + 16 * kh * D + oc * 64;  // key pairs 16 kh .., dims oc * 64 ..
          _tile_loadd(5, vc, D * 4);
          _tile_dpbf16ps(0, 4, 5);
          _tile_loadd(5, vc + 16, D * 4);
          _tile_dpbf16ps(1, 4, 5);
          _tile_loadd(5, vc + 32, D * 4);
          _tile_dpbf16ps(2, 4, 5);
          _tile_loadd(5, vc + 48, D * 4);
          _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, &ob[0][0], 64 * 4);
        _tile_stored(1, &ob[0][16], 64 * 4);
        _tile_stored(2, &ob[0][32], 64 * 4);
        _tile_stored(3, &ob[0][48], 64 * 4);
        for (int64_t r = 0; r < rows; ++r) {
          float* a = acc.data() + (first + r) * D + oc * 64;
          const __m512 c = _mm512_set1_ps(cr[r]);
          for (int t = 0; t < 4; ++t)
            _mm512_storeu_ps(a + 16 * t, _mm512_fmadd_ps(_mm512_loadu_ps(a + 16 * t), c, _mm512_load_ps(&ob[r][16 * t])));
        }
      }
    }
  }
  _tile_release();
  for (int64_t rh = 0; rh < RG; ++rh) l[rh] = _mm512_reduce_add_ps(lsum[rh]);
  shoal::write_tile_rows(acc.data(), l.data(), out, row0 + i0, R, H, h, G, D);
}

}  // namespace

namespace shoal {

bool amx_available(int64_t D) {
  static const bool ok = request_amx();
  return ok && (D == 64 || D == 128);
}

void amx_tile(const float* q, const Packed& p, int64_t row0, int64_t len, int64_t ctx, int64_t i0, int64_t R,
              int64_t h, int64_t G, int64_t H, int64_t D, float scale, float* out) {
  if (D == 64)
    tile_impl<2>(q, p, row0, len, ctx, i0, R, h, G, H, scale, out);
  else
    tile_impl<4>(q, p, row0, len, ctx, i0, R, h, G, H, scale, out);
}

}  // namespace shoal

#else  // narrower builds: never chosen

namespace shoal {
bool amx_available(int64_t) { return false; }
void amx_tile(const float*, const Packed&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
              int64_t, float, float*) {}
}  // namespace shoal

#endif
