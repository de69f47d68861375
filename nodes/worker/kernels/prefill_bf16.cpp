// Prefill attention for a bf16 cache on CPUs with AVX512_BF16: both products of a
// chunk's attention (Q K^T and P V) as bf16 dot-product instructions (vdpbf16ps: 32
// bf16 products summed pairwise into 16 fp32 lanes), twice the fp32 FMA rate, with the
// softmax in fp32 between them, online over blocks of 32 keys (as flash attention).
//
// Each span's keys and values are first packed once per KV head (not once per tile of
// query rows) into the layouts the instruction pairs elements in:
//   K: [block of 16 keys][dim pair][16 keys][2]  a vector = 16 keys x one dim pair
//   V: [key pair][dim][2]                          a vector = 16 dims x one key pair
// by register shuffles (16 x 16 transposes for K, vpermt2w for V), not element by element.
// Scores accumulate in fp32 and are scaled in fp32; probabilities are rounded to bf16
// for P V, as torch's bf16 attention does. Decode rows take decode_bf16.cpp. Compiled
// for AVX-512 builds only, used where the CPU says so.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "bf16_pack.h"
#include "softmax_exp2.h"
#include "vec_io.h"

#if defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>

#if defined(SHOAL_EMULATED_AVX512)  // SIMDe's forms of the intrinsics (avx512_emulation.h)
#define SHOAL_BF16
#else
#define SHOAL_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma")))
#endif

namespace {

constexpr int64_t ROWS = 16;  // query rows per tile (x the query heads of a KV head)
constexpr int KB = 32;         // keys per softmax block (two vectors of 16 keys)
constexpr int RB = 8;          // row-heads scored together, sharing each K load
constexpr int RBV = 6;         // row-heads accumulated together, sharing each V load
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

using shoal::Packed;
static_assert(shoal::PACK_KEYS % KB == 0, "the packed context is read in whole blocks");

// c[j] lane i = r[i] lane j: a 16 x 16 transpose of 32-bit elements (64 shuffles).
SHOAL_BF16 inline void transpose16(const __m512i* r, __m512i* c) {
  __m512i t[16], u[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  // u[4g + k], 128-bit lane L: column 4L + k of rows 4g .. 4g + 3
  for (int g = 0; g < 16; g += 4) {
    u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
    u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
    u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
    u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0x88), v1 = _mm512_shuffle_i32x4(u[k], u[4 + k], 0xDD);
    const __m512i w0 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0x88), w1 = _mm512_shuffle_i32x4(u[8 + k], u[12 + k], 0xDD);
    c[k] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    c[8 + k] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
    c[4 + k] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    c[12 + k] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
  }
}

// K: 16 keys' rows at a time, 16 dim pairs by 16 keys transposed in registers. V: two
// keys' rows interleaved element by element (vpermt2w keeps the dims in order).
SHOAL_BF16 void pack(const uint16_t* kc, const uint16_t* vc, const int64_t* table, int64_t ctx, int64_t h,
                     int64_t KVH, int64_t D, int64_t bs, Packed& p) {
  const int64_t pad = (ctx + shoal::PACK_KEYS - 1) / shoal::PACK_KEYS * shoal::PACK_KEYS, DP = D / 2;
  p.k.assign(pad * DP, 0u);
  p.v.assign(pad / 2 * D, 0u);
  const std::vector<uint16_t> zero(D, 0);
  auto row = [&](const uint16_t* cache, int64_t t) {
    return t < ctx ? cache + ((table[t / bs] * bs + t % bs) * KVH + h) * D : zero.data();
  };
  for (int64_t t0 = 0; t0 < ctx; t0 += 16) {
    const uint16_t* rows[16];
    for (int i = 0; i < 16; ++i) rows[i] = row(kc, t0 + i);
    for (int64_t c0 = 0; c0 < DP; c0 += 16) {  // dim pairs c0 .. c0 + 15
      __m512i r[16], c[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(rows[i] + 2 * c0);
      transpose16(r, c);
      uint32_t* dst = p.k.data() + (t0 / 16) * DP * 16 + c0 * 16;
      for (int j = 0; j < 16; ++j) _mm512_storeu_si512(dst + j * 16, c[j]);
    }
  }
  const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                      39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t t = 0; t < ctx; t += 2) {
    const uint16_t *a = row(vc, t), *b = row(vc, t + 1);
    uint32_t* dst = p.v.data() + (t / 2) * D;
    for (int64_t d0 = 0; d0 < D; d0 += 32) {  // dims d0 .. d0 + 31 of both keys
      const __m512i va = _mm512_loadu_si512(a + d0), vb = _mm512_loadu_si512(b + d0);
      _mm512_storeu_si512(dst + d0, _mm512_permutex2var_epi16(va, lo, vb));
      _mm512_storeu_si512(dst + d0 + 16, _mm512_permutex2var_epi16(va, hi, vb));
    }
  }
}

