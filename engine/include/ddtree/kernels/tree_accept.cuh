// tree_accept kernels: each tree node's target token (greedy argmax or Gumbel-max sample), then the
// walk from the root along matching children, the bonus token and stop-id truncation.
//
// Two launch plans with the same results:
//
// fused (the default, n_max <= kAcceptFusedMaxNodes): ONE launch of tree_accept_fused_kernel, grid
//   (chunks, N, B). Each CTA writes the best (score, id) of one vocab chunk of one node's logits, then
//   counts itself in the request's arrival counter; the request's last CTA reads every partial, derives
//   parents from the child lists in shared memory, and walks. Counters: one u32 per request, zero
//   before the first call, returned to zero by the last CTA (so a CUDA graph can replay the launch).
//   Sampling CTAs derive their node's depth (the noise key needs it) from the child lists themselves.
//   Why: the split plan's three launches were latency chains of dependent global reads (parents, then
//   depths, then one partial and one child search per walk step): 10-18 us per round on the H200 for
//   a 17-65-node tree over a 320-token vocab (the fused kernel: 7.4-10.1 us), far more than the logits
//   take to read.
// split (n_max > kAcceptFusedMaxNodes, or DDTREE_ACCEPT_IMPL=split):
//   1. tree_accept_tree_kernel   (grid B)          parent and depth of every node from the child lists
//   2. tree_accept_target_kernel (grid chunks,N,B) the same per-chunk partials as the fused kernel
//   3. tree_accept_walk_kernel   (grid B)          per step, reduce the current node's chunk partials,
//                                                  find the child holding that token; outputs
//   2 and 3 use programmatic dependent launch so that their launch overlaps the previous kernel.
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
constexpr int kAcceptFusedMaxNodes = 1024;  // n_max of the fused plan (its last CTA holds the tree in smem)
constexpr int kAcceptStopsInSmem = 64;      // stop ids the fused walk stages in shared memory

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

// Stop-id truncation of a round's new tokens: token_at(s), s < len, is new token s (the accepted
// non-root nodes' tokens, then the bonus `target`); the tokens are cut right after the first stop id.
// Returns the number kept and sets *last (the bonus: the stop id, or target) and *done.
template <typename TokenAt, typename StopAt>
__device__ __forceinline__ int cut_at_stop(int len, int target, TokenAt token_at, StopAt stop_at, int num_stop,
                                           int* last, int* done) {
  int count = len, found = 0, bonus = target;
  for (int s = 0; s < len && !found; ++s) {
    const int token = token_at(s);
    for (int q = 0; q < num_stop; ++q) {
      if (stop_at(q) == token) {
        count = s + 1;
        bonus = token;
        found = 1;
        break;
      }
    }
  }
  *last = bonus;
  *done = found;
  return count;
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

// One CTA's vocab chunk of one node's logits: loaded into registers first (the loads overlap whatever
// the caller does before scoring them), then scored. best() gives the thread's best
// pack_item(key(score), id) (0 = only NaN seen) and sets *bad on NaN.
template <typename T, bool VEC>
struct ChunkLogits {
  static constexpr int VN = 16 / int(sizeof(T));
  static constexpr int NV = kAcceptPerThread / VN;
  uint4 raw[NV];

  __device__ __forceinline__ void load(const T* __restrict__ x, int start, int vocab) {
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
  }

  __device__ __forceinline__ uint64_t best(int start, int vocab, bool sample, float temp, uint32_t key,
                                           int* bad) const {
    uint64_t top = 0;
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
            *bad = 1;
            continue;
          }
          if (sample) s = __fadd_rn(__fdiv_rn(s, temp), gumbel(key, uint32_t(id)));
          const uint64_t it = pack_item(ordered_key(s), id);
          top = it > top ? it : top;
        }
      }
    }
    return top;
  }
};

