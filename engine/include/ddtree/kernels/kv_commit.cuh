// kv_commit kernel: move the accepted tree nodes' K/V rows to their committed slots, all layers at once.
//
// Request b's tree node j sits at cache slot ctx_len[b] + j; accepted node accept_nodes[b][i] moves to
// slot ctx_len[b] + i. Sources never precede destinations (accept_nodes[i] >= i), so a thread that reads
// all its rows before writing any, tile by tile in increasing i, never reads a row it already overwrote.
// CTA (b, layer, k|v) owns one layer's K or V rows of one request; its threads split each row's bytes.
// The last CTA of request b to finish (counted in `counters`, which it resets) does ctx_len[b] +=
// accept_len[b], so the whole commit is one launch.
#pragma once

#include <cstdint>

#include "ddtree/kernels/common.cuh"

namespace ddtree {
namespace kernels {

constexpr int kCommitThreads = 128;
constexpr int kCommitMaxLayers = 128;  // layer pointers passed by value per launch
constexpr int kCommitTile = 16;        // rows gathered into registers before writing (kv_commit, round_finish)
// commit_update's tile (session 12, issue #6): 16 rows of uint4 held ~250 registers, 2 CTAs an SM, so its
// batch x (2 * layers + 1) grid ran in two waves at batch 8 (456 CTAs for 28 layers) while accept lengths there
// are ~1.3; 8 rows keep batch 1's ~5.3 in one pass and let the batch-8 grid fit one wave.
constexpr int kCommitUpdateTile = 8;

struct CommitLayers {
  char* k[kCommitMaxLayers];
  char* v[kCommitMaxLayers];  // null when only K caches are given
};

// One layer's K or V rows of request b (whose context length before the commit is ctx), by one CTA of
// kCommitThreads threads (every thread calls it), Tile rows per pass. base is null for a missing V cache.
template <typename U, int Tile = kCommitTile>
__device__ __forceinline__ void kv_commit_rows(char* base, int b, int ctx, int num_pages, int page_size,
                                               int64_t row_bytes, const int32_t* __restrict__ block_table,
                                               int max_pages, const int32_t* __restrict__ accept_nodes, int width,
                                               const int32_t* __restrict__ accept_len, int32_t* __restrict__ flags) {
  const int n = min(max(accept_len[b], 0), width);
  const int32_t* an = accept_nodes + int64_t(b) * width;
  const int32_t* bt = block_table + int64_t(b) * max_pages;
  const int64_t slots = int64_t(max_pages) * page_size;
  const int64_t units = row_bytes / int64_t(sizeof(U));

  if (base != nullptr) {
    for (int i0 = 0; i0 < n; i0 += Tile) {
      const int cnt = min(Tile, n - i0);
      const U* src[Tile];
      U* dst[Tile];
#pragma unroll
      for (int r = 0; r < Tile; ++r) {
        src[r] = nullptr;
        dst[r] = nullptr;
        if (r < cnt) {
          const int i = i0 + r;
          const int node = an[i];
          const int64_t s = int64_t(ctx) + node, d = int64_t(ctx) + i;
          if (node < i || s >= slots || d < 0) {  // malformed: sources must not precede destinations
            if (threadIdx.x == 0) raise_flag(flags, 0x2);
            continue;
          }
          if (node == i) continue;  // already in place
          const int sp = bt[s / page_size], dp = bt[d / page_size];
          if (sp < 0 || sp >= num_pages || dp < 0 || dp >= num_pages) {
            if (threadIdx.x == 0) raise_flag(flags, 0x2);
            continue;
          }
          src[r] = reinterpret_cast<const U*>(base + (int64_t(sp) * page_size + s % page_size) * row_bytes);
          dst[r] = reinterpret_cast<U*>(base + (int64_t(dp) * page_size + d % page_size) * row_bytes);
        }
      }
      for (int64_t u = threadIdx.x; u < units; u += kCommitThreads) {
        U val[Tile];
#pragma unroll
        for (int r = 0; r < Tile; ++r)
          if (src[r] != nullptr) val[r] = src[r][u];
#pragma unroll
        for (int r = 0; r < Tile; ++r)
          if (dst[r] != nullptr) dst[r][u] = val[r];
      }
      __syncthreads();  // the next tile's sources were destinations' neighbours: keep tiles ordered
    }
  }
}

template <typename U>
__global__ void __launch_bounds__(kCommitThreads) kv_commit_kernel(
    const CommitLayers layers, int num_layers, int num_pages, int page_size, int64_t row_bytes,
    const int32_t* __restrict__ block_table, int max_pages, const int32_t* __restrict__ accept_nodes, int width,
    const int32_t* __restrict__ accept_len, int32_t* __restrict__ ctx_len, int32_t* __restrict__ counters,
    int update_ctx, int32_t* __restrict__ flags) {
  const int b = blockIdx.x;
  const int layer = blockIdx.y >> 1;
  char* base = (blockIdx.y & 1) ? layers.v[layer] : layers.k[layer];
  const int ctx = ctx_len[b];
  kv_commit_rows<U>(base, b, ctx, num_pages, page_size, row_bytes, block_table, max_pages, accept_nodes, width,
                    accept_len, flags);
  if (!update_ctx) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    const int total = int(gridDim.y);
    if (atomicAdd(&counters[b], 1) == total - 1) {
      ctx_len[b] = ctx + accept_len[b];
      counters[b] = 0;
    }
  }
}

}  // namespace kernels
}  // namespace ddtree