// Rows [i0, i0 + R) of span s (its first q row `row0`, `len` rows, context `ctx`), the
// G query heads of KV head h.
template <int NV>  // D / 16
SHOAL_BF16 void tile(const c10::BFloat16* q, const Packed& p, int64_t row0, int64_t len, int64_t ctx, int64_t i0,
                     int64_t R, int64_t h, int64_t G, int64_t H, float scale, shoal::OutRows out) {
  constexpr int64_t D = NV * 16, DP = D / 2;
  const int64_t RG = R * G, base = ctx - len, nmax = base + i0 + R;
  shoal::AlignedVec<uint32_t> qp((RG + RB) * DP, 0u);  // bf16 pairs of each row-head's query
  shoal::AlignedVec<float> acc(RG * D, 0.f);
  std::vector<float> m(RG, NEG_INF), l(RG);
  // Each row-head's softmax sum, lane by lane: summed across lanes once, at the end
  // (a horizontal sum per block and row-head was a fifth of the tile's time).
  std::vector<__m512> lsum(RG, _mm512_setzero_ps());
  shoal::AlignedVec<uint32_t> pp((RG + RBV) * (KB / 2), 0u);  // bf16 pairs of each row-head's probabilities
  std::vector<int64_t> seen(RG);  // keys row-head rh sees
  for (int64_t r = 0; r < R; ++r)
    for (int64_t g = 0; g < G; ++g) {
      // bf16 pairs as they lie: dim 2 dp in the low half of pair dp (little-endian)
      std::memcpy(qp.data() + (r * G + g) * DP, q + ((row0 + i0 + r) * H + h * G + g) * D, D * sizeof(c10::BFloat16));
      seen[r * G + g] = base + i0 + r + 1;
    }
  std::vector<float> cr(RG + RBV, 1.f);  // each row-head's rescale for this block
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int64_t start = 0; start < nmax; start += KB) {
    const uint32_t* kblk = p.k.data() + (start / 16) * DP * 16;
    for (int64_t rh0 = 0; rh0 < RG; rh0 += RB) {
      const int64_t nb = std::min<int64_t>(RB, RG - rh0);
      __m512 s0[RB], s1[RB];
      for (int b = 0; b < RB; ++b) s0[b] = s1[b] = _mm512_setzero_ps();
      const uint32_t* qv = qp.data() + rh0 * DP;
      for (int64_t dp = 0; dp < DP; ++dp) {
        const __m512bh k0 = (__m512bh)_mm512_loadu_si512(kblk + dp * 16);
        const __m512bh k1 = (__m512bh)_mm512_loadu_si512(kblk + DP * 16 + dp * 16);
        for (int b = 0; b < RB; ++b) {
          const __m512bh qb = (__m512bh)_mm512_set1_epi32((int)qv[b * DP + dp]);
          s0[b] = _mm512_dpbf16_ps(s0[b], qb, k0);
          s1[b] = _mm512_dpbf16_ps(s1[b], qb, k1);
        }
      }
      // Scores out of registers first: the softmax below reads them row-head by row-head.
      alignas(64) float sb[RB][KB];
      for (int b = 0; b < RB; ++b) {
        _mm512_store_ps(sb[b], _mm512_mul_ps(s0[b], _mm512_set1_ps(scale)));
        _mm512_store_ps(sb[b] + 16, _mm512_mul_ps(s1[b], _mm512_set1_ps(scale)));
      }
      // Block maxima first, then every row-head's rescale exp(m_old - m_new) as one
      // vector (0 on a row-head's first block, m_old = -inf): a scalar exp per row-head
      // was a call that spilled the live registers.
      alignas(64) float mold[16] = {}, mnew[16] = {};  // unused lanes: exp(0), never read
      int64_t seen_n[RB];
      for (int b = 0; b < nb; ++b) {
        const int64_t rh = rh0 + b;
        const int64_t n = std::clamp<int64_t>(seen[rh] - start, 0, KB);  // keys of this block it sees
        seen_n[b] = n;
        if (n == 0) continue;
        __m512 a = _mm512_load_ps(sb[b]), c = _mm512_load_ps(sb[b] + 16);
        if (n < KB) {  // the causal edge or the context's end: the unseen keys out
          a = _mm512_mask_mov_ps(_mm512_set1_ps(NEG_INF), _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32((int)std::min<int64_t>(n, 16))), a);
          c = _mm512_mask_mov_ps(_mm512_set1_ps(NEG_INF), _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32((int)std::max<int64_t>(n - 16, 0))), c);
          _mm512_store_ps(sb[b], a);
          _mm512_store_ps(sb[b] + 16, c);
        }
        mold[b] = m[rh];
        mnew[b] = std::max(m[rh], _mm512_reduce_max_ps(_mm512_max_ps(a, c)));
      }
      alignas(64) float crb[16];
      (at::vec::Vectorized<float>(_mm512_load_ps(mold)) - at::vec::Vectorized<float>(_mm512_load_ps(mnew))).exp_u20().store(crb);
      const __m512bh ones = (__m512bh)_mm512_set1_epi16((short)0x3f80);  // bf16 1.0
      for (int b = 0; b < nb; ++b) {
        const int64_t rh = rh0 + b;
        uint32_t* prow = pp.data() + rh * (KB / 2);
        if (seen_n[b] == 0) {
          std::fill(prow, prow + KB / 2, 0u);
          cr[rh] = 1.f;
          continue;
        }
        cr[rh] = crb[b];
        // exp(s - m) as 2^t (softmax_exp2.h), t from one fused multiply-add.
        const __m512 l2 = _mm512_set1_ps(shoal::LOG2E), c0 = _mm512_set1_ps(-mnew[b] * shoal::LOG2E);
        const __m512 ea = shoal::exp2_softmax(_mm512_fmadd_ps(_mm512_load_ps(sb[b]), l2, c0));
        const __m512 ec = shoal::exp2_softmax(_mm512_fmadd_ps(_mm512_load_ps(sb[b] + 16), l2, c0));
        const __m512bh pb = _mm512_cvtne2ps_pbh(ec, ea);  // keys 0-15 low, 16-31 high
        _mm512_storeu_si512(prow, (__m512i)pb);
        // l sums the probabilities as P V uses them, rounded to bf16: a dot product
        // with ones adds them pairwise, exactly, in fp32 lanes.
        lsum[rh] = _mm512_dpbf16_ps(_mm512_mul_ps(lsum[rh], _mm512_set1_ps(cr[rh])), pb, ones);
        m[rh] = mnew[b];
      }
    }
    const int64_t kp_end = (std::min<int64_t>(KB, nmax - start) + 1) / 2;  // key pairs any row sees
    const uint32_t* vblk = p.v.data() + (start / 2) * D;
    for (int64_t rh0 = 0; rh0 < RG; rh0 += RBV) {
      const int64_t nb = std::min<int64_t>(RBV, RG - rh0);
      __m512 o[RBV][NV];
      for (int b = 0; b < RBV; ++b)
        for (int c = 0; c < NV; ++c)
          o[b][c] = b < nb ? _mm512_mul_ps(_mm512_loadu_ps(acc.data() + (rh0 + b) * D + c * 16), _mm512_set1_ps(cr[rh0 + b]))
                           : _mm512_setzero_ps();
      for (int64_t kp = 0; kp < kp_end; ++kp) {
        __m512bh pv[RBV];
        for (int b = 0; b < RBV; ++b) pv[b] = (__m512bh)_mm512_set1_epi32((int)pp[(rh0 + b) * (KB / 2) + kp]);
        for (int c = 0; c < NV; ++c) {
          const __m512bh v = (__m512bh)_mm512_loadu_si512(vblk + kp * D + c * 16);
          for (int b = 0; b < RBV; ++b) o[b][c] = _mm512_dpbf16_ps(o[b][c], pv[b], v);
        }
      }
      for (int b = 0; b < nb; ++b)
        for (int c = 0; c < NV; ++c) _mm512_storeu_ps(acc.data() + (rh0 + b) * D + c * 16, o[b][c]);
    }
  }
  for (int64_t rh = 0; rh < RG; ++rh) l[rh] = _mm512_reduce_add_ps(lsum[rh]);
  shoal::write_tile_rows(acc.data(), l.data(), out, row0 + i0, R, H, h, G, D);
}

}  // namespace

