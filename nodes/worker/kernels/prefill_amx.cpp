// Prefill attention tiles by AMX (the tile matrix unit of Intel Xeons since Sapphire
// Rapids), where the CPU has it: Q K^T and P V as tdpbf16ps, each one 16 x 16 x 32
// multiply-adds of bf16 pairs into fp32, about four times the products per cycle of
// the vdpbf16ps loops in prefill_bf16.cpp, whose packing, task list and numerics this
// shares: scores in fp32, the softmax online over runs of keys (segments here, blocks
// there), probabilities rounded to bf16 for P V and their sum l taken over the rounded
// values.
//
// A tile is 16 row-heads (query rows x the query heads of one KV head) against a
// segment of up to 1,024 keys, in three passes:
//   Q K^T: per block of 64 keys, 4 score tiles (16 keys each) += Q tile (16 row-heads x
//          32 dims) x K tile (16 dim pairs x 16 keys, as prefill_bf16.cpp packs K), per
//          32 dims, stored into the segment's score rows (64 KB: they stay in L2);
//   softmax with AVX-512 over each row-head's whole segment: one maximum, one rescale
//          of what earlier segments left (none for contexts of up to 1,024 keys);
//   P V:   4 output tiles (16 dims each) loaded from the row-heads' fp32 accumulators,
//          += P tile (16 row-heads x 32 keys) x V tile (16 key pairs x 16 dims, as
//          packed) over the segment's keys, stored back.
// A softmax block of 64 keys, online, did the maximum, the rescale and a round trip of
// the outputs through memory every 64 keys: the segments took 4-7% off the kernel on a
// 2-core Xeon (interleaved runs of a W3-shaped chunk), and the segment's maximum rounds
// the probabilities a little differently (|difference| <= 5e-4 on that chunk).
// Tile registers: tmm0-3 scores or outputs; in Q K^T at head dim 64 the group's Q stays
// in tmm6-7 for a segment and K tiles go into tmm4 and tmm5 by turns, otherwise tmm4 holds
// the A operand (Q or P) and the B tiles (K or V) rotate over tmm5-7. Tile registers are
// not renamed: a load into one that a product still reads waits for the product.
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "bf16_pack.h"
#include "softmax_exp2.h"
#include "vec_io.h"

#if defined(CPU_CAPABILITY_AVX512) && !defined(SHOAL_EMULATED_AVX512)  // AMX has no emulation
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SHOAL_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,amx-tile,amx-bf16")))

