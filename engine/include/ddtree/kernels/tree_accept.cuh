// tree_accept kernels: each tree node's target token (greedy argmax or Gumbel-max sample), then the
// walk from the root along matching children, the bonus token and stop-id truncation.
//
//   1. tree_accept_tree_kernel   (grid B)          parent and depth of every node from the child lists
//   2. tree_accept_target_kernel (grid chunks,N,B) best (score, id) of one vocab chunk of one node's
//                                                  logits; the byte-bound part (reads N x V once)
//   3. tree_accept_walk_kernel   (grid B)          per step, reduce the current node's chunk partials,
//                                                  find the child holding that token; outputs
// 2 and 3 use programmatic dependent launch so that their launch overlaps the previous kernel.
//
// The Gumbel noise must equal reference/tree_accept.py's gumbel_noise bit for bit: integer hash, then a
// logarithm made only of exactly rounded float32 operations (__f*_rn: no FMA contraction).
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "ddtree/kernels/common.cuh"

namespace ddtree {
namespace kernels {

constexpr int kAcceptThreads = 256;
constexpr int kAcceptPerThread = 32;
constexpr int kAcceptChunk = kAcceptThreads * kAcceptPerThread;  // 8192 logits per CTA
constexpr int kAcceptWalkThreads = 256;
constexpr int kAcceptMaxWidth = 1024;  // max_depth + 1

__device__ __forceinline__ uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// Hash of (seed, request, position): the per-(node depth) part of the noise key.
__device__ __forceinline__ uint32_t gumbel_key(uint64_t seed, uint32_t request, uint32_t position) {
  uint32_t h = mix32(uint32_t(seed) ^ 0x9E3779B9u);
  h = mix32(h ^ uint32_t(seed >> 32));
  h = mix32(h ^ request);
  return mix32(h ^ position);
}

// log of a positive normal float, identical to reference log32 (same operations, same order).
__device__ __forceinline__ float log32(float x) {
  const int bits = __float_as_int(x);
  int e = ((bits >> 23) & 0xFF) - 127;
  float m = __int_as_float((bits & 0x7FFFFF) | 0x3F800000);
  if (m > float(1.41421356237309504880)) {
    m = __fmul_rn(m, 0.5f);
    e += 1;
  }
  const float f = __fsub_rn(m, 1.0f);
  const float s = __fdiv_rn(f, __fadd_rn(2.0f, f));
  const float z = __fmul_rn(s, s);
  float poly = float(1.0 / 11.0);
  poly = __fadd_rn(__fmul_rn(poly, z), float(1.0 / 9.0));
  poly = __fadd_rn(__fmul_rn(poly, z), float(1.0 / 7.0));
  poly = __fadd_rn(__fmul_rn(poly, z), float(1.0 / 5.0));
  poly = __fadd_rn(__fmul_rn(poly, z), float(1.0 / 3.0));
  poly = __fmul_rn(poly, z);
  const float t = __fadd_rn(s, __fmul_rn(s, poly));
  return __fadd_rn(__fmul_rn(float(e), float(0.69314718055994530942)), __fadd_rn(t, t));
}

__device__ __forceinline__ float gumbel(uint32_t key, uint32_t vocab_id) {
  const uint32_t h = mix32(mix32(key ^ vocab_id) ^ 0x5BD1E995u);
  const float u = __fmul_rn(float(h >> 8), 5.9604644775390625e-8f);  // 2^-24
  if (u == 0.f) return -INFINITY;
  return -log32(-log32(u));
}

// 1. Parents (from first_child / next_sibling) and depths of nodes 0..n-1; padding nodes get -1 / 0.
__global__ void __launch_bounds__(kAcceptWalkThreads) tree_accept_tree_kernel(
    const int32_t* __restrict__ first_child, const int32_t* __restrict__ next_sibling,
    const int32_t* __restrict__ num_nodes, int n_max, int32_t* __restrict__ parent, int32_t* __restrict__ depth,
    int32_t* __restrict__ flags) {
  pdl_launch_dependents();
  const int b = blockIdx.x;
  const int n = max(1, min(num_nodes[b], n_max));
  const int32_t* fc = first_child + int64_t(b) * n_max;
  const int32_t* ns = next_sibling + int64_t(b) * n_max;
  int32_t* par = parent + int64_t(b) * n_max;
  int32_t* dep = depth + int64_t(b) * n_max;
  for (int i = threadIdx.x; i < n_max; i += blockDim.x) par[i] = -1;
  __syncthreads();
  for (int p = threadIdx.x; p < n; p += blockDim.x) {
    int c = fc[p];
    for (int guard = 0; c != -1 && guard < n; ++guard) {
      if (c <= p || c >= n) {  // children come after their parent in pop order
        raise_flag(flags, 0x2);
        break;
      }
      par[c] = p;
      c = ns[c];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n_max; i += blockDim.x) {
    int d = 0;
    if (i < n) {
      int j = i;
      while (j > 0 && d <= n) {
        j = par[j];
        ++d;
      }
      if (j != 0) {  // not connected to the root
        raise_flag(flags, 0x2);
        d = 0;
      }
    }
    dep[i] = d;
  }
}

// 2. partial[b][i][chunk] = best pack_item(key(score), id) over the chunk (0 = only NaN seen).
template <typename T, bool VEC>
__global__ void __launch_bounds__(kAcceptThreads) tree_accept_target_kernel(
    const T* __restrict__ logits, int64_t batch_stride, int64_t row_stride, int vocab, int n_max,
    const int32_t* __restrict__ num_nodes, const int32_t* __restrict__ ctx_len, const float* __restrict__ temperature,
    const int64_t* __restrict__ seed, const int32_t* __restrict__ depth, int num_chunks,
    uint64_t* __restrict__ partial, int32_t* __restrict__ flags) {
  pdl_launch_dependents();
  __shared__ uint64_t red[kAcceptThreads / 32];
  constexpr int VN = 16 / int(sizeof(T));
  constexpr int NV = kAcceptPerThread / VN;
  const int chunk = blockIdx.x, i = blockIdx.y, b = blockIdx.z;
  const int n = max(1, min(num_nodes[b], n_max));
  if (i >= n) {
    pdl_wait();  // every CTA waits once, so this grid's completion implies kernel 1's
    return;
  }
  const T* x = logits + int64_t(b) * batch_stride + int64_t(i) * row_stride;
  const int start = chunk * kAcceptChunk;
  uint4 raw[NV];
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int base = start + (j * kAcceptThreads + int(threadIdx.x)) * VN;
    if (VEC && base + VN <= vocab) {
      raw[j] = __ldg(reinterpret_cast<const uint4*>(x + base));
    } else {
      T* e = reinterpret_cast<T*>(&raw[j]);
#pragma unroll
      for (int q = 0; q < VN; ++q) e[q] = (base + q < vocab) ? x[base + q] : T(0.0f);
    }
  }
  const float temp = temperature[b];
  const bool sample = temp > 0.f;  // 0, negative or NaN: greedy
  pdl_wait();                      // depth comes from kernel 1
  uint32_t key = 0;
  if (sample) key = gumbel_key(uint64_t(seed[b]), uint32_t(b), uint32_t(ctx_len[b] + depth[int64_t(b) * n_max + i] + 1));
  uint64_t best = 0;
  int bad = 0;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int base = start + (j * kAcceptThreads + int(threadIdx.x)) * VN;
    const T* e = reinterpret_cast<const T*>(&raw[j]);
#pragma unroll
    for (int q = 0; q < VN; ++q) {
      const int id = base + q;
      if (id < vocab) {
        float s = to_float<T>(e[q]);
        if (s != s) {
          bad = 1;
          continue;
        }
        if (sample) s = __fadd_rn(__fdiv_rn(s, temp), gumbel(key, uint32_t(id)));
        const uint64_t it = pack_item(ordered_key(s), id);
        best = it > best ? it : best;
      }
    }
  }
  best = warp_max_u64(best);
  bad = warp_or(bad);
  if (bad && (threadIdx.x & 31) == 0) raise_flag(flags, 0x1);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t m = red[0];
#pragma unroll
    for (int w = 1; w < kAcceptThreads / 32; ++w) m = red[w] > m ? red[w] : m;
    partial[(int64_t(b) * n_max + i) * num_chunks + chunk] = m;
  }
}

