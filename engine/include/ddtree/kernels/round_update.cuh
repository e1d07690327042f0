// round_update kernel: the end-of-round bookkeeping of every slot in one launch (semantics and the
// formulas: engine/python/ddtree_engine/reference/round_update.py). CTA b owns slot b: thread 0 does the
// scalar state, then all threads write the reported tokens and copy the accepted path's last hidden
// state, U bytes at a time.
#pragma once

#include <cstdint>

#include "ddtree/kernels/common.cuh"
#include "ddtree/status.h"

namespace ddtree {
namespace kernels {

constexpr int kRoundUpdateThreads = 128;
constexpr int32_t kFinishNone = 0, kFinishStop = 1, kFinishLength = 2;  // decode.FINISH_*

struct RoundUpdateParams {
  const int32_t* accept_len;
  const int32_t* finished;
  const int32_t* bonus;
  const int32_t* committed_ids;
  int committed_width;
  const int32_t* accept_nodes;
  int accept_width;
  const char* hid;
  int hid_rows;
  int64_t row_bytes;
  uint8_t* active;
  const uint8_t* ignore_stop;
  const int32_t* max_new;
  int32_t* out_len;
  int32_t* ctx_len;
  int32_t* root;
  char* hidden;
  int32_t* r_tokens;
  int tokens_width;
  int32_t* r_count;
  int32_t* r_finish;
  int32_t* flags;
  int32_t* live_budget;  // null: not kept (ddtree_round_update); else zeroed when the slot stops
};

// What one active (or inactive) slot's round amounts to; shared with the fused round tail (round_finish.cuh)
// so both plans apply the same formulas.
struct SlotOutcome {
  int32_t n_new;     // tokens reported this round
  int32_t finish;    // kFinish*
  bool keep_active;  // the slot stays active
};

__device__ __forceinline__ SlotOutcome slot_outcome(bool act, int32_t acc, int32_t finished, bool ignore_stop,
                                                    int32_t max_new, int32_t out_len) {
  const int32_t remaining = max_new - out_len;
  const int32_t n_new = act ? min(acc, remaining) : 0;
  const bool stopped = act && finished != 0 && !ignore_stop && acc <= remaining;
  const bool length = act && !stopped && out_len + n_new >= max_new;
  return {n_new, stopped ? kFinishStop : length ? kFinishLength : kFinishNone, act && !(stopped || length)};
}

// Slot b's bookkeeping by one CTA of kRoundUpdateThreads threads (every thread calls it). With a null
// p.ctx_len the inactive slot's undo of kv_commit's advance is the caller's (commit_update folds both into
// one write). Thread 0 calls on_active(act) as soon as it has read whether the slot was active before the
// round (commit_update arrives there), and returns act.
template <typename U, typename OnActive>
__device__ __forceinline__ bool round_update_slot(const RoundUpdateParams& p, int b, OnActive on_active) {
  __shared__ int32_t s_new;   // tokens reported this round
  __shared__ int32_t s_node;  // tree node whose hidden state becomes the slot's, -1 for none
  bool act = false;
  if (threadIdx.x == 0) {
    act = p.active[b] != 0;
    on_active(act);
    const int32_t acc = p.accept_len[b];
    const SlotOutcome o = slot_outcome(act, acc, p.finished[b], p.ignore_stop[b] != 0, p.max_new[b], p.out_len[b]);
    const int32_t n_new = o.n_new;
    p.out_len[b] += n_new;
    p.r_count[b] = n_new;
    p.r_finish[b] = o.finish;
    if (act) {
      p.root[b] = p.bonus[b];
    } else if (p.ctx_len != nullptr) {
      p.ctx_len[b] -= acc;  // kv_commit advanced every slot; an inactive one keeps its context
    }
    int32_t node = -1;
    if (act) {
      const int pick = max(acc - 1, 0);
      node = pick < p.accept_width ? max(p.accept_nodes[int64_t(b) * p.accept_width + pick], 0) : -1;
      if (node >= p.hid_rows || node < 0) {
        raise_flag(p.flags, DDTREE_FLAG_BAD_INDEX);
        node = -1;
      }
    }
    p.active[b] = o.keep_active ? 1 : 0;
    if (p.live_budget != nullptr && !o.keep_active) p.live_budget[b] = 0;
    s_new = n_new;
    s_node = node;
  }
  __syncthreads();
  const int32_t n_new = s_new;
  for (int c = threadIdx.x; c < p.tokens_width; c += blockDim.x) {
    int32_t v = -1;
    if (c < n_new && c < p.committed_width) v = p.committed_ids[int64_t(b) * p.committed_width + c];
    p.r_tokens[int64_t(b) * p.tokens_width + c] = v;
  }
  const int node = s_node;
  if (node >= 0) {
    const int64_t units = p.row_bytes / int64_t(sizeof(U));
    const U* src = reinterpret_cast<const U*>(p.hid + (int64_t(b) * p.hid_rows + node) * p.row_bytes);
    U* dst = reinterpret_cast<U*>(p.hidden + int64_t(b) * p.row_bytes);
    for (int64_t i = threadIdx.x; i < units; i += blockDim.x) dst[i] = src[i];
  }
  return act;
}

template <typename U>
__global__ void __launch_bounds__(kRoundUpdateThreads) round_update_kernel(const RoundUpdateParams p) {
  round_update_slot<U>(p, blockIdx.x, [](bool) {});
}

}  // namespace kernels
}  // namespace ddtree
