// A span's keys and values for one KV head, packed by prefill_bf16.cpp into the layouts
// the bf16 pair instructions read: vdpbf16ps (AVX512_BF16) and tdpbf16ps (AMX) both
// multiply pairs of adjacent bf16 elements, so K is stored as dim pairs and V as key
// pairs. The context is padded with zeros to a multiple of PACK_KEYS keys.
//   K: [block of 16 keys][dim pair][16 keys][2]  16 dim pairs x 16 keys: an AMX B tile
//   V: [key pair][dim][2]                          16 key pairs x 16 dims: an AMX B tile
#pragma once
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "vec_io.h"

namespace shoal {

constexpr int64_t PACK_KEYS = 64;  // the AMX tile's Q K^T block; the AVX-512 softmax block takes halves

// Memory on 64-byte (cache line) boundaries. malloc gives 16: a tile's 64-byte rows and
// a vector's 64-byte loads then each straddle two lines, and how a buffer happened to
// fall moved the AMX prefill kernel by 20% between two builds of the same source.
template <class T>
struct Align64 {
  using value_type = T;
  Align64() = default;
  template <class U>
  Align64(const Align64<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const Align64<U>&) const { return true; }
  template <class U>
  bool operator!=(const Align64<U>&) const { return false; }
};
template <class T>
using AlignedVec = std::vector<T, Align64<T>>;

struct Packed {
  AlignedVec<uint32_t> k;  // [ctx_pad / 16][D / 2][16]
  AlignedVec<uint32_t> v;  // [ctx_pad / 2][D]
};

// AMX tiles (prefill_amx.cpp): whether this CPU and kernel let this process use them
// for head dim D.
bool amx_available(int64_t D);

// Rows [i0, i0 + R) of a span (its first q row `row0`, `len` rows, context `ctx`), the
// G query heads of KV head h, by AMX tiles; q bf16 [T, H, D], out fp32 or bf16.
void amx_tile(const c10::BFloat16* q, const Packed& p, int64_t row0, int64_t len, int64_t ctx, int64_t i0, int64_t R,
              int64_t h, int64_t G, int64_t H, int64_t D, float scale, OutRows out);

}  // namespace shoal
