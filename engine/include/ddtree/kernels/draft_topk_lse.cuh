// draft_topk_lse kernels: per row of logits, the top-k log-probs (sorted, ties -> lower id) and the
// log-sum-exp over the whole row.
//
// B*L rows are few (15 for one request) and long (up to 163,840), so each row is split into chunks of
// kTopkChunk elements, one CTA each (phase 1): the CTA holds its chunk in registers, computes the chunk's
// (max, sum exp(x - max)) and selects the chunk's exact top-k items by radix select. A second kernel
// (phase 2, one CTA per row, launched with programmatic dependent launch) merges the chunks' partial
// sums into the row's lse, selects the row's top-k among the chunks' candidates, sorts them and writes
// x - lse. Every chunk contributes its own top-k, so the row's top-k is always among the candidates.
#pragma once

#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>

#include "ddtree/kernels/block_select.cuh"
#include "ddtree/kernels/common.cuh"

namespace ddtree {
namespace kernels {

constexpr int kTopkThreads = 256;           // phase-1 CTA
constexpr int kTopkPerThread = 32;          // elements each phase-1 thread holds in registers
constexpr int kTopkChunk = kTopkThreads * kTopkPerThread;  // 8192
constexpr int kTopkMaxK = 1024;
constexpr int kTopkMergeThreads = 1024;     // phase-2 CTA
constexpr int kTopkMergeCached = 16;        // candidates per phase-2 thread kept in registers

// Phase 1. grid = (chunks per row, rows). partial[row][chunk] = (chunk max, sum exp(x - chunk max)),
// max = NaN if the chunk holds a NaN or +inf. cand[row][chunk][0..k) = the chunk's top-min(k, n) items,
// the rest of the k slots zero.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kTopkThreads, 2) draft_topk_partial_kernel(
    const T* __restrict__ logits, int positions, int vocab, int64_t batch_stride, int64_t row_stride, int k,
    int num_chunks, uint64_t* __restrict__ cand, float2* __restrict__ partial, int32_t* __restrict__ flags) {
  pdl_launch_dependents();
  __shared__ SelectSmem sm;
  __shared__ float red_f[kTopkThreads / 32];
  __shared__ int red_i[kTopkThreads / 32];
  __shared__ int emitted;

  constexpr int VN = 16 / int(sizeof(T));  // elements per 16-byte vector
  constexpr int NV = kTopkPerThread / VN;  // vectors per thread
  const int row = blockIdx.y, chunk = blockIdx.x;
  const int b = row / positions, l = row - b * positions;
  const T* x = logits + int64_t(b) * batch_stride + int64_t(l) * row_stride;
  const int start = chunk * kTopkChunk;
  const int n_valid = min(kTopkChunk, vocab - start);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // Element (j, e) of this thread has id start + (j * THREADS + tid) * VN + e: coalesced 16-byte loads.
  // (common.cuh's load_row_vectors does the same; calling it here changed ptxas's register allocation of this
  // bf16 kernel, so the inline copy stays until a GPU run re-checks it.)
  uint32_t key[kTopkPerThread];
  float tmax = -INFINITY;
  int bad = 0;
  {
    uint4 raw[NV];
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int base = start + (j * kTopkThreads + int(threadIdx.x)) * VN;
      if (VEC && base + VN <= vocab) {
        raw[j] = __ldg(reinterpret_cast<const uint4*>(x + base));
      } else {
        T* e = reinterpret_cast<T*>(&raw[j]);
#pragma unroll
        for (int q = 0; q < VN; ++q) e[q] = (base + q < vocab) ? x[base + q] : T(0.0f);
      }
    }
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int base = start + (j * kTopkThreads + int(threadIdx.x)) * VN;
      const T* e = reinterpret_cast<const T*>(&raw[j]);
#pragma unroll
      for (int q = 0; q < VN; ++q) {
        const float f = to_float<T>(e[q]);
        const bool valid = base + q < vocab;
        const bool invalid_value = valid && !(f < INFINITY);  // NaN or +inf
        bad |= invalid_value;
        // -0 reads as +0: the reference orders by value, so zeros of either sign tie (lower id first).
        key[j * VN + q] = (valid && !invalid_value) ? ordered_key(f == 0.f ? 0.f : f) : 0u;
        if (valid && !invalid_value) tmax = fmaxf(tmax, f);
      }
    }
  }

  // Chunk max and NaN flag.
  tmax = warp_max(tmax);
  bad = warp_or(bad);
  if (lane == 0) {
    red_f[warp] = tmax;
    red_i[warp] = bad;
  }
  __syncthreads();
  float cmax = red_f[0];
  int cbad = red_i[0];