// The CTA's maximum of every thread's `best` (valid in thread 0); raises the NaN flag once per warp.
__device__ __forceinline__ uint64_t block_best(uint64_t best, int bad, uint64_t* red, int32_t* flags) {
  best = warp_max_u64(best);
  bad = warp_or(bad);
  if (bad && (threadIdx.x & 31) == 0) raise_flag(flags, 0x1);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = best;
  __syncthreads();
  uint64_t m = red[0];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 1; w < kAcceptThreads / 32; ++w) m = red[w] > m ? red[w] : m;
  }
  return m;
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
  const int chunk = blockIdx.x, i = blockIdx.y, b = blockIdx.z;
  const int n = max(1, min(num_nodes[b], n_max));
  if (i >= n) {
    pdl_wait();  // every CTA waits once, so this grid's completion implies kernel 1's
    return;
  }
  const int start = chunk * kAcceptChunk;
  ChunkLogits<T, VEC> chunk_logits;
  chunk_logits.load(logits + int64_t(b) * batch_stride + int64_t(i) * row_stride, start, vocab);
  const float temp = temperature[b];
  const bool sample = temp > 0.f;  // 0, negative or NaN: greedy
  pdl_wait();                      // depth comes from kernel 1
  uint32_t key = 0;
  if (sample) key = gumbel_key(uint64_t(seed[b]), uint32_t(b), uint32_t(ctx_len[b] + depth[int64_t(b) * n_max + i] + 1));
  int bad = 0;
  const uint64_t best = chunk_logits.best(start, vocab, sample, temp, key, &bad);
  const uint64_t m = block_best(best, bad, red, flags);
  if (threadIdx.x == 0) partial[(int64_t(b) * n_max + i) * num_chunks + chunk] = m;
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
    int last, done;
    const int count = cut_at_stop(
        len, target, [&](int t) { return t + 1 < len ? tok[path[t + 1]] : target; },
        [&](int q) { return stop_ids[q]; }, num_stop, &last, &done);
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

// ---- the fused plan -------------------------------------------------------------------------------

// atom.add with acquire-release semantics at GPU scope (sm_70+): one instruction instead of a
// __threadfence() followed by a relaxed atomicAdd.
__device__ __forceinline__ uint32_t atomic_add_acq_rel_gpu(uint32_t* addr, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(addr), "r"(v) : "memory");
  return old;
}

// One request's tree in shared memory (the fused kernel's last CTA; sampling CTAs use fc/ns/par).
struct AcceptTreeSmem {
  int32_t fc[kAcceptFusedMaxNodes], ns[kAcceptFusedMaxNodes], par[kAcceptFusedMaxNodes];
  int32_t tok[kAcceptFusedMaxNodes], tgt[kAcceptFusedMaxNodes], next[kAcceptFusedMaxNodes];
  int32_t path[kAcceptMaxWidth];
  int32_t info[16];  // the walk's results (WalkResult) and a round tail's prefetched slot state
};

// What the last CTA's walk decided for its request (the values it wrote to the outputs).
struct WalkResult {
  int count;   // accept_len: accepted nodes incl. the root, after stop-id truncation
  int len;     // accepted nodes before truncation (path[0..len))
  int target;  // the last accepted node's target token
  int last;    // bonus
  int done;    // finished
};

// The fused kernel without a round tail: the accept outputs are the kernel's only effect.
struct NoRoundTail {
  __device__ __forceinline__ void prefetch(AcceptTreeSmem&, int) const {}
  __device__ __forceinline__ void operator()(AcceptTreeSmem&, int, int, const WalkResult&, int32_t*) const {}
};

// par[] of nodes 0..n-1 from the child lists already in t.fc / t.ns (t.par preset to -1; -1 stays for
// the root and unreached nodes). With `check`, raises DDTREE_FLAG_BAD_INDEX on a child that does not
// come after its parent, as the split plan does. Ends with a block barrier.
__device__ __forceinline__ void link_parents(AcceptTreeSmem& t, int n, bool check, int32_t* __restrict__ flags) {
  for (int p = threadIdx.x; p < n; p += blockDim.x) {
    int c = t.fc[p];
    for (int guard = 0; c != -1 && guard < n; ++guard) {
      if (c <= p || c >= n) {  // children come after their parent in pop order
        if (check) raise_flag(flags, 0x2);
        break;
      }
      t.par[c] = p;
      c = t.ns[c];
    }
  }
  __syncthreads();
}

