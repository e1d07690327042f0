// qkv_prep kernel: what a model layer does between its QKV GEMM and tree attention, in one launch.
//
// Input row t of the GEMM output holds Hq query heads, then Hkv key heads, then Hkv value heads (D each).
// Query and key heads get NeoX RoPE, rope(x)[j] = x[j] * cos[t][j] + x[j ^ half] * sin[t][j] (sin sign-folded:
// -sin on the first half), computed in fp32 as two products and one add, each rounded (__fmul_rn / __fadd_rn,
// no FMA contraction: the readable reference computes exactly these fp32 operations, so the outputs match it
// bit for bit), then rounded once to the output dtype. Query heads go to q [T, Hq, D]; key and value heads go
// to row slots[t] of the caches viewed as [rows, Hkv, D] (value heads unrotated, only converted).
//
// Work item = (token, head, chunk): VEC consecutive elements of the first half and the VEC at the same
// offset in the second half (the pair RoPE mixes), so every load and store is a 16-byte vector of the input
// and consecutive threads take consecutive chunks of one row (coalesced).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "ddtree/kernels/common.cuh"

namespace ddtree {
namespace kernels {

constexpr int kQkvPrepThreads = 256;

template <typename T>
struct QkvVec {
  static constexpr int N = 16 / int(sizeof(T));  // elements per 16-byte input vector
};

template <typename T, int N>
__device__ __forceinline__ void qkv_load(const T* __restrict__ p, float (&out)[N]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = to_float<T>(e[i]);
}

// fp32 -> the output dtype (fp32 or bf16), round to nearest even.
template <typename T>
__device__ __forceinline__ T qkv_from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return __float2bfloat16_rn(x);
  }
}

// Stores N floats as N elements of To: 16-byte stores when N * sizeof(To) is a multiple of 16, else one
// 8-byte store (fp32 input -> bf16 output: 4 elements). The launcher checks the alignment this needs.
template <typename To, int N>
__device__ __forceinline__ void qkv_store(To* __restrict__ p, const float (&v)[N]) {
  constexpr int kBytes = N * int(sizeof(To));
  static_assert(kBytes % 8 == 0, "qkv_prep stores whole 8-byte words");
  if constexpr (kBytes % 16 == 0) {
    uint4 raw[kBytes / 16];
    To* e = reinterpret_cast<To*>(raw);
#pragma unroll
    for (int i = 0; i < N; ++i) e[i] = qkv_from_float<To>(v[i]);
#pragma unroll
    for (int w = 0; w < kBytes / 16; ++w) reinterpret_cast<uint4*>(p)[w] = raw[w];
  } else {
    uint2 raw;
    To* e = reinterpret_cast<To*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) e[i] = qkv_from_float<To>(v[i]);
    *reinterpret_cast<uint2*>(p) = raw;
  }
}

template <typename Ti, typename To>
__global__ void __launch_bounds__(kQkvPrepThreads) qkv_prep_kernel(
    const Ti* __restrict__ qkv, int64_t qkv_row_stride, const Ti* __restrict__ cos_t, const Ti* __restrict__ sin_t,
    const int64_t* __restrict__ slots, int num_tokens, int hq, int hkv, int head_dim, To* __restrict__ q_out,
    To* __restrict__ k_cache, To* __restrict__ v_cache, int64_t cache_rows, int32_t* __restrict__ flags) {
  // PDL trigger at entry, not after the last store: a dependent's griddepcontrol.wait returns only once this
  // whole grid has completed and its memory is flushed, whatever moment we trigger at, so triggering early
  // cannot expose a partial q / cache to it; it only lets the dependent's CTAs be scheduled and run their
  // prologue (and anything independent of our outputs) while we run. Both are no-ops without the attribute.
  pdl_launch_dependents();
  // Our own inputs (the GEMM output, the tables, the slots) may come from a PDL predecessor still running.
  pdl_wait();
  constexpr int N = QkvVec<Ti>::N;
  const int half = head_dim / 2;
  const int chunks = half / N;
  const int heads = hq + 2 * hkv;
  const int64_t item = int64_t(blockIdx.x) * kQkvPrepThreads + threadIdx.x;
  if (item >= int64_t(num_tokens) * heads * chunks) return;
  const int c = int(item % chunks);
  const int h = int((item / chunks) % heads);
  const int t = int(item / (int64_t(chunks) * heads));
  const int j = c * N;  // offset in the first half; its partner is j + half

  const Ti* src = qkv + int64_t(t) * qkv_row_stride + int64_t(h) * head_dim;
  float x1[N], x2[N];
  qkv_load<Ti, N>(src + j, x1);
  qkv_load<Ti, N>(src + j + half, x2);

  To* dst;
  if (h < hq) {
    dst = q_out + (int64_t(t) * hq + h) * head_dim;
  } else {
    const int64_t slot = slots[t];
    if (slot < 0 || slot >= cache_rows) {
      if (j == 0 && h == hq) raise_flag(flags, 0x2);  // once per token
      return;
    }
    const bool is_v = h >= hq + hkv;
    const int kh = is_v ? h - hq - hkv : h - hq;
    dst = (is_v ? v_cache : k_cache) + (slot * hkv + kh) * head_dim;
    if (is_v) {
      qkv_store<To, N>(dst + j, x1);
      qkv_store<To, N>(dst + j + half, x2);
      return;
    }
  }
  float c1[N], c2[N], s1[N], s2[N];
  const int64_t tab = int64_t(t) * head_dim;
  qkv_load<Ti, N>(cos_t + tab + j, c1);
  qkv_load<Ti, N>(cos_t + tab + j + half, c2);
  qkv_load<Ti, N>(sin_t + tab + j, s1);
  qkv_load<Ti, N>(sin_t + tab + j + half, s2);
  float y1[N], y2[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    y1[i] = __fadd_rn(__fmul_rn(x1[i], c1[i]), __fmul_rn(x2[i], s1[i]));
    y2[i] = __fadd_rn(__fmul_rn(x2[i], c2[i]), __fmul_rn(x1[i], s2[i]));
  }
  qkv_store<To, N>(dst + j, y1);
  qkv_store<To, N>(dst + j + half, y2);
}

}  // namespace kernels
}  // namespace ddtree
