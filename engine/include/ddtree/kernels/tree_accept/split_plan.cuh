// tree_accept, the split plan (n_max > kAcceptFusedMaxNodes, or DDTREE_ACCEPT_IMPL=split): three kernels,
// parents and depths, the per-chunk partials, the walk. Overview in ../tree_accept.cuh.
#pragma once

#include <climits>
#include <cstdint>

#include "ddtree/kernels/common.cuh"
#include "ddtree/kernels/tree_accept/common.cuh"

namespace ddtree {
namespace kernels {

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

}  // namespace kernels
}  // namespace ddtree