namespace {

constexpr int64_t M = 16;                 // row-heads per tile
constexpr int64_t KB = shoal::PACK_KEYS;  // keys per Q K^T block: 4 score tiles
static_assert(KB == 64, "a block is 4 score tiles and 2 P tiles");
constexpr int64_t SEG = 1024;             // keys per softmax pass: a group's scores, 64 KB
static_assert(SEG % KB == 0, "a segment is whole blocks");
// Row strides of the score and probability buffers, one cache line past a power of two:
// at 4 KB (scores) or 2 KB (probabilities) apart, a tile's 16 rows fall in one or two
// L1 sets, and storing the score tiles took 60% of a kernel stripped of its arithmetic.
// (What padding and the resident Q gained on their own, 4-6% by one comparison, is
// within how much buffer alignment alone moved the kernel; see bf16_pack.h's Align64.)
constexpr int64_t SC_STRIDE = SEG + 16;  // floats
constexpr int64_t PB_STRIDE = SEG + 32;  // bf16
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
  for (int t = 0; t < 8; ++t) {  // every tile used here is 16 rows of 64 bytes
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

template <int NQ>  // D / 32: Q's tiles along a row-head's dims
SHOAL_AMX void tile_impl(const c10::BFloat16* q, const shoal::Packed& p, int64_t row0, int64_t len, int64_t ctx, int64_t i0,
                         int64_t R, int64_t h, int64_t G, int64_t H, float scale, shoal::OutRows out) {
  constexpr int64_t D = NQ * 32, DP = D / 2, NO = D / 16;
  static_assert(NO % 4 == 0, "outputs go 4 tiles (64 dims) at a time");
  const int64_t RG = R * G, groups = (RG + M - 1) / M, base = ctx - len;
  shoal::AlignedVec<c10::BFloat16> qa(groups * M * D, c10::BFloat16(0.f));  // bf16 queries, one row-head per row
  shoal::AlignedVec<float> acc(groups * M * D, 0.f);
  std::vector<float> l(RG);
  std::vector<int64_t> seen(groups * M, 0);  // keys each row-head sees
  for (int64_t r = 0; r < R; ++r)
    for (int64_t g = 0; g < G; ++g) {
      std::memcpy(qa.data() + (r * G + g) * D, q + ((row0 + i0 + r) * H + h * G + g) * D, D * sizeof(c10::BFloat16));
      seen[r * G + g] = base + i0 + r + 1;
    }
  thread_local shoal::AlignedVec<float> sc(M * SC_STRIDE);      // a group's scores for the segment, row-major
  thread_local shoal::AlignedVec<uint16_t> pb(M * PB_STRIDE);   // their probabilities, bf16
  float m[M], cr[M];  // per row-head: running maximum, this segment's rescale
  __m512 lsum[M];
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512bh ones = (__m512bh)_mm512_set1_epi16((short)0x3f80);  // bf16 1.0
  load_tile_config();
  for (int64_t g0 = 0; g0 < groups; ++g0) {
    const int64_t first = g0 * M, rows = std::min(M, RG - first);
    const int64_t most = seen[first + rows - 1];  // row-heads go by query row: the last sees the most
    for (int64_t r = 0; r < M; ++r) {
      m[r] = NEG_INF;
      lsum[r] = _mm512_setzero_ps();
    }
    for (int64_t s0 = 0; s0 < most; s0 += SEG) {
      const int64_t blocks = (std::min(SEG, most - s0) + KB - 1) / KB, keys = blocks * KB;
      // Q K^T for the segment, block by block: score tile t of block b holds keys s0 + 64 b + 16 t ..
      if constexpr (NQ == 2) {  // the group's whole Q stays in tmm6-7 for the segment
        _tile_loadd(6, qa.data() + first * D, D * 2);
        _tile_loadd(7, qa.data() + first * D + 32, D * 2);
      }
      for (int64_t b = 0; b < blocks; ++b) {
        const uint32_t* kblk = p.k.data() + ((s0 + b * KB) / 16) * DP * 16;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        if constexpr (NQ == 2) {
          // Dims 0-31 (Q in tmm6), then 32-63 (tmm7); K tiles into tmm4 and tmm5 by turns:
          // a load into the register the previous product still reads would wait for it.
          // QK_HALF(q, kc): one half's four score tiles from Q in tile q and K dims at kc.
#define QK_HALF(QT, KC)                                  \
  do {                                                   \
    _tile_loadd(4, (KC), 64);                            \
    _tile_dpbf16ps(0, QT, 4);                            \
    _tile_loadd(5, (KC) + DP * 16, 64);                  \
    _tile_dpbf16ps(1, QT, 5);                            \
    _tile_loadd(4, (KC) + 2 * DP * 16, 64);              \
    _tile_dpbf16ps(2, QT, 4);                            \
    _tile_loadd(5, (KC) + 3 * DP * 16, 64);              \
    _tile_dpbf16ps(3, QT, 5);                            \
  } while (0)
          QK_HALF(6, kblk);            // dims 0-31
          QK_HALF(7, kblk + 16 * 16);  // dims 32-63: dim pairs 16-31 of the block's first 16 keys
#undef QK_HALF
        } else {
          for (int c = 0; c < NQ; ++c) {
            _tile_loadd(4, qa.data() + first * D + c * 32, D * 2);
            const uint32_t* kc = kblk + 16 * c * 16;
            _tile_loadd(5, kc, 64);
            _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, kc + DP * 16, 64);
            _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(7, kc + 2 * DP * 16, 64);
            _tile_dpbf16ps(2, 4, 7);
            _tile_loadd(5, kc + 3 * DP * 16, 64);
            _tile_dpbf16ps(3, 4, 5);
          }
        }
        float* dst = sc.data() + b * KB;
        _tile_stored(0, dst, SC_STRIDE * 4);
        _tile_stored(1, dst + 16, SC_STRIDE * 4);
        _tile_stored(2, dst + 32, SC_STRIDE * 4);
        _tile_stored(3, dst + 48, SC_STRIDE * 4);
      }
      // The softmax over the whole segment: one maximum per row-head, one rescale of what
      // earlier segments left (none on the first: m = -inf), the unseen keys out.
      for (int64_t r = 0; r < M; ++r) {
        const int64_t n = r < rows ? std::clamp<int64_t>(seen[first + r] - s0, 0, keys) : 0;
        uint16_t* pr = pb.data() + r * PB_STRIDE;
        if (n == 0) {  // sees nothing here (or a padding row): P = 0, accumulators kept
          std::memset(pr, 0, keys * sizeof(uint16_t));
          cr[r] = 1.f;
          continue;
        }
        const float* sr = sc.data() + r * SC_STRIDE;
        auto raw = [&](int64_t k) SHOAL_AMX {  // 16 unscaled scores from key k; unseen ones -inf
          const __m512 x = _mm512_loadu_ps(sr + k);
          if (k + 16 <= n) return x;
          return _mm512_mask_mov_ps(_mm512_set1_ps(NEG_INF),
                                    _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32((int)std::max<int64_t>(n - k, 0))), x);
        };
        // The maximum in four independent chains (one chain waited on vmaxps's latency
        // every 16 keys), of the unscaled scores: fl(scale x) rises with x, so scaling the
        // maximum gives the scaled scores' maximum exactly.
        __m512 m0 = _mm512_set1_ps(NEG_INF), m1 = m0, m2 = m0, m3 = m0;
        int64_t k = 0;
        for (; k + 64 <= n; k += 64) {
          m0 = _mm512_max_ps(m0, _mm512_loadu_ps(sr + k));
          m1 = _mm512_max_ps(m1, _mm512_loadu_ps(sr + k + 16));
          m2 = _mm512_max_ps(m2, _mm512_loadu_ps(sr + k + 32));
          m3 = _mm512_max_ps(m3, _mm512_loadu_ps(sr + k + 48));
        }
        for (; k < n; k += 16) m0 = _mm512_max_ps(m0, raw(k));
        const float top = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3))) * scale;
        const float mnew = std::max(m[r], top);
        cr[r] = std::exp(m[r] - mnew);  // 0 on the first segment
        m[r] = mnew;
        // exp(s scale - m) as 2^t, t from one fused multiply-add (softmax_exp2.h: 12% off
        // the kernel against ATen's exp_u20); the sum over the rounded probabilities in
        // two chains, each waiting on vdpbf16ps's latency half as often.
        const __m512 c1 = _mm512_set1_ps(scale * shoal::LOG2E), c0 = _mm512_set1_ps(-mnew * shoal::LOG2E);
        auto prob = [&](int64_t k) SHOAL_AMX { return shoal::exp2_softmax(_mm512_fmadd_ps(raw(k), c1, c0)); };
        __m512 sum0 = _mm512_mul_ps(lsum[r], _mm512_set1_ps(cr[r])), sum1 = _mm512_setzero_ps();
        for (k = 0; k < keys; k += 64) {  // a segment is whole blocks of 64 keys
          const __m512bh p0 = _mm512_cvtne2ps_pbh(prob(k + 16), prob(k));
          const __m512bh p1 = _mm512_cvtne2ps_pbh(prob(k + 48), prob(k + 32));
          _mm512_storeu_si512(pr + k, (__m512i)p0);
          _mm512_storeu_si512(pr + k + 32, (__m512i)p1);
          sum0 = _mm512_dpbf16_ps(sum0, p0, ones);
          sum1 = _mm512_dpbf16_ps(sum1, p1, ones);
        }
        lsum[r] = _mm512_add_ps(sum0, sum1);
      }
      // P V: the accumulators rescaled in memory, then loaded as tiles and summed over the
      // segment's keys in the tile registers; the key pairs no row-head sees are skipped.
      if (s0 > 0)
        for (int64_t r = 0; r < rows; ++r) {
          float* a = acc.data() + (first + r) * D;
          const __m512 c = _mm512_set1_ps(cr[r]);
          for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(a + d, _mm512_mul_ps(_mm512_loadu_ps(a + d), c));
        }
      const int64_t halves = (std::min(most - s0, keys) + 31) / 32;
      for (int64_t oc = 0; oc < NO / 4; ++oc) {
        float* a = acc.data() + first * D + oc * 64;
        _tile_loadd(0, a, D * 4);
        _tile_loadd(1, a + 16, D * 4);
        _tile_loadd(2, a + 32, D * 4);
        _tile_loadd(3, a + 48, D * 4);
        for (int64_t kh = 0; kh < halves; ++kh) {
          _tile_loadd(4, pb.data() + 32 * kh, PB_STRIDE * 2);
          const uint32_t* vc = p.v.data() + ((s0 + 32 * kh) / 2) * D + oc * 64;  // key pairs .., dims oc * 64 ..
          _tile_loadd(5, vc, D * 4);  // V tiles rotate over tmm5-7, as K's above
          _tile_dpbf16ps(0, 4, 5);
          _tile_loadd(6, vc + 16, D * 4);
          _tile_dpbf16ps(1, 4, 6);
          _tile_loadd(7, vc + 32, D * 4);
          _tile_dpbf16ps(2, 4, 7);
          _tile_loadd(5, vc + 48, D * 4);
          _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, a, D * 4);
        _tile_stored(1, a + 16, D * 4);
        _tile_stored(2, a + 32, D * 4);
        _tile_stored(3, a + 48, D * 4);
      }
    }
    for (int64_t r = 0; r < rows; ++r) l[first + r] = _mm512_reduce_add_ps(lsum[r]);
  }
  _tile_release();
  shoal::write_tile_rows(acc.data(), l.data(), out, row0 + i0, R, H, h, G, D);
}

}  // namespace

namespace shoal {

bool amx_available(int64_t D) {
  static const bool ok = request_amx();
  return ok && (D == 64 || D == 128);
}

void amx_tile(const c10::BFloat16* q, const Packed& p, int64_t row0, int64_t len, int64_t ctx, int64_t i0, int64_t R,
              int64_t h, int64_t G, int64_t H, int64_t D, float scale, OutRows out) {
  if (D == 64)
    tile_impl<2>(q, p, row0, len, ctx, i0, R, h, G, H, scale, out);
  else
    tile_impl<4>(q, p, row0, len, ctx, i0, R, h, G, H, scale, out);
}

}  // namespace shoal

#else  // narrower builds and the emulated AVX-512 one: never chosen

namespace shoal {
bool amx_available(int64_t) { return false; }
void amx_tile(const c10::BFloat16*, const Packed&, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
              int64_t, float, OutRows) {}
}  // namespace shoal

#endif