// A sampling CTA's parents: loads nodes 0..n-1's child lists, then link_parents without raising flags
// (the request's last CTA checks the tree once). Ends with a block barrier.
__device__ __forceinline__ void load_parents(AcceptTreeSmem& t, const int32_t* __restrict__ fc,
                                             const int32_t* __restrict__ ns, int n) {
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    t.fc[j] = fc[j];
    t.ns[j] = ns[j];
    t.par[j] = -1;
  }
  __syncthreads();
  link_parents(t, n, false, nullptr);
}

// Depth of node i from par[] (0 when it is not connected to the root; the last CTA flags that).
__device__ __forceinline__ int node_depth_of(const AcceptTreeSmem& t, int i, int n) {
  int d = 0, j = i;
  while (j > 0 && d <= n) {
    j = t.par[j];
    ++d;
  }
  return j == 0 ? d : 0;
}

// The last CTA of request b: every node's target token from the chunk partials, the walk along the
// first child holding its parent's target, stop-id truncation, outputs (the split plan's semantics).
// All of the request's global inputs are read in one pass (one memory round trip on the critical path).
// Returns the walk's results to every thread (after a block barrier).
__device__ __forceinline__ WalkResult accept_walk_in_smem(
    AcceptTreeSmem& t, const uint64_t* __restrict__ partial, int num_chunks, int b, int n, int n_max,
    const int32_t* __restrict__ node_token, const int32_t* __restrict__ first_child,
    const int32_t* __restrict__ next_sibling, const int32_t* __restrict__ stop_ids, int num_stop, int width,
    int32_t* __restrict__ accept_nodes, int32_t* __restrict__ accept_len, int32_t* __restrict__ committed_ids,
    int32_t* __restrict__ bonus, int32_t* __restrict__ finished, int32_t* __restrict__ flags) {
  const int64_t row0 = int64_t(b) * n_max;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const uint64_t* p = partial + (row0 + j) * num_chunks;
    uint64_t m = 0;
    for (int c = 0; c < num_chunks; ++c) {
      const uint64_t v = __ldcg(p + c);  // written by other CTAs of this launch: read through L2
      m = v > m ? v : m;
    }
    t.tok[j] = node_token[row0 + j];
    t.fc[j] = first_child[row0 + j];
    t.ns[j] = next_sibling[row0 + j];
    t.tgt[j] = m != 0 ? item_id(m) : -1;
    t.par[j] = -1;
    t.next[j] = INT_MAX;
  }
  int* stops = t.path + kAcceptMaxWidth - kAcceptStopsInSmem;  // path's tail until the walk needs it
  const bool stops_in_smem = num_stop <= kAcceptStopsInSmem && width <= kAcceptMaxWidth - kAcceptStopsInSmem;
  if (stops_in_smem)
    for (int q = threadIdx.x; q < num_stop; q += blockDim.x) stops[q] = stop_ids[q];
  __syncthreads();
  link_parents(t, n, true, flags);
  for (int j = 1 + int(threadIdx.x); j < n; j += blockDim.x) {
    const int p = t.par[j];
    if (p < 0) {
      raise_flag(flags, 0x2);  // not connected to the root
      continue;
    }
    if (node_depth_of(t, j, n) == 0) raise_flag(flags, 0x2);
    if (t.tok[j] == t.tgt[p]) atomicMin(&t.next[p], j);  // the first matching child in pop order
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int cur = 0, len = 1;
    t.path[0] = 0;
    while (len < width && t.next[cur] != INT_MAX) {
      cur = t.next[cur];
      t.path[len++] = cur;
    }
    const int target = t.tgt[cur];
    int last, done;
    const int count = cut_at_stop(
        len, target, [&](int s) { return s + 1 < len ? t.tok[t.path[s + 1]] : target; },
        [&](int q) { return stops_in_smem ? stops[q] : stop_ids[q]; }, num_stop, &last, &done);
    accept_len[b] = count;
    bonus[b] = last;
    finished[b] = done;
    t.info[0] = count;  // broadcast
    t.info[1] = len;
    t.info[2] = target;
    t.info[3] = last;
    t.info[4] = done;
  }
  __syncthreads();
  const WalkResult w = {t.info[0], t.info[1], t.info[2], t.info[3], t.info[4]};
  int32_t* an = accept_nodes + int64_t(b) * width;
  int32_t* ci = committed_ids + int64_t(b) * width;
  for (int s = threadIdx.x; s < width; s += blockDim.x) {
    an[s] = s < w.count ? t.path[s] : -1;
    ci[s] = s < w.count ? (s + 1 < w.len ? t.tok[t.path[s + 1]] : w.target) : -1;
  }
  return w;
}

