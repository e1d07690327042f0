// Device helpers shared by the header-only kernels (no PyTorch, no host code).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ddtree {
namespace kernels {

// Float -> uint32 whose unsigned order equals the float order (-inf < ... < +inf). 0 is below every
// float's key (-inf maps to 0x007FFFFF), so kernels use key 0 for "no element".
__device__ __forceinline__ uint32_t ordered_key(float f) {
  uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_to_float(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// A (key, id) pair packed so that a larger u64 is a better element: higher key first, then lower id.
// Distinct ids make every item distinct, so selecting "the top k items" is always exact.
__device__ __forceinline__ uint64_t pack_item(uint32_t key, int32_t id) {
  return (uint64_t(key) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(id));
}
__device__ __forceinline__ uint32_t item_key(uint64_t item) { return uint32_t(item >> 32); }
__device__ __forceinline__ int32_t item_id(uint64_t item) { return int32_t(0xFFFFFFFFu - uint32_t(item)); }

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

// Loads `N` consecutive elements starting at p[i] as floats: one 16-byte load when `vec` (caller
// guarantees alignment and i + N <= n), else element-wise with bounds (out-of-range -> NaN marker
// is avoided: they are reported invalid through `valid`).
// Issues all NV 16-byte loads of this thread's share of a row chunk before any use: vector j starts at element
// start + (j * THREADS + tid) * VN (VN = 16 / sizeof(T)), so a warp's loads are coalesced. A vector that crosses
// `vocab`, or every vector when the row is not 16-byte aligned (!VEC), is read element-wise, 0 past the end.
template <typename T, bool VEC, int NV, int THREADS>
__device__ __forceinline__ void load_row_vectors(const T* __restrict__ x, int start, int vocab, uint4 (&raw)[NV]) {
  constexpr int VN = 16 / int(sizeof(T));
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int base = start + (j * THREADS + int(threadIdx.x)) * VN;
    if (VEC && base + VN <= vocab) {
      raw[j] = __ldg(reinterpret_cast<const uint4*>(x + base));
    } else {
      T* e = reinterpret_cast<T*>(&raw[j]);
#pragma unroll
      for (int q = 0; q < VN; ++q) e[q] = (base + q < vocab) ? x[base + q] : T(0.0f);
    }
  }
}

template <typename T, int N>
__device__ __forceinline__ void load_vec(const T* __restrict__ p, float (&out)[N]) {
  static_assert(sizeof(T) * N == 16, "one 16-byte vector");
  uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = to_float<T>(e[j]);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ int warp_or(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v |= __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ uint64_t warp_max_u64(uint64_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    uint64_t w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// Inclusive prefix sum over the block (THREADS a multiple of 32, <= 1024). `scratch` holds 33 ints.
// Returns the thread's inclusive prefix; *total gets the block total. Contains two __syncthreads.
template <int THREADS>
__device__ __forceinline__ int block_inclusive_scan(int v, int* scratch, int* total) {
  constexpr int WARPS = THREADS / 32;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    int n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int w = lane < WARPS ? scratch[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      int n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    if (lane < WARPS) scratch[lane] = w;  // inclusive warp totals
    if (lane == 31) scratch[32] = w;
  }
  __syncthreads();
  if (warp > 0) v += scratch[warp - 1];
  *total = scratch[32];
  return v;
}

// Programmatic dependent launch (sm_90+): let the next kernel in the stream start launching, and
// wait for the previous kernel's completion and memory. Both are no-ops on older architectures and
// when the kernel was launched without the PDL attribute.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void raise_flag(int32_t* flags, int bit) {
  if (flags != nullptr) atomicOr(flags, bit);
}

}  // namespace kernels
}  // namespace ddtree