// Every span of more than one row, as paged_attention() describes spans; q bf16
// [T, H, D], out fp32 or bf16, the cache bf16 [slots, KVH, D]. `amx`: the tiles by AMX
// (prefill_amx.cpp), where shoal::amx_available(D).
void prefill_bf16(const c10::BFloat16* q, const c10::BFloat16* k_cache, const c10::BFloat16* v_cache, const int64_t* tables,
                  const int64_t* rows, const int64_t* lens, const int64_t* ctx, shoal::OutRows out, int64_t S, int64_t H,
                  int64_t KVH, int64_t D, int64_t max_blocks, int64_t bs, float scale, bool amx) {
  std::vector<std::pair<int64_t, int64_t>> packs;  // (span, kv head)
  for (int64_t s = 0; s < S; ++s)
    if (lens[s] > 1)
      for (int64_t h = 0; h < KVH; ++h) packs.push_back({s, h});
  if (packs.empty()) return;
  std::vector<Packed> packed(packs.size());
  const auto* kc = reinterpret_cast<const uint16_t*>(k_cache);
  const auto* vc = reinterpret_cast<const uint16_t*>(v_cache);
  shoal::dynamic_for(packs.size(), [&](int64_t i) {
    const auto [s, h] = packs[i];
    pack(kc, vc, tables + s * max_blocks, ctx[s], h, KVH, D, bs, packed[i]);
  });
  struct Task { int64_t pack, i0; };
  std::vector<Task> tasks;
  for (int64_t i = 0; i < (int64_t)packs.size(); ++i) {
    const int64_t s = packs[i].first;
    for (int64_t i0 = 0; i0 < lens[s]; i0 += ROWS) tasks.push_back({i, i0});
  }
  // The costliest first (latest rows see the most keys), so the queue ends on small ones.
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& a, const Task& b) {
    const int64_t sa = packs[a.pack].first, sb = packs[b.pack].first;
    return ctx[sa] - lens[sa] + a.i0 > ctx[sb] - lens[sb] + b.i0;
  });
  const int64_t G = H / KVH;
  shoal::dynamic_for(tasks.size(), [&](int64_t t) {
    const auto [i, i0] = tasks[t];
    const auto [s, h] = packs[i];
    const int64_t R = std::min(ROWS, lens[s] - i0);
    if (amx) return shoal::amx_tile(q, packed[i], rows[s], lens[s], ctx[s], i0, R, h, G, H, D, scale, out);
    switch (D) {
      case 32: tile<2>(q, packed[i], rows[s], lens[s], ctx[s], i0, R, h, G, H, scale, out); break;
      case 64: tile<4>(q, packed[i], rows[s], lens[s], ctx[s], i0, R, h, G, H, scale, out); break;
      default: tile<8>(q, packed[i], rows[s], lens[s], ctx[s], i0, R, h, G, H, scale, out); break;
    }
  });
}

#else  // narrower builds: never chosen

void prefill_bf16(const c10::BFloat16*, const c10::BFloat16*, const c10::BFloat16*, const int64_t*, const int64_t*,
                  const int64_t*, const int64_t*, shoal::OutRows, int64_t, int64_t, int64_t, int64_t, int64_t,
                  int64_t, float, bool) {}

#endif
