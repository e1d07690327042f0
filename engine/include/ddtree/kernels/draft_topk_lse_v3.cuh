// draft_topk_lse v3 kernels, for k <= 64 (the launcher keeps v2, draft_topk_lse.cuh, for larger k and
// as the fallback selected with DDTREE_TOPK_IMPL=v2).
//
// Why v3 (engine/bench/NOTES.md, "v3 analysis"): v2's phase 1 spends ~80 instructions per logit in up to
// six radix passes over all 32 register-held items of every thread (histogram atomics, 64-bit packing,
// six barriers per pass), at 2 CTAs/SM (124 registers), so 300 CTAs need two waves of a ~15 µs CTA.
// v3 keeps the same split of a row into chunks but does ~7 instructions per logit:
//
// Phase 1, one CTA of 256 threads per chunk (4 x 16-byte vectors per thread: 8,192 bf16 / 4,096 fp32
// logits), at most 80 registers so that 3 CTAs fit per SM and a 15 x 163,840 bf16 call (300 CTAs) is
// one wave on 132 SMs:
//   1. online (max, sum exp) per 16-byte vector; NaN or +inf poison the sum (checked once per CTA);
//   2. a lower bound T on the chunk's k-th largest key from the threads' maxima: if at least k threads
//      have a maximum >= v, then k distinct logits are >= v. k <= 16: counted within each warp (32
//      shuffles; T = the best warp's); 16 < k <= 64: counted over all 256 threads in shared memory;
//   3. every logit >= T (usually a few dozen; 1-2 for k = 1) is appended to shared memory; a whole
//      vector is skipped when its maximum is below T, so this costs ~1 compare per vector;
//   4. exact ranks among those candidates by counting (items are distinct (key, id) pairs), the
//      chunk's top-min(k, n) written sorted to its 64-item slot. If more than kV3Cap candidates
//      survive (tie-heavy rows), the block radix select of v2 runs on the register-held logits instead.
// Phase 2, one CTA of 256 threads per row (programmatic dependent launch): lse from the chunks'
//   partials in fp64; a lower bound on the row's ksel-th item (the best of the chunks' ksel-th items);
//   the items above it (a few dozen) are ranked by counting and written. Radix select over all chunk
//   items when more than kV3MergeCap survive.
#pragma once

#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>

#include "ddtree/kernels/block_select.cuh"
#include "ddtree/kernels/common.cuh"

// The CPU emulation test (engine/tests/test_draft_topk_lse_v3_emu.py) counts how often each fallback ran.
#ifndef DDTREE_TOPK_V3_EVENT
#define DDTREE_TOPK_V3_EVENT(name) ((void)0)
#endif

namespace ddtree {
namespace kernels {

constexpr int kV3Threads = 256;
constexpr int kV3Vecs = 4;        // 16-byte vectors per thread
constexpr int kV3MaxK = 64;       // v3 handles k <= 64
constexpr int kV3WarpBoundK = 16;  // k <= 16: bound from one warp's lane maxima; above: from all 256 threads
constexpr int kV3Slot = 64;       // items per chunk in the workspace (sorted, the first min(k, n) valid)
constexpr int kV3Cap = 256;       // phase-1 candidates ranked by counting
constexpr int kV3MergeThreads = 256;
constexpr int kV3MergeCap = 1024;  // phase-2 candidates ranked by counting

template <typename T>
constexpr int v3_chunk() {
  return kV3Threads * kV3Vecs * (16 / int(sizeof(T)));
}
constexpr int kV3MinChunk = kV3Threads * kV3Vecs * 4;  // fp32: the most chunks per row (workspace sizing)

// Number of valid logits of chunk c.
__device__ __forceinline__ int v3_chunk_valid(int c, int chunk, int vocab) { return min(chunk, vocab - c * chunk); }

// Phase 1. grid = (chunks per row, rows). partial[row][c] = (chunk max, sum exp(x - max)), both NaN if the
// chunk holds NaN or +inf. cand[row][c][0..min(k, n)) = the chunk's best items, sorted descending.
// The element-wise load path (rows not 16-byte aligned, rare) gets 2 CTAs/SM: at 80 registers its
// scalar loads and the radix fallback spill on sm_90a.
template <typename T, bool VEC>
__global__ void __launch_bounds__(kV3Threads, VEC ? 3 : 2) draft_topk_partial_v3_kernel(
    const T* __restrict__ logits, int positions, int vocab, int64_t batch_stride, int64_t row_stride, int k,
    int num_chunks, uint64_t* __restrict__ cand, float2* __restrict__ partial, int32_t* __restrict__ flags) {
  pdl_launch_dependents();
  __shared__ SelectSmem sm;  // fallback radix select only
  __shared__ uint64_t cbuf[kV3Cap];
  alignas(16) __shared__ uint32_t lmax[kV3Threads];
  __shared__ float red_m[kV3Threads / 32], red_s[kV3Threads / 32];
  __shared__ uint32_t red_t[kV3Threads / 32];
  __shared__ int emitted;

  constexpr int VN = 16 / int(sizeof(T));
  constexpr int CHUNK = v3_chunk<T>();
  const int row = blockIdx.y, chunk = blockIdx.x;
  const int b = row / positions, l = row - b * positions;
  const T* x = logits + int64_t(b) * batch_stride + int64_t(l) * row_stride;
  const int start = chunk * CHUNK;
  const int n_valid = min(CHUNK, vocab - start);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0) emitted = 0;