// The fused plan's one kernel (grid chunks x N x B, kAcceptThreads threads). `Tail` runs in the last CTA
// of each request after the walk (NoRoundTail: nothing; RoundTail in round_finish.cuh: the KV commit and
// the slot bookkeeping of the round); its prefetch() runs before the walk, so its loads overlap it.
template <typename T, bool VEC, typename Tail>
__global__ void __launch_bounds__(kAcceptThreads) tree_accept_fused_kernel(
    const T* __restrict__ logits, int64_t batch_stride, int64_t row_stride, int vocab, int n_max,
    const int32_t* __restrict__ node_token, const int32_t* __restrict__ first_child,
    const int32_t* __restrict__ next_sibling, const int32_t* __restrict__ num_nodes,
    const int32_t* __restrict__ ctx_len, const float* __restrict__ temperature, const int64_t* __restrict__ seed,
    const int32_t* __restrict__ stop_ids, int num_stop, int width, int num_chunks, uint64_t* __restrict__ partial,
    uint32_t* __restrict__ counters, int32_t* __restrict__ accept_nodes, int32_t* __restrict__ accept_len,
    int32_t* __restrict__ committed_ids, int32_t* __restrict__ bonus, int32_t* __restrict__ finished,
    int32_t* __restrict__ flags, const Tail tail) {
  __shared__ uint64_t red[kAcceptThreads / 32];
  __shared__ AcceptTreeSmem tree;
  __shared__ int s_last;
  const int chunk = blockIdx.x, i = blockIdx.y, b = blockIdx.z;
  const int start = chunk * kAcceptChunk;
  // Row i < n_max exists (the launcher checked the strides), so its load need not wait for num_nodes:
  // rows past the tree are loaded and dropped, never scored.
  ChunkLogits<T, VEC> chunk_logits;
  chunk_logits.load(logits + int64_t(b) * batch_stride + int64_t(i) * row_stride, start, vocab);
  const int n = max(1, min(num_nodes[b], n_max));
  if (i >= n) return;  // not counted: the request's arrivals are n x num_chunks
  const float temp = temperature[b];
  const bool sample = temp > 0.f;  // 0, negative or NaN: greedy
  uint32_t key = 0;
  if (sample) {  // block-uniform: the whole CTA derives node i's depth
    load_parents(tree, first_child + int64_t(b) * n_max, next_sibling + int64_t(b) * n_max, n);
    key = gumbel_key(uint64_t(seed[b]), uint32_t(b), uint32_t(ctx_len[b] + node_depth_of(tree, i, n) + 1));
  }
  int bad = 0;
  const uint64_t best = chunk_logits.best(start, vocab, sample, temp, key, &bad);
  const uint64_t m = block_best(best, bad, red, flags);
  if (threadIdx.x == 0) {
    partial[(int64_t(b) * n_max + i) * num_chunks + chunk] = m;
    // Release: the partial is visible device-wide before this CTA counts as arrived; acquire: the last
    // arriver sees every other CTA's partial.
    const uint32_t arrived = atomic_add_acq_rel_gpu(&counters[b], 1u) + 1u;
    s_last = arrived == uint32_t(n) * uint32_t(num_chunks);
    if (s_last) counters[b] = 0;  // every arrival of this launch is in: ready for the next launch
  }
  __syncthreads();
  if (!s_last) return;
  tail.prefetch(tree, b);
  const WalkResult w =
      accept_walk_in_smem(tree, partial, num_chunks, b, n, n_max, node_token, first_child, next_sibling, stop_ids,
                          num_stop, width, accept_nodes, accept_len, committed_ids, bonus, finished, flags);
  tail(tree, b, width, w, flags);
}

}  // namespace kernels
}  // namespace ddtree
