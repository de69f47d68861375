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
#include "vec_io.h"

using shoal::dynamic_for;
using shoal::Vec;
using shoal::VS;
using shoal::hmax;
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
// query heads of one KV head. Keys are taken KC at a time (across block boundaries), K
// transposed and V widened into fp32 buffers once, then every (row, head) of the tile
// scores KC keys with KC / VS vector FMAs per head dimension (no horizontal sums) and
// accumulates its values from the buffer in L1: the gather-free counterpart of
// flash-attention's blocked loop, with an online softmax and a causal mask per row.
constexpr int64_t TILE_ROWS = 16;
constexpr int KC = 32;
constexpr int NS = KC / VS;

template <typename T, int NV>
struct PrefillTile {
  static constexpr int64_t D = NV * VS;
  // Row-heads scored together (sharing each K load) and accumulated together (sharing
  // each V load), as many as the vector registers hold.
  static constexpr int RB = std::max(1, std::min(4, (VREGS - 2) / (NS + 1)));
  static constexpr int RBV = std::max(1, std::min(4, (VREGS - 4) / NV));
  static constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
  std::vector<float> qt, acc, kt, vf, m, l;
  PrefillTile(int64_t G)
      : qt((TILE_ROWS * G + RB) * D, 0.f), acc(TILE_ROWS * G * D), kt(D * KC, 0.f), vf(KC * D, 0.f),
        m(TILE_ROWS * G), l(TILE_ROWS * G) {}

  // Rows [i0, i0 + R) of a span of `len` rows starting at q row `row0`, context `ctx`.
  template <typename Q>
  void run(const Q* q, const T* k_cache, const T* v_cache, const int64_t* table, int64_t row0, int64_t len,
           int64_t ctx, int64_t i0, int64_t R, int64_t h, OutRows out, int64_t H, int64_t KVH, int64_t block_size,
           float scale) {
    const int64_t G = H / KVH, row_stride = KVH * D, RG = R * G;
    const int64_t base = ctx - len;  // row i sees base + i + 1 tokens
    const int64_t nmax = base + i0 + R;
    for (int64_t r = 0; r < R; ++r)
      for (int64_t g = 0; g < G; ++g) {
        const Q* src = q + ((row0 + i0 + r) * H + h * G + g) * D;
        float* dst = qt.data() + (r * G + g) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = shoal::to_float(src[d]) * scale;
      }
    std::fill(acc.begin(), acc.begin() + RG * D, 0.f);
    std::fill(m.begin(), m.begin() + RG, NEG_INF);
    std::fill(l.begin(), l.begin() + RG, 0.f);
    alignas(64) float sc[RB + RBV][KC] = {};  // probabilities; rows past the group stay 0
    alignas(64) float tmp[VS];
    Vec lane[NS];
    for (int j = 0; j < NS; ++j) lane[j] = Vec::arange(j * VS, 1);
    for (int64_t start = 0; start < nmax; start += KC) {
      const int64_t cnt = std::min<int64_t>(KC, nmax - start);
      for (int64_t t = 0; t < cnt; ++t) {
        const int64_t tok = start + t;
        const int64_t off = (table[tok / block_size] * block_size + tok % block_size) * row_stride + h * D;
        for (int c = 0; c < NV; ++c) {
          load_vec(k_cache + off + c * VS).store(tmp);
          for (int e = 0; e < VS; ++e) kt[(c * VS + e) * KC + t] = tmp[e];
          load_vec(v_cache + off + c * VS).store(vf.data() + t * D + c * VS);
        }
      }
      for (int64_t rh0 = 0; rh0 < RG; rh0 += RB) {
        const int64_t nb = std::min<int64_t>(RB, RG - rh0);
        int64_t crs[RB];  // keys of this chunk each row-head sees (causal)
        int64_t crmax = 0;
        for (int b = 0; b < RB; ++b) {
          crs[b] = b < nb ? std::clamp<int64_t>(base + i0 + (rh0 + b) / G + 1 - start, 0, cnt) : 0;
          crmax = std::max(crmax, crs[b]);
        }
        if (crmax == 0) continue;
        Vec sv[RB][NS];
        for (int b = 0; b < RB; ++b)
          for (int j = 0; j < NS; ++j) sv[b][j] = Vec(0.f);
        const float* qv = qt.data() + rh0 * D;
        for (int64_t d = 0; d < D; ++d) {
          Vec kd[NS];
          for (int j = 0; j < NS; ++j) kd[j] = Vec::loadu(kt.data() + d * KC + j * VS);
          for (int b = 0; b < RB; ++b) {
            const Vec qd(qv[b * D + d]);
            for (int j = 0; j < NS; ++j) sv[b][j] = at::vec::fmadd(qd, kd[j], sv[b][j]);
          }
        }
        // Scores out of registers first: exp below is a call, which would otherwise
        // spill every accumulator still live (the probabilities overwrite them in place).
        for (int b = 0; b < RB; ++b)
          for (int j = 0; j < NS; ++j) sv[b][j].store(sc[b] + j * VS);
        float corr[RB + RBV];
        for (int b = 0; b < RB + RBV; ++b) corr[b] = 1.f;
        for (int b = 0; b < RB; ++b) {
          const int64_t rh = rh0 + b;
          if (b >= nb || crs[b] == 0) {  // past the tile, or sees none of these keys
            std::fill(sc[b], sc[b] + KC, 0.f);
            continue;
          }
          Vec mv(NEG_INF);
          Vec row[NS];
          for (int j = 0; j < NS; ++j) {
            row[j] = Vec::blendv(Vec(NEG_INF), Vec::loadu(sc[b] + j * VS), lane[j] < Vec(static_cast<float>(crs[b])));
            mv = at::vec::maximum(mv, row[j]);
          }
          const float mx = std::max(m[rh], hmax(mv));
          corr[b] = std::exp(m[rh] - mx);  // 0 on the first keys (m = -inf)
          Vec sum(0.f);
          for (int j = 0; j < NS; ++j) {
            const Vec e = (row[j] - Vec(mx)).exp();  // 0 where masked
            e.store(sc[b] + j * VS);
            sum = sum + e;
          }
          l[rh] = l[rh] * corr[b] + hsum(sum);
          m[rh] = mx;
        }
        for (int64_t b0 = 0; b0 < nb; b0 += RBV) {
          const int64_t nv = std::min<int64_t>(RBV, nb - b0);
          Vec ar[RBV][NV];
          for (int b = 0; b < RBV; ++b)
            for (int c = 0; c < NV; ++c)
              ar[b][c] = b < nv ? Vec::loadu(acc.data() + (rh0 + b0 + b) * D + c * VS) * Vec(corr[b0 + b]) : Vec(0.f);
          for (int64_t t = 0; t < crmax; ++t) {
            Vec p[RBV];
            for (int b = 0; b < RBV; ++b) p[b] = Vec(sc[b0 + b][t]);
            for (int c = 0; c < NV; ++c) {
              const Vec v = Vec::loadu(vf.data() + t * D + c * VS);
              for (int b = 0; b < RBV; ++b) ar[b][c] = at::vec::fmadd(p[b], v, ar[b][c]);
            }
          }
          for (int b = 0; b < nv; ++b)
            for (int c = 0; c < NV; ++c) ar[b][c].store(acc.data() + (rh0 + b0 + b) * D + c * VS);
        }
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
  static const bool cpu = __builtin_cpu_supports("avx512bf16");
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