  // All loads issued before the first use: element (j, q) has id start + (j * THREADS + tid) * VN + q.
  uint4 raw[kV3Vecs];
  load_row_vectors<T, VEC, kV3Vecs, kV3Threads>(x, start, vocab, raw);

  // Online max / sum exp per vector. fmaxf drops NaN from the max but exp(NaN - m) poisons the sum, and
  // +inf makes m = +inf and exp(inf - inf) = NaN: s is NaN iff the thread saw NaN or +inf.
  float m = -INFINITY, s = 0.f;
  uint32_t vkey[kV3Vecs];  // key of each vector's maximum, 0 when the vector holds no valid logit
#pragma unroll
  for (int j = 0; j < kV3Vecs; ++j) {
    const int base = start + (j * kV3Threads + int(threadIdx.x)) * VN;
    const T* e = reinterpret_cast<const T*>(&raw[j]);
    float vm = -INFINITY;
#pragma unroll
    for (int q = 0; q < VN; ++q)
      if (base + q < vocab) vm = fmaxf(vm, to_float<T>(e[q]));
    vkey[j] = base < vocab ? ordered_key(vm == 0.f ? 0.f : vm) : 0u;  // -0 reads as +0 (as item keys)
    const float mn = fmaxf(m, vm);
    const float ms = mn == -INFINITY ? 0.f : mn;  // all -inf so far: every term is exp(-inf) = 0
    s *= __expf(m - ms);
    m = mn;
#pragma unroll
    for (int q = 0; q < VN; ++q)
      if (base + q < vocab) s += __expf(to_float<T>(e[q]) - ms);
  }

  // Block (max, sum) combine.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    const float mn = fmaxf(m, m2);
    const float ms = mn == -INFINITY ? 0.f : mn;
    s = s * __expf(m - ms) + s2 * __expf(m2 - ms);
    m = mn;
  }
  if (lane == 0) {
    red_m[warp] = m;
    red_s[warp] = s;
  }
  __syncthreads();
  float cm = red_m[0], cs = red_s[0];
#pragma unroll
  for (int w = 1; w < kV3Threads / 32; ++w) {
    const float mn = fmaxf(cm, red_m[w]);
    const float ms = mn == -INFINITY ? 0.f : mn;
    cs = cs * __expf(cm - ms) + red_s[w] * __expf(red_m[w] - ms);
    cm = mn;
  }
  float2* pout = partial + int64_t(row) * num_chunks + chunk;
  if (cs != cs) {  // block-uniform: every thread read the same values
    if (threadIdx.x == 0) {
      *pout = make_float2(__int_as_float(0x7fc00000), __int_as_float(0x7fc00000));
      raise_flag(flags, 0x1);
    }
    return;
  }
  if (threadIdx.x == 0) *pout = make_float2(cm, cs);

  // Lower bound T on the chunk's kc-th largest key (any value works when the chunk has <= k logits).
  const int kc = min(k, n_valid);
  uint32_t lane_key = 0u;
#pragma unroll
  for (int j = 0; j < kV3Vecs; ++j) lane_key = max(lane_key, vkey[j]);
  uint32_t bound = lane_key;
  if (k > 1 && k <= kV3WarpBoundK) {
    int ge = 0;  // lanes of this warp whose maximum is >= this lane's
    for (int o = 0; o < 32; ++o) ge += __shfl_sync(0xffffffffu, lane_key, o) >= lane_key;
    if (ge < k) bound = 0u;
  } else if (k > kV3WarpBoundK) {
    // Larger k: the k-th largest of all 256 thread maxima (k threads hold k distinct logits >= it).
    lmax[threadIdx.x] = lane_key;
    __syncthreads();
    const uint4* l4 = reinterpret_cast<const uint4*>(lmax);
    int ge = 0;
#pragma unroll 4
    for (int i = 0; i < kV3Threads / 4; ++i) {
      const uint4 v = l4[i];
      ge += int(v.x >= lane_key) + int(v.y >= lane_key) + int(v.z >= lane_key) + int(v.w >= lane_key);
    }
    if (ge < k) bound = 0u;
  }
  bound = __reduce_max_sync(0xffffffffu, bound);
  if (lane == 0) red_t[warp] = bound;
  __syncthreads();
  uint32_t thr = 1u;  // key 0 = no logit; 1 admits every valid one
  if (kc < n_valid) {
#pragma unroll
    for (int w = 0; w < kV3Threads / 32; ++w) thr = max(thr, red_t[w]);
  }

