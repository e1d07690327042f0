// tree_accept, leaf mode's second pass (session 13, issue #6): the fused kernel run with `pend` scores only the
// root's and the internal nodes' rows (a leaf's target token matters only as the bonus of a walk that ends on it);
// this kernel scores the one leaf row per request that a walk ended on, and writes what that row decides.
// Overview in ../tree_accept.cuh.
#pragma once

#include <cstdint>

#include "ddtree/kernels/common.cuh"
#include "ddtree/kernels/tree_accept/common.cuh"
#include "ddtree/kernels/tree_accept/fused.cuh"

namespace ddtree {
namespace kernels {

// Grid (num_chunks, B), kAcceptThreads threads, launched after the fused kernel on the same stream (its outputs
// and pend are complete). pend[b] < 0: request b is final already, its CTAs exit. Else CTA `chunk` scores chunk
// `chunk` of leaf pend[b]'s row exactly as the fused kernel would have (same chunking NV, same noise key: the
// leaf ends a walk of pend[B + b] nodes, so its depth is that minus one) into the leaf's own partial slots (the
// fused kernel left them unwritten), and counts itself in counters[b] (zero: the fused kernel's last CTA reset
// it). The last arriver reduces the chunks and writes the bonus, finished (the bonus is a stop id) and committed
// id len - 1 (the fused kernel's walk wrote accept_len = len and every other output), then zeroes the counter.
template <typename T, bool VEC, int NV>
__global__ void __launch_bounds__(kAcceptThreads) tree_accept_leaf_kernel(
    const T* __restrict__ logits, int64_t batch_stride, int64_t row_stride, int vocab, int n_max,
    const int32_t* __restrict__ ctx_len, const float* __restrict__ temperature, const int64_t* __restrict__ seed,
    const int32_t* __restrict__ stop_ids, int num_stop, int width, int num_chunks, const int32_t* __restrict__ pend,
    uint64_t* __restrict__ partial, uint32_t* __restrict__ counters, int32_t* __restrict__ committed_ids,
    int32_t* __restrict__ bonus, int32_t* __restrict__ finished, int32_t* __restrict__ flags, int score) {
  __shared__ uint64_t red[kAcceptThreads / 32];
  const int chunk = blockIdx.x, b = blockIdx.y;
  const int leaf = pend[b];
  if (leaf < 0) return;  // block-uniform
  const int len = pend[int(gridDim.y) + b];
  using Chunk = ChunkLogits<T, VEC, NV>;
  const int start = chunk * Chunk::kChunk;
  Chunk chunk_logits;
  chunk_logits.load(logits + int64_t(b) * batch_stride + int64_t(leaf) * row_stride, start, vocab);
  const float temp = temperature[b];
  const bool sample = temp > 0.f;  // 0, negative or NaN: greedy (as the fused kernel decides)
  uint32_t key = 0;
  if (sample) key = gumbel_key(uint64_t(seed[b]), uint32_t(b), uint32_t(ctx_len[b] + (len - 1) + 1));
  int bad = 0;
  const uint64_t best = chunk_logits.best(start, vocab, sample, temp, key, &bad, score);
  const uint64_t m = block_best(best, bad, red, flags);
  if (threadIdx.x != 0) return;
  uint64_t* p = partial + (int64_t(b) * n_max + leaf) * num_chunks;
  p[chunk] = m;
  // Release / acquire as in the fused kernel: the last arriver sees every chunk's partial.
  if (atomic_add_acq_rel_gpu(&counters[b], 1u) + 1u != uint32_t(num_chunks)) return;
  counters[b] = 0;
  uint64_t top = 0;
  for (int c = 0; c < num_chunks; ++c) {
    const uint64_t v = __ldcg(p + c);
    top = v > top ? v : top;
  }
  const int target = top != 0 ? item_id(top) : -1;
  int done = 0;  // cut_at_stop's last step: the path held no stop id (the fused kernel checked)
  for (int q = 0; q < num_stop && !done; ++q) done = stop_ids[q] == target;
  bonus[b] = target;
  finished[b] = done;
  committed_ids[int64_t(b) * width + len - 1] = target;
}

}  // namespace kernels
}  // namespace ddtree