// 3. The walk. One CTA per request.
__global__ void __launch_bounds__(kAcceptWalkThreads) tree_accept_walk_kernel(
    const uint64_t* __restrict__ partial, int num_chunks, const int32_t* __restrict__ node_token,
    const int32_t* __restrict__ parent, const int32_t* __restrict__ num_nodes, int n_max, const int32_t* __restrict__ stop_ids,
    int num_stop, int width, int32_t* __restrict__ accept_nodes, int32_t* __restrict__ accept_len,
    int32_t* __restrict__ committed_ids, int32_t* __restrict__ bonus, int32_t* __restrict__ finished) {
  pdl_wait();
  __shared__ int path[kAcceptMaxWidth];
  __shared__ int s_target, s_found;
  const int b = blockIdx.x;
  const int n = max(1, min(num_nodes[b], n_max));
  const int32_t* tok = node_token + int64_t(b) * n_max;
  const int32_t* par = parent + int64_t(b) * n_max;
  const int lane = threadIdx.x & 31;
  int cur = 0, len = 1, target = -1;
  if (threadIdx.x == 0) path[0] = 0;
  while (true) {
    if (threadIdx.x < 32) {
      const uint64_t* p = partial + (int64_t(b) * n_max + cur) * num_chunks;
      uint64_t m = 0;
      for (int c = lane; c < num_chunks; c += 32) m = p[c] > m ? p[c] : m;
      m = warp_max_u64(m);
      if (lane == 0) {
        s_target = m != 0 ? item_id(m) : -1;
        s_found = INT_MAX;
      }
    }
    __syncthreads();
    target = s_target;
    if (len == width) break;
    for (int j = 1 + int(threadIdx.x); j < n; j += blockDim.x)
      if (par[j] == cur && tok[j] == target) atomicMin(&s_found, j);
    __syncthreads();
    const int found = s_found;
    __syncthreads();  // s_found / s_target are rewritten in the next step
    if (found == INT_MAX) break;
    if (threadIdx.x == 0) path[len] = found;
    ++len;
    cur = found;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // New tokens: the accepted non-root nodes' tokens, then the bonus; cut right after a stop id.
    int count = len, done = 0, last = target;
    for (int t = 0; t < len && !done; ++t) {
      const int token = t + 1 < len ? tok[path[t + 1]] : target;
      for (int s = 0; s < num_stop; ++s) {
        if (stop_ids[s] == token) {
          count = t + 1;
          last = token;
          done = 1;
          break;
        }
      }
    }
    accept_len[b] = count;
    bonus[b] = last;
    finished[b] = done;
    s_found = count;
  }
  __syncthreads();
  const int count = s_found;
  int32_t* an = accept_nodes + int64_t(b) * width;
  int32_t* ci = committed_ids + int64_t(b) * width;
  for (int t = threadIdx.x; t < width; t += blockDim.x) {
    an[t] = t < count ? path[t] : -1;
    ci[t] = t < count ? (t + 1 < len ? tok[path[t + 1]] : target) : -1;
  }
}

}  // namespace kernels
}  // namespace ddtree
