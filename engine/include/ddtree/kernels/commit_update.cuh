// commit_update kernel: kv_commit and round_update (plus the live budget) in one launch, for the split
// round tail (models whose commit does not fit round_finish's one-CTA tail). Grid (batch, 2 * layers + 1):
// CTA y = 0 does slot b's bookkeeping (round_update_slot), CTAs y >= 1 move one layer's K or V rows of
// request b (kv_commit_rows). Neither half reads what the other writes except ctx_len: every CTA reads
// ctx_len[b] first, and the last CTA of request b to arrive (counters[b], reset by it) writes ctx_len[b]
// once: + accept_len for a slot active before the round, unchanged for an inactive one (what kv_commit's
// advance and round_update's undo add up to). The bookkeeping CTA tells the last arriver which by adding
// 1 + kInactiveMark instead of 1 to the counter; its own ctx_len read matters only if it is the last.
#pragma once

#include <cstdint>

#include "ddtree/kernels/kv_commit.cuh"
#include "ddtree/kernels/round_update.cuh"

namespace ddtree {
namespace kernels {

static_assert(kCommitThreads == kRoundUpdateThreads, "one block size for both halves of commit_update");
constexpr int kInactiveMark = 1 << 16;  // above any arrival count (gridDim.y <= 2 * kCommitMaxLayers + 1)

// p.ctx_len is null (the undo is folded into the arrival); hid_unit is the hidden-state copy unit in bytes.
// Launched with PDL (opt-in), the grid may be scheduled while tree_accept finishes: every input is read after
// pdl_wait() (a no-op otherwise).
// Tile: K/V rows a pass (kCommitUpdateTile; kCommitTile under DDTREE_COMMIT_UPDATE_TILE=16, session 11's). At 8 rows
// the register cap of 4 CTAs an SM (128) makes the batch-8 grid of 28 layers one wave (528 resident >= 456); ptxas
// put the uint4 instance at 141 registers (3 CTAs an SM) without it. Not for the 1-byte unit (qwen3 never takes it):
// ptxas sm_90a spills it under the cap, and without the cap sm_120 spilled the 4-byte one.
template <typename U, int Tile = kCommitUpdateTile>
__global__ void __launch_bounds__(kCommitThreads, sizeof(U) >= 4 && Tile <= kCommitUpdateTile ? 4 : 1)
    commit_update_kernel(
    const CommitLayers layers, int num_layers, int num_pages, int page_size, int64_t row_bytes,
    const int32_t* __restrict__ block_table, int max_pages, const RoundUpdateParams p, int hid_unit,
    int32_t* __restrict__ ctx_len, int32_t* __restrict__ counters) {
  pdl_wait();
  const int b = blockIdx.x;
  const int ctx = ctx_len[b];
  const int total = int(gridDim.y);
  // The last of the request's CTAs to arrive writes ctx_len once.
  auto finish = [&](int now) {
    if ((now & (kInactiveMark - 1)) == total) {
      ctx_len[b] = (now & kInactiveMark) ? ctx : ctx + p.accept_len[b];
      counters[b] = 0;
    }
  };
  if (blockIdx.y == 0) {
    // The bookkeeping CTA first in launch order (the first wave when the grid is larger than one), and it
    // arrives as soon as it knows whether the slot was active: nothing the last arriver does depends on its
    // other writes, and the atomic's result is not waited for until the end.
    int now = 0;
    auto arrive = [&](bool act) {
      const int add = act ? 1 : 1 + kInactiveMark;
      now = atomicAdd(&counters[b], add) + add;
    };
    if (hid_unit == 16)
      round_update_slot<uint4>(p, b, arrive);
    else if (hid_unit == 4)
      round_update_slot<uint32_t>(p, b, arrive);
    else
      round_update_slot<uint8_t>(p, b, arrive);
    if (threadIdx.x == 0) finish(now);
    return;
  }
  const int y = int(blockIdx.y) - 1;
  char* base = (y & 1) ? layers.v[y >> 1] : layers.k[y >> 1];
  kv_commit_rows<U, Tile>(base, b, ctx, num_pages, page_size, row_bytes, block_table, max_pages, p.accept_nodes,
                          p.accept_width, p.accept_len, p.flags);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    finish(atomicAdd(&counters[b], 1) + 1);
  }
}

}  // namespace kernels
}  // namespace ddtree
