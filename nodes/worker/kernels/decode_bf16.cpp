// Decode attention for a bf16 cache on CPUs with AVX512_BF16: one query token against
// its whole context, both products as bf16 dot-product instructions (vdpbf16ps) on the
// cache rows as they lie, nothing widened element by element.
//
// Two passes over the context, no online rescaling: the scores of every key for every
// query head first (n x H floats, in L2 for contexts of thousands of tokens), then the
// exact softmax, then P V.
//   - Q K^T: a key row is 2 x 16 bf16 pairs per 32 dims; one vdpbf16ps against the query
//     leaves 16 partial sums per key, and 16 keys' partial sums are folded into one
//     vector of 16 scores by a shuffle tree (46 instructions for 16 keys, where a
//     horizontal sum per key costs ~8 each).
//   - P V: two value rows are interleaved by vpunpck{l,h}wd into (key t, key t+1) pairs
//     of each dim, and one vdpbf16ps adds p_t v_t + p_t+1 v_t+1 for 16 dims. The
//     interleave permutes dims within 128-bit lanes; the write-out undoes it.
// The query is bf16 (a bf16 model's, or an fp32 model's rounded by paged_attention, as
// the bf16 dot products need); probabilities are rounded to
// bf16 for P V, and their sum l is taken over the rounded values, as prefill_bf16.cpp
// does and as torch's bf16 attention rounds them. Compiled for AVX-512 builds only,
// used where the CPU says so.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

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

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// v[t], t < 16 -> one vector whose lane t is the sum of v[t]'s 16 lanes. Each level adds
// the two halves of a pair of vectors' partial sums, halving the lanes per key:
// 128-bit lane shuffles first, then within-lane ones; a last permute restores key order.
SHOAL_BF16 inline __m512 sum16(const __m512* v) {
  __m512 w[8], x[4], y[2];
  for (int i = 0; i < 8; ++i)  // lanes 0-7: key 2i, 8-15: key 2i+1
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // quad k: key 4i + k
    x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(w[2 * i], w[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // quad k: key 8i + k twice, then key 8i + 4 + k twice
    y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0xEE));
  // lane 4k + m: key 4m + k
  const __m512 f = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, f);
}

// Prefetches the `bytes` of a cache row at `row` into L1.
inline void prefetch_row(const uint16_t* row, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(reinterpret_cast<const char*>(row) + off, 0, 3);
}

// One query token, every head, against keys [0, n) of one sequence. NZ = D / 32: the
// 64-byte chunks of a head's row. Both passes walk the context front to back reading
// whole rows (every head of a key at once), so the cache is streamed: blocks lie
// anywhere in it, so each pass fetches the rows 16 keys ahead itself.
template <int NZ>
struct DecodeBf16 {
  static constexpr int64_t D = NZ * 32;
  std::vector<const uint16_t*> krows, vrows;  // each key's row in the cache (head 0), or a zero row
  std::vector<__m512> part;                   // [H][16] one group's partial sums per key
  std::vector<__m512> acc;                    // [H][2 NZ] P V accumulators
  std::vector<float> scores;                  // [H][npad]
  std::vector<uint32_t> pairs;                // [H][npad / 2] bf16 (p_t, p_t+1)
  std::vector<uint16_t> zero;
  std::vector<float> l;
  std::vector<__m512bh> q;                    // [H][NZ] the query, bf16 pairs