  auto item_at = [&](int j, int q) -> uint64_t {
    const int id = start + (j * kV3Threads + int(threadIdx.x)) * VN + q;
    if (id >= vocab) return 0ull;
    const float f = to_float<T>(reinterpret_cast<const T*>(&raw[j])[q]);
    const uint32_t key = ordered_key(f == 0.f ? 0.f : f);  // -0 and +0 tie (lower id first), as in the reference
    return key >= thr ? pack_item(key, id) : 0ull;
  };
  auto append = [&](uint64_t it) {  // warp-uniform call
    const bool sel = it != 0ull;
    const unsigned bal = __ballot_sync(0xffffffffu, sel);
    if (bal == 0u) return;
    int base = 0;
    if (lane == 0) base = atomicAdd(&emitted, __popc(bal));
    base = __shfl_sync(0xffffffffu, base, 0);
    const int pos = base + __popc(bal & ((1u << lane) - 1u));
    if (sel && pos < kV3Cap) cbuf[pos] = it;
  };

  // Candidates: every logit >= thr (whole vectors below thr skipped).
#pragma unroll
  for (int j = 0; j < kV3Vecs; ++j) {
    if (__any_sync(0xffffffffu, vkey[j] >= thr)) {
#pragma unroll
      for (int q = 0; q < VN; ++q) append(item_at(j, q));
    }
  }
  __syncthreads();
  int n = emitted;
  if (n > kV3Cap) {
    if (threadIdx.x == 0) DDTREE_TOPK_V3_EVENT(partial_radix);
    // Too many (ties around thr): exact top-kc of the chunk by radix select over the register items.
    uint64_t prefix, mask;
    block_select_top<kV3Threads>(
        [&](auto f) {
#pragma unroll
          for (int j = 0; j < kV3Vecs; ++j)
#pragma unroll
            for (int q = 0; q < VN; ++q) f(item_at(j, q));
        },
        kc, sm, prefix, mask);
    if (threadIdx.x == 0) emitted = 0;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kV3Vecs; ++j)
#pragma unroll
      for (int q = 0; q < VN; ++q) {
        const uint64_t it = item_at(j, q);
        append((it != 0ull && (it & mask) >= prefix) ? it : 0ull);
      }
    __syncthreads();
    n = kc;
  }

  // Rank by counting: the candidates are distinct and hold the chunk's top kc.
  uint64_t* out = cand + (int64_t(row) * num_chunks + chunk) * kV3Slot;
  for (int p = threadIdx.x; p < n; p += kV3Threads) {
    const uint64_t it = cbuf[p];
    int rank = 0;
    for (int q = 0; q < n; ++q) rank += cbuf[q] > it;
    if (rank < kc) out[rank] = it;
  }
}

