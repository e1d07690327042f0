// Stand-in for <cuda_runtime.h> when draft_topk_lse_v3.cuh is compiled for the CPU emulator: the SIMT
// emulator of build_tree_emu/ plus the few types and intrinsics the top-k kernels use on top of it.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "../../build_tree_emu/simt_emu.h"

// Kernel-local __shared__ variables must be one object per block, not one per thread: static locals
// (blocks run one after another in the emulator).
#undef __shared__
#define __shared__ static

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float a, float b) { return float2{a, b}; }
// __float_as_uint comes from simt_emu.h.
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline float __expf(float x) { return std::exp(x); }
inline int atomicOr(int* p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
inline bool __any_sync(unsigned mask, bool pred) { return __ballot_sync(mask, pred) != 0u; }
inline unsigned __reduce_max_sync(unsigned, unsigned v) {
  emu::slot(threadIdx.x & 31) = v;
  emu::warp_sync();
  unsigned m = 0;
  for (int l = 0; l < 32; ++l) m = std::max(m, static_cast<unsigned>(emu::slot(l)));
  emu::warp_sync();
  return m;
}