  SHOAL_BF16 void run(const uint16_t* qrow, const uint16_t* kc, const uint16_t* vc, const int64_t* table, int64_t n,
                      shoal::OutRows orow, int64_t H, int64_t KVH, int64_t bs, float scale) {
    const int64_t G = H / KVH, stride = KVH * D, npad = (n + 31) / 32 * 32, row_bytes = stride * 2;
    zero.assign(stride, 0);
    krows.resize(npad + 16);
    vrows.resize(npad + 16);
    for (int64_t t = 0; t < npad + 16; ++t) {
      if (t < n) {
        const int64_t off = (table[t / bs] * bs + t % bs) * stride;
        krows[t] = kc + off;
        vrows[t] = vc + off;
      } else {
        krows[t] = vrows[t] = zero.data();
      }
    }
    part.resize(H * 16);
    acc.assign(H * 2 * NZ, _mm512_setzero_ps());
    scores.resize(H * npad);
    pairs.resize(H * npad / 2);
    l.resize(H);
    q.resize(H * NZ);
    for (int64_t j = 0; j < H * NZ; ++j) q[j] = (__m512bh)_mm512_loadu_si512(qrow + j * 32);
    // Q K^T: each key's row once, every head; 16 keys' partial sums folded at a time.
    // Only the keys are fetched ahead here: fetching the values into L2 meanwhile, for
    // the P V pass, made the whole kernel 6-13% slower on a 2-core Xeon (100 x 1,500,
    // 128 x 300 and 32 x 4,000 contexts, interleaved runs): two streams from memory at
    // once, where P V fetches its own rows ahead as it goes.
    for (int64_t t0 = 0; t0 < npad; t0 += 16) {
      for (int64_t t = t0; t < t0 + 16; ++t) {
        prefetch_row(krows[t + 16], row_bytes);
        for (int64_t h = 0; h < KVH; ++h) {
          __m512bh k[NZ];
          for (int c = 0; c < NZ; ++c) k[c] = (__m512bh)_mm512_loadu_si512(krows[t] + h * D + c * 32);
          for (int64_t g = 0; g < G; ++g) {
            const int64_t hq = h * G + g;
            __m512 a = _mm512_setzero_ps();
            for (int c = 0; c < NZ; ++c) a = _mm512_dpbf16_ps(a, q[hq * NZ + c], k[c]);
            part[hq * 16 + (t - t0)] = a;
          }
        }
      }
      for (int64_t hq = 0; hq < H; ++hq)
        _mm512_storeu_ps(scores.data() + hq * npad + t0, _mm512_mul_ps(sum16(part.data() + hq * 16), _mm512_set1_ps(scale)));
    }
    // Softmax per query head; the padding keys get probability 0.
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    for (int64_t hq = 0; hq < H; ++hq) {
      float* sc = scores.data() + hq * npad;
      for (int64_t t0 = n / 16 * 16; t0 < npad; t0 += 16) {
        const __mmask16 keep = _mm512_cmplt_epi32_mask(lane, _mm512_set1_epi32((int)std::max<int64_t>(0, n - t0)));
        _mm512_storeu_ps(sc + t0, _mm512_mask_mov_ps(_mm512_set1_ps(NEG_INF), keep, _mm512_loadu_ps(sc + t0)));
      }
      __m512 mv = _mm512_set1_ps(NEG_INF);
      for (int64_t t0 = 0; t0 < npad; t0 += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(sc + t0));
      const __m512 l2 = _mm512_set1_ps(shoal::LOG2E), c0 = _mm512_set1_ps(-_mm512_reduce_max_ps(mv) * shoal::LOG2E);
      __m512 sum = _mm512_setzero_ps();
      uint32_t* pp = pairs.data() + hq * npad / 2;
      for (int64_t t0 = 0; t0 < npad; t0 += 32) {
        // exp(s - m) as 2^t (softmax_exp2.h), t from one fused multiply-add.
        const __m512 a = shoal::exp2_softmax(_mm512_fmadd_ps(_mm512_loadu_ps(sc + t0), l2, c0));
        const __m512 b = shoal::exp2_softmax(_mm512_fmadd_ps(_mm512_loadu_ps(sc + t0 + 16), l2, c0));
        const __m512i pb = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // keys t0.. in order: pairs (t, t+1)
        _mm512_storeu_si512(pp + t0 / 2, pb);
        sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(pb)), 16)));
        sum = _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(pb, 1)), 16)));
      }
      l[hq] = _mm512_reduce_add_ps(sum);
    }
    // P V: two keys' rows at a time, every head; the accumulators stay in L1.
    for (int64_t t = 0; t < npad; t += 2) {
      prefetch_row(vrows[t + 16], row_bytes);
      prefetch_row(vrows[t + 17], row_bytes);
      for (int64_t h = 0; h < KVH; ++h) {
        __m512bh u[2 * NZ];
        for (int c = 0; c < NZ; ++c) {
          const __m512i va = _mm512_loadu_si512(vrows[t] + h * D + c * 32);
          const __m512i vb = _mm512_loadu_si512(vrows[t + 1] + h * D + c * 32);
          u[2 * c] = (__m512bh)_mm512_unpacklo_epi16(va, vb);
          u[2 * c + 1] = (__m512bh)_mm512_unpackhi_epi16(va, vb);
        }
        for (int64_t g = 0; g < G; ++g) {
          const int64_t hq = h * G + g;
          const __m512bh p = (__m512bh)_mm512_set1_epi32((int)pairs[hq * npad / 2 + t / 2]);
          for (int c = 0; c < 2 * NZ; ++c) acc[hq * 2 * NZ + c] = _mm512_dpbf16_ps(acc[hq * 2 * NZ + c], p, u[c]);
        }
      }
    }
    // acc[hq][2c + u] lane j holds dim 32c + 8 (j / 4) + 4u + j % 4.
    for (int64_t hq = 0; hq < H; ++hq) {
      alignas(64) float buf[16];
      const float inv = 1.f / l[hq];
      for (int c = 0; c < 2 * NZ; ++c) {
        _mm512_store_ps(buf, _mm512_mul_ps(acc[hq * 2 * NZ + c], _mm512_set1_ps(inv)));
        for (int j = 0; j < 16; ++j) orow.set(hq * D + 32 * (c / 2) + 8 * (j / 4) + 4 * (c % 2) + j % 4, buf[j]);
      }
    }
  }
};

