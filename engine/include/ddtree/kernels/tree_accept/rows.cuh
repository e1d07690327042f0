// tree_accept, leaf mode's first pass without leaf CTAs (session 13, DDTREE_ACCEPT_LEAF=2, opt-in): the fused
// kernel in leaf mode still launches a CTA for every (chunk, node) and lets a leaf's CTAs exit after a first_child
// round trip and an arrival; at qwen3-0.6b 8/64, ~95% leaf rows, that took 23 µs of CTA turnover for ~1 MB of rows
// (NOTES "Session 13 (s13accept)"). Here a grid of (chunks, R, B) CTAs lists the request's root and internal nodes
// in shared memory and CTA (chunk, r) scores chunk `chunk` of list entries r, r + R, ...; each CTA counts itself in
// once (R x chunks arrivals a request), the last runs the fused plan's walk with `pend` (leaf.cuh's pass follows).
// Overview in ../tree_accept.cuh.
#pragma once

#include <cstdint>

#include "ddtree/kernels/common.cuh"
#include "ddtree/kernels/tree_accept/common.cuh"
#include "ddtree/kernels/tree_accept/fused.cuh"

namespace ddtree {
namespace kernels {

// Row slots per request (gridDim.y = min(n_max, this)).
constexpr int kAcceptRowSlots = 16;

// 4 CTAs an SM with 16-byte loads, as the fused kernel's wide chunk gets (63 registers; uncapped, ptxas gave the wide
// instance 128). The unaligned fallback keeps 2: at 4 its bf16 instance spilled 4 bytes on sm_90a.
template <typename T, bool VEC, int NV>
__global__ void __launch_bounds__(kAcceptThreads, VEC ? 4 : 2) tree_accept_rows_kernel(
    DDTREE_ACCEPT_KERNEL_PARAMS, int score, int32_t* __restrict__ pend) {
  __shared__ uint64_t red[kAcceptThreads / 32];
  __shared__ AcceptTreeSmem tree;  // tree.next: the row list until the walk; tree.path: the scan's scratch
  __shared__ int s_last;
  const int chunk = blockIdx.x, slot = blockIdx.y, slots = int(gridDim.y), b = blockIdx.z;
  using Chunk = ChunkLogits<T, VEC, NV>;
  const int start = chunk * Chunk::kChunk;
  const int n = max(1, min(num_nodes[b], n_max));
  const int32_t* fc = first_child + int64_t(b) * n_max;
  // The rows the walk can need before it ends: the root and every node with a child, in node order.
  int rows = 0;
  for (int base = 0; base < n; base += kAcceptThreads) {
    const int j = base + int(threadIdx.x);
    const int keep = j < n && (j == 0 || fc[j] != -1) ? 1 : 0;
    int total;
    const int at = rows + block_inclusive_scan<kAcceptThreads>(keep, tree.path, &total) - 1;
    if (keep) tree.next[at] = j;
    rows += total;
    __syncthreads();  // the scan's scratch is rewritten by the next tile; the list is read below
  }
  const float temp = temperature[b];
  const bool sample = temp > 0.f;  // 0, negative or NaN: greedy
  if (sample && slot < rows)  // block-uniform: parents for the noise key's depth
    load_parents(tree, fc, next_sibling + int64_t(b) * n_max, n);
  const T* req = logits + int64_t(b) * batch_stride;
  for (int k = slot; k < rows; k += slots) {
    const int i = tree.next[k];
    Chunk chunk_logits;
    chunk_logits.load(req + int64_t(i) * row_stride, start, vocab);
    uint32_t key = 0;
    if (sample) key = gumbel_key(uint64_t(seed[b]), uint32_t(b), uint32_t(ctx_len[b] + node_depth_of(tree, i, n) + 1));
    int bad = 0;
    const uint64_t best = chunk_logits.best(start, vocab, sample, temp, key, &bad, score);
    const uint64_t m = block_best(best, bad, red, flags);
    if (threadIdx.x == 0) partial[(int64_t(b) * n_max + i) * num_chunks + chunk] = m;
    __syncthreads();  // red is reused by the next row
  }
  if (threadIdx.x == 0) {
    // Release / acquire as in the fused kernel.
    const uint32_t arrived = atomic_add_acq_rel_gpu(&counters[b], 1u) + 1u;
    s_last = arrived == uint32_t(slots) * uint32_t(num_chunks);
    if (s_last) counters[b] = 0;
  }
  __syncthreads();
  if (!s_last) return;
  accept_walk_in_smem(tree, partial, num_chunks, b, n, n_max, node_token, first_child, next_sibling, stop_ids,
                      num_stop, width, accept_nodes, accept_len, committed_ids, bonus, finished, flags, pend);
}

}  // namespace kernels
}  // namespace ddtree
