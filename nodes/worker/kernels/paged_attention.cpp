// Attention read straight through block tables, for decode tokens and for prefill chunks
// whose prefix is already in the cache: keys and values are streamed from the paged
// cache, never gathered into a copy.
//
// A step passes spans: span s is `lens[s]` consecutive query rows starting at row
// `rows[s]` of q, the last `lens[s]` tokens of a sequence whose context (cached prefix +
// the chunk, already written to the cache) is `ctx[s]` tokens; row i of the span sees the
// first ctx - lens + i + 1 of them (causal). A decode token is a span of one row.
//
// Decode rows and prefill chunks take different loops (DecodeRow, PrefillTile below):
// a decode reads every key once for a handful of query heads, so it streams the cache;
// a chunk has many query rows per key, so it tiles them and computes like a GEMM.
// Vectors are ATen's `at::vec::Vectorized<float>`, built for AVX-512 or AVX2 when this
// CPU has them (see kernels/__init__.py); bf16 rows widen to fp32 in registers.
#include <ATen/core/Tensor.h>  // not torch/extension.h: a tenth of the compile time
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <cmath>
#include <limits>
#include <vector>
#include <algorithm>
#include <atomic>
#include <memory>

#include "bf16_pack.h"
#include "softmax_exp2.h"
#include "vec_io.h"

using shoal::dynamic_for;
using shoal::Vec;
using shoal::VS;
using shoal::hsum;
using shoal::load_vec;
using shoal::OutRows;

#if defined(CPU_CAPABILITY_AVX512)
constexpr int VREGS = 32;  // vector registers the compiler can keep values in
#else
constexpr int VREGS = 16;
#endif

// A decode row: one query token, every head. Each key row is scored against the query
// heads of its group while it sits in registers (a horizontal sum per score), and the
// softmax runs online block by block (running max and sum, as flash-decoding does), so
// K and V are read once, front to back. NV = head_dim / VS vectors per head row, a
// compile-time constant so that a key row and an accumulator row live in registers.
template <typename T, int NV>
struct DecodeRow {
  static constexpr int64_t D = NV * VS;
  std::vector<float> qs, acc, scores, m, l;
  DecodeRow(int64_t H, int64_t block_size) : qs(H * D), acc(H * D), scores(H * block_size), m(H), l(H) {}

  template <typename Q>
  void run(const Q* qrow, const T* k_cache, const T* v_cache, const int64_t* table, int64_t n, OutRows orow,
           int64_t H, int64_t KVH, int64_t block_size, float scale) {
    const int64_t G = H / KVH, row_stride = KVH * D;
    for (int64_t j = 0; j < H * D; ++j) qs[j] = shoal::to_float(qrow[j]) * scale;
    std::fill(acc.begin(), acc.end(), 0.f);
    std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
    std::fill(l.begin(), l.end(), 0.f);
    for (int64_t start = 0; start < n; start += block_size) {
      const int64_t cnt = std::min(block_size, n - start);
      // A block is block_size whole rows, contiguous: streamed front to back.
      const T* kb = k_cache + table[start / block_size] * block_size * row_stride;
      const T* vb = v_cache + table[start / block_size] * block_size * row_stride;
      // The next block is fetched row by row while this one computes: a block's rows
      // are contiguous, but blocks lie anywhere, beyond the hardware prefetcher.
      const int64_t next = start + block_size < n ? table[start / block_size + 1] * block_size * row_stride : -1;
      for (int64_t t = 0; t < cnt; ++t) {
        if (next >= 0) {
          for (int64_t off = 0; off < row_stride; off += 64 / sizeof(T)) {
            __builtin_prefetch(k_cache + next + t * row_stride + off);
            __builtin_prefetch(v_cache + next + t * row_stride + off);
          }
        }
        for (int64_t h = 0; h < KVH; ++h) {
          Vec kr[NV];
          for (int c = 0; c < NV; ++c) kr[c] = load_vec(kb + t * row_stride + h * D + c * VS);
          for (int64_t g = 0; g < G; ++g) {
            const float* qg = qs.data() + (h * G + g) * D;
            Vec a = kr[0] * Vec::loadu(qg);
            for (int c = 1; c < NV; ++c) a = at::vec::fmadd(kr[c], Vec::loadu(qg + c * VS), a);
            scores[(h * G + g) * block_size + t] = hsum(a);
          }
        }
      }
      for (int64_t hq = 0; hq < H; ++hq) {
        float* sc = scores.data() + hq * block_size;
        const float mnew = std::max(m[hq], *std::max_element(sc, sc + cnt));
        const float corr = std::exp(m[hq] - mnew);  // 0 on the first block (m = -inf)
        float sum = 0.f;
        for (int64_t t = 0; t < cnt; t += VS) {
          const int64_t k = std::min<int64_t>(VS, cnt - t);
          Vec e = (Vec::loadu(sc + t, k) - Vec(mnew)).exp();
          e.store(sc + t, k);
        }
        for (int64_t t = 0; t < cnt; ++t) sum += sc[t];
        l[hq] = l[hq] * corr + sum;
        m[hq] = mnew;
        float* ag = acc.data() + hq * D;
        const T* vh = vb + (hq / G) * D;
        Vec ar[NV];
        const Vec vc(corr);
        for (int c = 0; c < NV; ++c) ar[c] = Vec::loadu(ag + c * VS) * vc;
        for (int64_t t = 0; t < cnt; ++t) {
          const Vec p(sc[t]);
          for (int c = 0; c < NV; ++c) ar[c] = at::vec::fmadd(p, load_vec(vh + t * row_stride + c * VS), ar[c]);
        }
        for (int c = 0; c < NV; ++c) ar[c].store(ag + c * VS);
      }
    }
    for (int64_t hq = 0; hq < H; ++hq) {
      const float inv = 1.f / l[hq];
      for (int64_t d = 0; d < D; ++d) orow.set(hq * D + d, acc[hq * D + d] * inv);
    }
  }
};