#pragma unroll
  for (int w = 1; w < kTopkThreads / 32; ++w) {
    cmax = fmaxf(cmax, red_f[w]);
    cbad |= red_i[w];
  }
  __syncthreads();  // red_f is reused below
  if (cbad) {
    if (threadIdx.x == 0) {
      partial[int64_t(row) * num_chunks + chunk] = make_float2(__int_as_float(0x7fc00000), 0.f);
      raise_flag(flags, 0x1);
    }
    return;
  }

  // sum exp(x - cmax) (fp32; a chunk whose elements are all -inf sums to 0).
  float s = 0.f;
  if (cmax > -INFINITY) {
#pragma unroll
    for (int i = 0; i < kTopkPerThread; ++i)
      if (key[i] != 0u) s += __expf(key_to_float(key[i]) - cmax);
  }
  s = warp_sum(s);
  if (lane == 0) red_f[warp] = s;
  if (threadIdx.x == 0) emitted = 0;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kTopkThreads / 32; ++w) total += red_f[w];
    partial[int64_t(row) * num_chunks + chunk] = make_float2(cmax, total);
  }

  const int kc = min(k, n_valid);
  // Prefilter for small k: lanes 0..k-1 of a warp hold k distinct elements, the smallest of their maxima
  // is <= the chunk's k-th largest key, and so is the largest such bound over the warps. Elements below it
  // can't be in the top k; dropping them keeps the radix histogram's atomics off the crowded middle bins.
  uint32_t floor_key = 0u;
  if (k <= 32 && kc < n_valid) {
    uint32_t lane_max = 0u;
#pragma unroll
    for (int i = 0; i < kTopkPerThread; ++i) lane_max = max(lane_max, key[i]);
    uint32_t bound = lane < k ? lane_max : 0xFFFFFFFFu;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) bound = min(bound, __shfl_xor_sync(0xffffffffu, bound, o));
    if (lane == 0) red_i[warp] = int(bound);
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kTopkThreads / 32; ++w) floor_key = max(floor_key, uint32_t(red_i[w]));
  }
  auto item_at = [&](int i) -> uint64_t {
    // Read %tid.x through volatile asm so the compiler rebuilds items in each radix pass instead of
    // hoisting all of them (2 registers each) out of the pass loop, which would spill.
    int tid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    const int j = i / VN, q = i - j * VN;
    const int id = start + (j * kTopkThreads + tid) * VN + q;
    return (key[i] != 0u && key[i] >= floor_key) ? pack_item(key[i], id) : 0ull;
  };
  uint64_t prefix = 1, mask = ~0ull;  // "every nonzero item" when the chunk has no more than k elements
  if (kc < n_valid) {
    block_select_top<kTopkThreads>(
        [&](auto f) {
#pragma unroll
          for (int i = 0; i < kTopkPerThread; ++i) f(item_at(i));
        },
        kc, sm, prefix, mask);
  }

  uint64_t* out = cand + (int64_t(row) * num_chunks + chunk) * k;
#pragma unroll
  for (int i = 0; i < kTopkPerThread; ++i) {
    const uint64_t it = item_at(i);
    const bool sel = it != 0ull && (it & mask) >= prefix;
    const unsigned bal = __ballot_sync(0xffffffffu, sel);
    int base = 0;
    if (lane == 0 && bal != 0u) base = atomicAdd(&emitted, __popc(bal));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (sel) out[base + __popc(bal & ((1u << lane) - 1u))] = it;
  }
  for (int i = kc + int(threadIdx.x); i < k; i += kTopkThreads) out[i] = 0ull;
}