// Phase 2. grid = rows, block = kV3MergeThreads. Waits for phase 1 (programmatic dependent launch).
template <int CHUNK>
__global__ void __launch_bounds__(kV3MergeThreads) draft_topk_merge_v3_kernel(
    const uint64_t* __restrict__ cand, const float2* __restrict__ partial, int num_chunks, int k, int vocab,
    float* __restrict__ top_lp, int32_t* __restrict__ top_id, float* __restrict__ lse) {
  pdl_wait();
  __shared__ SelectSmem sm;  // fallback radix select only
  __shared__ uint64_t sbuf[kV3MergeCap];
  __shared__ float red_f[kV3MergeThreads / 32];
  __shared__ double red_d[kV3MergeThreads / 32];
  __shared__ int red_i[kV3MergeThreads / 32];
  __shared__ uint64_t red_u[kV3MergeThreads / 32];
  __shared__ int emitted;
  constexpr int WARPS = kV3MergeThreads / 32;
  const int row = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float2* prow = partial + int64_t(row) * num_chunks;
  const uint64_t* crow = cand + int64_t(row) * num_chunks * kV3Slot;
  float* lp_out = top_lp + int64_t(row) * k;
  int32_t* id_out = top_id + int64_t(row) * k;
  const int ksel = min(k, vocab);

  // Row max over the chunks' maxima (a NaN partial poisons the row), and the bound on the ksel-th item:
  // the best of the ksel-th items of the chunks that hold at least ksel logits.
  float m = -INFINITY;
  int bad = 0;
  uint64_t tb = 0ull;
  for (int c = threadIdx.x; c < num_chunks; c += kV3MergeThreads) {
    const float pm = prow[c].x;
    if (pm != pm) bad = 1;
    else m = fmaxf(m, pm);
    if (min(k, v3_chunk_valid(c, CHUNK, vocab)) >= ksel) {
      const uint64_t it = crow[int64_t(c) * kV3Slot + ksel - 1];
      tb = it > tb ? it : tb;
    }
  }
  m = warp_max(m);
  bad = warp_or(bad);
  tb = warp_max_u64(tb);
  if (lane == 0) {
    red_f[warp] = m;
    red_i[warp] = bad;
    red_u[warp] = tb;
  }
  if (threadIdx.x == 0) emitted = 0;
  __syncthreads();
  m = red_f[0];
  bad = red_i[0];
  tb = red_u[0];
  for (int w = 1; w < WARPS; ++w) {
    m = fmaxf(m, red_f[w]);
    bad |= red_i[w];
    tb = red_u[w] > tb ? red_u[w] : tb;
  }
  if (bad) {
    const float qnan = __int_as_float(0x7fc00000);
    for (int r = threadIdx.x; r < k; r += kV3MergeThreads) {
      lp_out[r] = qnan;
      id_out[r] = -1;
    }
    if (threadIdx.x == 0) lse[row] = qnan;
    return;
  }
  // lse = m + log(sum_c s_c * exp(m_c - m)) in fp64 (as v2).
  double s = 0.0;
  if (m > -INFINITY) {
    for (int c = threadIdx.x; c < num_chunks; c += kV3MergeThreads) {
      const float2 p = prow[c];
      if (p.x > -INFINITY) s += double(p.y) * exp(double(p.x) - double(m));
    }
  }
  s = warp_sum(s);
  if (lane == 0) red_d[warp] = s;
  __syncthreads();
  s = 0.0;
  for (int w = 0; w < WARPS; ++w) s += red_d[w];
  const double lse_d = (m > -INFINITY) ? double(m) + log(s) : -double(INFINITY);

  // Items >= tb from every chunk's slot (uniform trip count: the loops below use warp collectives).
  const int total = num_chunks * kV3Slot;
  auto item_at = [&](int g) -> uint64_t {
    if (g >= total) return 0ull;
    const int c = g / kV3Slot, i = g - c * kV3Slot;
    if (i >= min(k, v3_chunk_valid(c, CHUNK, vocab))) return 0ull;
    const uint64_t it = crow[g];
    return it >= tb ? it : 0ull;
  };
  auto append = [&](uint64_t it) {
    const bool sel = it != 0ull;
    const unsigned bal = __ballot_sync(0xffffffffu, sel);
    if (bal == 0u) return;
    int base = 0;
    if (lane == 0) base = atomicAdd(&emitted, __popc(bal));
    base = __shfl_sync(0xffffffffu, base, 0);
    const int pos = base + __popc(bal & ((1u << lane) - 1u));
    if (sel && pos < kV3MergeCap) sbuf[pos] = it;
  };
  for (int g0 = 0; g0 < total; g0 += kV3MergeThreads) append(item_at(g0 + int(threadIdx.x)));
  __syncthreads();
  int n = emitted;
  if (n > kV3MergeCap) {
    if (threadIdx.x == 0) DDTREE_TOPK_V3_EVENT(merge_radix);
    uint64_t prefix, mask;
    block_select_top<kV3MergeThreads>(
        [&](auto f) {
          for (int g0 = 0; g0 < total; g0 += kV3MergeThreads) f(item_at(g0 + int(threadIdx.x)));
        },
        ksel, sm, prefix, mask);
    if (threadIdx.x == 0) emitted = 0;
    __syncthreads();
    for (int g0 = 0; g0 < total; g0 += kV3MergeThreads) {
      const uint64_t it = item_at(g0 + int(threadIdx.x));
      append((it != 0ull && (it & mask) >= prefix) ? it : 0ull);
    }
    __syncthreads();
    n = ksel;
  }

  for (int p = threadIdx.x; p < n; p += kV3MergeThreads) {
    const uint64_t it = sbuf[p];
    int rank = 0;
    for (int q = 0; q < n; ++q) rank += sbuf[q] > it;
    if (rank < ksel) {
      const float f = key_to_float(item_key(it));
      lp_out[rank] = (f == -INFINITY) ? -INFINITY : float(double(f) - lse_d);
      id_out[rank] = item_id(it);
    }
  }
  for (int r = ksel + int(threadIdx.x); r < k; r += kV3MergeThreads) {
    lp_out[r] = -INFINITY;
    id_out[r] = -1;
  }
  if (threadIdx.x == 0) lse[row] = float(lse_d);
}

}  // namespace kernels
}  // namespace ddtree