// A tile of a prefill chunk: up to TILE_ROWS consecutive query rows of one span, the
// query heads of one KV head: R * G row-heads, laid along vector lanes (lane r * G + g is
// row r's head g). Keys are taken KC at a time across block boundaries, widened to fp32
// rows once, and the tile computes like flash-attention's blocked loop, gather-free:
// scores S[key][row-head] = K Q^T in register blocks of TB keys x SB lane vectors (each
// key element a broadcast, each query vector a load: no transposes per chunk), the causal
// mask and the online softmax lane-wise down the keys (no horizontal sums or maxima), and
// O[row-head] += P V in blocks of VB row-heads x CB vectors of the head dimension.
constexpr int64_t TILE_ROWS = 16;
constexpr int KC = 32;

// exp(x - m), x <= m (or -inf): 2^t by softmax_exp2.h's degree-5 polynomial (relative
// error 2.2e-7, two fp32 ulps) where the build has it, ATen's exp otherwise.
inline Vec exp_minus(const Vec& x, const Vec& m) {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
  const Vec l2(shoal::LOG2E);
  return Vec(shoal::exp2_poly<5>(at::vec::fmadd(x, l2, m * Vec(-shoal::LOG2E))));
#else
  return (x - m).exp();
#endif
}

template <typename T, int NV>
struct PrefillTile {
  static constexpr int64_t D = NV * VS;
  // Register blocks: accumulators plus the operands of one step, within the registers.
  static constexpr int SB = 3, TB = VREGS == 32 ? 8 : 4;  // scores: 12 (24) accumulators
  static constexpr int CB = VREGS == 32 && NV % 4 == 0 ? 4 : NV % 2 == 0 ? 2 : 1;
  static constexpr int VB = 6;  // values: VB x CB accumulators, 12 (24) at head dim 64
  static constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
  const int64_t lanes;  // row-head lanes of a full tile, rounded up to whole vectors
  // qt: queries transposed, [D][lanes]; s: scores then probabilities, [KC][lanes];
  // acc: outputs, [lanes][D]; kf, vf: the chunk's keys and values, [KC][D].
  std::vector<float> qt, s, acc, kf, vf, m, l, corr, lim;
  PrefillTile(int64_t G)
      : lanes((TILE_ROWS * G + VS - 1) / VS * VS), qt(D * lanes, 0.f), s(KC * lanes, 0.f), acc(lanes * D),
        kf(KC * D, 0.f), vf(KC * D, 0.f), m(lanes), l(lanes), corr(lanes), lim(lanes) {}