template <int NZ>
void run_all(const uint16_t* q, const uint16_t* kc, const uint16_t* vc, const int64_t* tables, const int64_t* rows,
             const int64_t* lens, const int64_t* ctx, shoal::OutRows out, int64_t S, int64_t H, int64_t KVH, int64_t max_blocks,
             int64_t bs, float scale) {
  constexpr int64_t D = NZ * 32;
  std::vector<int64_t> spans;
  for (int64_t s = 0; s < S; ++s)
    if (lens[s] == 1) spans.push_back(s);
  if (spans.empty()) return;
  std::vector<std::unique_ptr<DecodeBf16<NZ>>> workers(at::get_num_threads());
  shoal::dynamic_for(spans.size(), [&](int64_t i) {
    const int64_t s = spans[i], tid = at::get_thread_num();
    if (!workers[tid]) workers[tid] = std::make_unique<DecodeBf16<NZ>>();
    workers[tid]->run(q + rows[s] * H * D, kc, vc, tables + s * max_blocks, ctx[s], out.at(rows[s] * H * D), H, KVH,
                      bs, scale);
  });
}

}  // namespace

// Every span of one row, as paged_attention() describes spans; q bf16 [T, H, D], out
// fp32 or bf16 like it, the cache bf16 [slots, KVH, D].
void decode_bf16(const c10::BFloat16* q_bf16, const c10::BFloat16* k_cache, const c10::BFloat16* v_cache, const int64_t* tables,
                 const int64_t* rows, const int64_t* lens, const int64_t* ctx, shoal::OutRows out, int64_t S, int64_t H,
                 int64_t KVH, int64_t D, int64_t max_blocks, int64_t bs, float scale) {
  const auto* kc = reinterpret_cast<const uint16_t*>(k_cache);
  const auto* vc = reinterpret_cast<const uint16_t*>(v_cache);
  const auto* q = reinterpret_cast<const uint16_t*>(q_bf16);
  switch (D) {
    case 32: run_all<1>(q, kc, vc, tables, rows, lens, ctx, out, S, H, KVH, max_blocks, bs, scale); break;
    case 64: run_all<2>(q, kc, vc, tables, rows, lens, ctx, out, S, H, KVH, max_blocks, bs, scale); break;
    default: run_all<4>(q, kc, vc, tables, rows, lens, ctx, out, S, H, KVH, max_blocks, bs, scale); break;
  }
}

#else  // narrower builds: never chosen

void decode_bf16(const c10::BFloat16*, const c10::BFloat16*, const c10::BFloat16*, const int64_t*, const int64_t*,
                 const int64_t*, const int64_t*, shoal::OutRows, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float) {}

#endif