// Phase 2. grid = rows, block = kTopkMergeThreads. Waits for phase 1 (programmatic dependent launch).
__global__ void __launch_bounds__(kTopkMergeThreads, 1) draft_topk_merge_kernel(
    const uint64_t* __restrict__ cand, const float2* __restrict__ partial, int num_chunks, int k, int vocab,
    float* __restrict__ top_lp, int32_t* __restrict__ top_id, float* __restrict__ lse) {
  pdl_wait();
  __shared__ SelectSmem sm;
  __shared__ uint64_t buf[kTopkMaxK];
  __shared__ float red_f[kTopkMergeThreads / 32];
  __shared__ double red_d[kTopkMergeThreads / 32];
  __shared__ int red_i[kTopkMergeThreads / 32];
  __shared__ int emitted;
  constexpr int WARPS = kTopkMergeThreads / 32;
  const int row = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float2* prow = partial + int64_t(row) * num_chunks;
  float* lp_out = top_lp + int64_t(row) * k;
  int32_t* id_out = top_id + int64_t(row) * k;

  // Row max over the chunks' maxima; any NaN chunk poisons the row.
  float m = -INFINITY;
  int bad = 0;
  for (int j = threadIdx.x; j < num_chunks; j += kTopkMergeThreads) {
    const float pm = prow[j].x;
    if (pm != pm) bad = 1;
    else m = fmaxf(m, pm);
  }
  m = warp_max(m);
  bad = warp_or(bad);
  if (lane == 0) {
    red_f[warp] = m;
    red_i[warp] = bad;
  }
  __syncthreads();
  m = red_f[0];
  bad = red_i[0];
  for (int w = 1; w < WARPS; ++w) {
    m = fmaxf(m, red_f[w]);
    bad |= red_i[w];
  }
  if (bad) {
    const float qnan = __int_as_float(0x7fc00000);
    for (int r = threadIdx.x; r < k; r += kTopkMergeThreads) {
      lp_out[r] = qnan;
      id_out[r] = -1;
    }
    if (threadIdx.x == 0) lse[row] = qnan;
    return;
  }
  // lse = m + log(sum_j s_j * exp(m_j - m)), combined in fp64 so that x - lse loses nothing here.
  double s = 0.0;
  if (m > -INFINITY) {
    for (int j = threadIdx.x; j < num_chunks; j += kTopkMergeThreads) {
      const float2 p = prow[j];
      if (p.x > -INFINITY) s += double(p.y) * exp(double(p.x) - double(m));
    }
  }
  s = warp_sum(s);
  if (lane == 0) red_d[warp] = s;
  if (threadIdx.x == 0) emitted = 0;
  __syncthreads();
  s = 0.0;
  for (int w = 0; w < WARPS; ++w) s += red_d[w];
  const double lse_d = (m > -INFINITY) ? double(m) + log(s) : -double(INFINITY);

  // Candidates: chunk j owns slots [j*k, j*k + k); unused slots are 0.
  const uint64_t* crow = cand + int64_t(row) * num_chunks * k;
  const int total = num_chunks * k;
  uint64_t cached[kTopkMergeCached];
#pragma unroll
  for (int i = 0; i < kTopkMergeCached; ++i) {
    const int g = i * kTopkMergeThreads + int(threadIdx.x);
    cached[i] = g < total ? crow[g] : 0ull;
  }
  auto for_each = [&](auto f) {
#pragma unroll
    for (int i = 0; i < kTopkMergeCached; ++i) f(cached[i]);
    // Uniform trip count across the block: f may use warp collectives.
    for (int g0 = kTopkMergeCached * kTopkMergeThreads; g0 < total; g0 += kTopkMergeThreads) {
      const int g = g0 + int(threadIdx.x);
      f(g < total ? crow[g] : 0ull);
    }
  };
  const int last_valid = vocab - (num_chunks - 1) * kTopkChunk;
  const int n_items = (num_chunks - 1) * k + min(k, last_valid);  // nonzero candidates
  const int ksel = min(k, vocab);
  uint64_t prefix = 1, mask = ~0ull;
  if (ksel < n_items) block_select_top<kTopkMergeThreads>(for_each, ksel, sm, prefix, mask);

  int P = 2;
  while (P < ksel) P <<= 1;
  for (int i = threadIdx.x; i < P; i += kTopkMergeThreads) buf[i] = 0ull;
  __syncthreads();
  for_each([&](uint64_t it) {
    const bool sel = it != 0ull && (it & mask) >= prefix;
    const unsigned bal = __ballot_sync(0xffffffffu, sel);
    int base = 0;
    if (lane == 0 && bal != 0u) base = atomicAdd(&emitted, __popc(bal));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (sel) buf[base + __popc(bal & ((1u << lane) - 1u))] = it;
  });
  block_bitonic_sort_desc<kTopkMergeThreads>(buf, P);

  for (int r = threadIdx.x; r < k; r += kTopkMergeThreads) {
    float lp = -INFINITY;
    int id = -1;
    if (r < ksel) {
      const uint64_t it = buf[r];
      const float f = key_to_float(item_key(it));
      id = item_id(it);
      lp = (f == -INFINITY) ? -INFINITY : float(double(f) - lse_d);
    }
    lp_out[r] = lp;
    id_out[r] = id;
  }
  if (threadIdx.x == 0) lse[row] = float(lse_d);
}

}  // namespace kernels
}  // namespace ddtree