  // Scores of the chunk's keys [t0, t0 + TB) for every t0 below cnt, lane vectors
  // [v0, v0 + NB).
  template <int NB>
  void score(int64_t v0, int64_t cnt) {
    for (int64_t t0 = 0; t0 < cnt; t0 += TB) {
      Vec a[TB][NB];
      for (int t = 0; t < TB; ++t)
        for (int b = 0; b < NB; ++b) a[t][b] = Vec(0.f);
      const float* kp = kf.data() + t0 * D;
      const float* qp = qt.data() + v0 * VS;
      for (int64_t d = 0; d < D; ++d) {
        Vec qv[NB];
        for (int b = 0; b < NB; ++b) qv[b] = Vec::loadu(qp + d * lanes + b * VS);
        for (int t = 0; t < TB; ++t) {
          const Vec kd(kp[t * D + d]);
          for (int b = 0; b < NB; ++b) a[t][b] = at::vec::fmadd(kd, qv[b], a[t][b]);
        }
      }
      for (int t = 0; t < TB; ++t)
        for (int b = 0; b < NB; ++b) a[t][b].store(s.data() + (t0 + t) * lanes + (v0 + b) * VS);
    }
  }

  // acc rows [r0, r0 + NB), rescaled by their corrections, plus P V over the chunk's
  // first cnt keys.
  template <int NB>
  void value(int64_t r0, int64_t cnt) {
    for (int c0 = 0; c0 < NV; c0 += CB) {
      Vec a[NB][CB];
      for (int b = 0; b < NB; ++b) {
        const Vec cv(corr[r0 + b]);
        for (int c = 0; c < CB; ++c) a[b][c] = Vec::loadu(acc.data() + (r0 + b) * D + (c0 + c) * VS) * cv;
      }
      for (int64_t t = 0; t < cnt; ++t) {
        const float* p = s.data() + t * lanes + r0;
        Vec vv[CB];
        for (int c = 0; c < CB; ++c) vv[c] = Vec::loadu(vf.data() + t * D + (c0 + c) * VS);
        for (int b = 0; b < NB; ++b) {
          const Vec pb(p[b]);
          for (int c = 0; c < CB; ++c) a[b][c] = at::vec::fmadd(pb, vv[c], a[b][c]);
        }
      }
      for (int b = 0; b < NB; ++b)
        for (int c = 0; c < CB; ++c) a[b][c].store(acc.data() + (r0 + b) * D + (c0 + c) * VS);
    }
  }

  // Rows [i0, i0 + R) of a span of `len` rows starting at q row `row0`, context `ctx`.
  template <typename Q>
  void run(const Q* q, const T* k_cache, const T* v_cache, const int64_t* table, int64_t row0, int64_t len,
           int64_t ctx, int64_t i0, int64_t R, int64_t h, OutRows out, int64_t H, int64_t KVH, int64_t block_size,
           float scale) {
    const int64_t G = H / KVH, row_stride = KVH * D, RG = R * G;
    const int64_t nv = (RG + VS - 1) / VS, used = nv * VS;  // lane vectors in use
    const int64_t base = ctx - len;  // row i sees base + i + 1 tokens
    const int64_t nmax = base + i0 + R;
    const int64_t seen_by_all = base + i0 + 1;  // keys no row of the tile masks
    for (int64_t rh = 0; rh < RG; ++rh) {
      const int64_t r = rh / G, g = rh % G;
      const Q* src = q + ((row0 + i0 + r) * H + h * G + g) * D;
      for (int64_t d = 0; d < D; ++d) qt[d * lanes + rh] = shoal::to_float(src[d]) * scale;
      lim[rh] = static_cast<float>(base + i0 + r + 1);  // exact: contexts are far below 2^24
    }
    for (int64_t rh = RG; rh < used; ++rh) {
      // Lanes past the tile's row-heads hold zero queries that see every key: finite,
      // never written out.
      for (int64_t d = 0; d < D; ++d) qt[d * lanes + rh] = 0.f;
      lim[rh] = static_cast<float>(nmax);
    }
    std::fill(acc.begin(), acc.begin() + used * D, 0.f);
    std::fill(m.begin(), m.begin() + used, NEG_INF);
    std::fill(l.begin(), l.begin() + used, 0.f);
    for (int64_t start = 0; start < nmax; start += KC) {
      const int64_t cnt = std::min<int64_t>(KC, nmax - start);
      for (int64_t t = 0; t < cnt; ++t) {
        const int64_t tok = start + t;
        const int64_t off = (table[tok / block_size] * block_size + tok % block_size) * row_stride + h * D;
        for (int c = 0; c < NV; ++c) {
          load_vec(k_cache + off + c * VS).store(kf.data() + t * D + c * VS);
          load_vec(v_cache + off + c * VS).store(vf.data() + t * D + c * VS);
        }
      }
      int64_t v0 = 0;
      for (; v0 + SB <= nv; v0 += SB) score<SB>(v0, cnt);
      if (nv - v0 == 2) score<2>(v0, cnt);
      if (nv - v0 == 1) score<1>(v0, cnt);
      const bool masked = start + cnt > seen_by_all;
      for (int64_t v = 0; v < nv; ++v) {
        float* sv = s.data() + v * VS;
        const Vec lv = Vec::loadu(lim.data() + v * VS);
        if (masked)  // key start + t is seen by the lanes whose limit is above it
          for (int64_t t = 0; t < cnt; ++t)
            Vec::blendv(Vec(NEG_INF), Vec::loadu(sv + t * lanes), Vec(static_cast<float>(start + t)) < lv)
                .store(sv + t * lanes);
        const Vec mold = Vec::loadu(m.data() + v * VS);
        Vec mx = mold;
        for (int64_t t = 0; t < cnt; ++t) mx = at::vec::maximum(mx, Vec::loadu(sv + t * lanes));
        Vec sum(0.f);
        for (int64_t t = 0; t < cnt; ++t) {
          const Vec e = exp_minus(Vec::loadu(sv + t * lanes), mx);  // 0 where masked
          e.store(sv + t * lanes);
          sum = sum + e;
        }
        const Vec cv = exp_minus(mold, mx);  // 0 on the first keys (m = -inf)
        cv.store(corr.data() + v * VS);
        (Vec::loadu(l.data() + v * VS) * cv + sum).store(l.data() + v * VS);
        mx.store(m.data() + v * VS);
      }
      int64_t r0 = 0;
      for (; r0 + VB <= RG; r0 += VB) value<VB>(r0, cnt);
      switch (RG - r0) {
        case 5: value<5>(r0, cnt); break;
        case 4: value<4>(r0, cnt); break;
        case 3: value<3>(r0, cnt); break;
        case 2: value<2>(r0, cnt); break;
        case 1: value<1>(r0, cnt); break;
        default: break;
      }
    }
    shoal::write_tile_rows(acc.data(), l.data(), out, row0 + i0, R, H, h, G, D);
  }
};

template <typename T, int NV, typename Q>
static void attention_impl(const Q* q, const T* k_cache, const T* v_cache, const int64_t* tables,
                           const int64_t* rows, const int64_t* lens, const int64_t* ctx, OutRows out,
                           int64_t S, int64_t H, int64_t KVH, int64_t max_blocks, int64_t block_size,
                           float scale) {
  // Tasks: prefill tiles first (the costliest, latest rows first, so the dynamic queue
  // ends on small tasks), then one per decode row.
  struct Task { int64_t s, i0, h; };
  std::vector<Task> tasks;
  for (int64_t s = 0; s < S; ++s)
    if (lens[s] > 1)
      for (int64_t i0 = (lens[s] - 1) / TILE_ROWS * TILE_ROWS; i0 >= 0; i0 -= TILE_ROWS)
        for (int64_t h = 0; h < KVH; ++h) tasks.push_back({s, i0, h});
  std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& a, const Task& b) {
    return ctx[a.s] - lens[a.s] + a.i0 > ctx[b.s] - lens[b.s] + b.i0;
  });
  for (int64_t s = 0; s < S; ++s)
    if (lens[s] == 1) tasks.push_back({s, 0, -1});
  const int64_t n = tasks.size();
  // One set of buffers per torch thread, made on first use.
  const int64_t nthreads = at::get_num_threads();
  std::vector<std::unique_ptr<DecodeRow<T, NV>>> decoders(nthreads);
  std::vector<std::unique_ptr<PrefillTile<T, NV>>> tilers(nthreads);
  dynamic_for(n, [&](int64_t ti) {
    const Task& task = tasks[ti];
    const int64_t tid = at::get_thread_num();
    const int64_t s = task.s;
    const int64_t* table = tables + s * max_blocks;
    if (task.h < 0) {
      if (!decoders[tid]) decoders[tid] = std::make_unique<DecodeRow<T, NV>>(H, block_size);
      decoders[tid]->run(q + rows[s] * H * DecodeRow<T, NV>::D, k_cache, v_cache, table, ctx[s],
                         out.at(rows[s] * H * DecodeRow<T, NV>::D), H, KVH, block_size, scale);
    } else {
      if (!tilers[tid]) tilers[tid] = std::make_unique<PrefillTile<T, NV>>(H / KVH);
      const int64_t R = std::min(TILE_ROWS, lens[s] - task.i0);
      tilers[tid]->run(q, k_cache, v_cache, table, rows[s], lens[s], ctx[s], task.i0, R, task.h, out, H, KVH,
                       block_size, scale);
    }
  });
}

template <typename T, typename Q>
static void dispatch_head_dim(int64_t D, const Q* q, const T* k, const T* v, const int64_t* tables,
                              const int64_t* rows, const int64_t* lens, const int64_t* ctx, OutRows out,
                              int64_t S, int64_t H, int64_t KVH, int64_t max_blocks, int64_t block_size,
                              float scale) {
  switch (D / VS) {
#define SHOAL_CASE(nv) case nv: return attention_impl<T, nv>(q, k, v, tables, rows, lens, ctx, out, S, H, KVH, max_blocks, block_size, scale);
    SHOAL_CASE(1) SHOAL_CASE(2) SHOAL_CASE(3) SHOAL_CASE(4) SHOAL_CASE(5) SHOAL_CASE(6) SHOAL_CASE(8)
    SHOAL_CASE(10) SHOAL_CASE(12) SHOAL_CASE(16) SHOAL_CASE(32)
#undef SHOAL_CASE
    default: TORCH_CHECK(false, "head_dim ", D, " is not supported by the paged attention kernel");
  }
}

// The head dims this build computes (a multiple of the vector width, up to 32 vectors).
bool supports_head_dim(int64_t D) {
  const int64_t nv = D / VS;
  return D % VS == 0 && (nv <= 6 || nv == 8 || nv == 10 || nv == 12 || nv == 16 || nv == 32);
}

int64_t vector_width() { return VS; }

// q: [T, H, D] float32 or bfloat16; k_cache, v_cache: [slots, KVH, D] (float32 or bfloat16); tables:
// [S, max_blocks]; rows, lens, ctx: [S] int64; out: [T, H, D] float32 or bfloat16 (the
// model's dtype, which the o projection takes), written at the spans' rows only.
void prefill_bf16(const c10::BFloat16* q, const c10::BFloat16* k_cache, const c10::BFloat16* v_cache, const int64_t* tables,
                  const int64_t* rows, const int64_t* lens, const int64_t* ctx, OutRows out, int64_t S, int64_t H,
                  int64_t KVH, int64_t D, int64_t max_blocks, int64_t bs, float scale, bool amx);
void decode_bf16(const c10::BFloat16* q, const c10::BFloat16* k_cache, const c10::BFloat16* v_cache, const int64_t* tables,
                 const int64_t* rows, const int64_t* lens, const int64_t* ctx, OutRows out, int64_t S, int64_t H,
                 int64_t KVH, int64_t D, int64_t max_blocks, int64_t bs, float scale);

// Whether a bf16 cache may take the bf16 dot-product kernels (prefill_bf16.cpp,
// decode_bf16.cpp); tests turn it off to check the fp32 loops on a CPU that has them.
static bool use_bf16_dots = true;
void set_bf16_dots(bool on) { use_bf16_dots = on; }
// Whether prefill tiles may take AMX where the CPU has it (prefill_amx.cpp); tests turn
// it off to check the AVX512_BF16 tiles on a CPU that has both.
static bool use_amx = true;
void set_amx(bool on) { use_amx = on; }
// Both kernels compute head dims 32, 64 and 128, and are compiled into AVX-512 builds only.
bool bf16_dots_available(int64_t D) {
#if defined(CPU_CAPABILITY_AVX512)
#if defined(SHOAL_EMULATED_AVX512)
  static const bool cpu = true;  // SIMDe's dot products (avx512_emulation.h)
#else
  static const bool cpu = __builtin_cpu_supports("avx512bf16");
#endif
  return cpu && (D == 32 || D == 64 || D == 128);
#else
  return false;
#endif
}
bool amx_available(int64_t D) { return bf16_dots_available(D) && shoal::amx_available(D); }

void paged_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache, at::Tensor tables,
                     at::Tensor rows, at::Tensor lens, at::Tensor ctx, int64_t block_size,
                     double scale, at::Tensor out) {
  TORCH_CHECK((q.dtype() == at::kFloat || q.dtype() == at::kBFloat16) && q.is_contiguous() && q.dim() == 3,
              "q must be contiguous float32 or bfloat16 [T,H,D]");
  TORCH_CHECK((out.dtype() == at::kFloat || out.dtype() == at::kBFloat16) && out.is_contiguous() &&
              out.sizes() == q.sizes(), "out must be float32 or bfloat16 [T,H,D] like q");
  const OutRows o = out.dtype() == at::kFloat ? OutRows{out.data_ptr<float>(), nullptr}
                                              : OutRows{nullptr, out.data_ptr<c10::BFloat16>()};
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "cache halves must be contiguous");
  TORCH_CHECK(k_cache.dim() == 3 && v_cache.sizes() == k_cache.sizes(), "caches are [slots,KVH,D]");
  TORCH_CHECK(k_cache.dtype() == v_cache.dtype(), "k and v caches differ in dtype");
  TORCH_CHECK(k_cache.dtype() == at::kFloat || k_cache.dtype() == at::kBFloat16, "unsupported cache dtype");
  for (auto* t : {&tables, &rows, &lens, &ctx})
    TORCH_CHECK(t->dtype() == at::kLong && t->is_contiguous(), "tables, rows, lens and ctx are contiguous int64");
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), KVH = k_cache.size(1), S = rows.numel();
  TORCH_CHECK(k_cache.size(2) == D && KVH > 0 && H % KVH == 0, "head shapes do not match");
  TORCH_CHECK(supports_head_dim(D), "head_dim ", D, " is not supported by the paged attention kernel");
  TORCH_CHECK(block_size > 0, "block size must be positive");
  TORCH_CHECK(tables.dim() == 2 && tables.size(0) == S && lens.numel() == S && ctx.numel() == S, "one table, length and context per span");
  const int64_t* r = rows.data_ptr<int64_t>();
  const int64_t* n = lens.data_ptr<int64_t>();
  const int64_t* c = ctx.data_ptr<int64_t>();
  const int64_t max_blocks = tables.size(1);
  for (int64_t s = 0; s < S; ++s) {
    TORCH_CHECK(n[s] >= 1 && r[s] >= 0 && r[s] + n[s] <= T, "span ", s, " rows out of range");
    TORCH_CHECK(c[s] >= n[s] && c[s] <= max_blocks * block_size, "span ", s, " context out of range");
  }
  const int64_t* tb = tables.data_ptr<int64_t>();
  const int64_t cache_blocks = k_cache.size(0) / block_size;
  for (int64_t s = 0; s < S; ++s)  // the blocks each span reads
    for (int64_t j = 0; j < (c[s] + block_size - 1) / block_size; ++j)
      TORCH_CHECK(tb[s * max_blocks + j] >= 0 && tb[s * max_blocks + j] < cache_blocks, "block id outside the cache");
  // The fp32 loops read queries in their own dtype, widened as they are loaded: an fp32
  // model's queries stay fp32 over a bf16 cache (`dtype_choice.choose_kv_cache_dtype`).
  if (k_cache.dtype() == at::kFloat) {
    if (q.dtype() == at::kBFloat16) q = q.to(at::kFloat);  // one code path for an fp32 cache
    dispatch_head_dim<float>(D, q.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(),
                             tables.data_ptr<int64_t>(), r, n, c, o, S, H, KVH, max_blocks,
                             block_size, (float)scale);
  } else if (k_cache.dtype() == at::kBFloat16) {
    // Prefill spans and decode rows by bf16 dot products where the CPU has them (fp32
    // queries rounded to bf16 for them); elsewhere the fp32 loops here.
    if (use_bf16_dots && bf16_dots_available(D)) {
      const auto* kb = k_cache.data_ptr<c10::BFloat16>();
      const auto* vb = v_cache.data_ptr<c10::BFloat16>();
      if (q.dtype() != at::kBFloat16) q = q.to(at::kBFloat16);
      const auto* qb = q.data_ptr<c10::BFloat16>();
      prefill_bf16(qb, kb, vb, tb, r, n, c, o, S, H, KVH, D, max_blocks,
                   block_size, (float)scale, use_amx && amx_available(D));
      decode_bf16(qb, kb, vb, tb, r, n, c, o, S, H, KVH, D, max_blocks,
                  block_size, (float)scale);
    } else {
      const auto* kb = k_cache.data_ptr<c10::BFloat16>();
      const auto* vb = v_cache.data_ptr<c10::BFloat16>();
      if (q.dtype() == at::kFloat)
        dispatch_head_dim<c10::BFloat16>(D, q.data_ptr<float>(), kb, vb, tb, r, n, c, o, S, H, KVH, max_blocks,
                                         block_size, (float)scale);
      else
        dispatch_head_dim<c10::BFloat16>(D, q.data_ptr<c10::BFloat16>(), kb, vb, tb, r, n, c, o, S, H, KVH,
                                         max_blocks, block_size, (float)scale);
    }
  } else {
    TORCH_CHECK(false, "unsupported cache dtype");
  }
}
