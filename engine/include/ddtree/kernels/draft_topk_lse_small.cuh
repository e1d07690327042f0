// draft_topk_lse for small vocabularies (V <= kSmallMaxV): one warp per row, no block barrier, no
// cluster, no workspace (engine/bench/NOTES.md, "v7 (session 5)").
//
// Why: the end-to-end bench's drafter has V = 320 (L = 15, K = 16 or 64). v4 gives such a row one
// 512-thread CTA of which 40 threads hold a vector, and runs its whole stage chain on them (sums, a block
// barrier, a bound that degenerates to "admit everything" because fewer than k of its 128 lane groups hold
// a logit, the candidate pass, counted ranks over all V candidates, the mbarrier merge): 5.4-9.1 µs per
// call inside a decode round (NOTES, "Inside a round"). Here a warp does it with warp primitives only:
//   1. keys (ordered, -0 read as +0) of the row into shared memory, eight loads in flight per lane; the
//      row's maximum key by one redux; NaN or +inf anywhere -> a NaN row and the error flag (as v4).
//   2. lse = (R + log2 sum 2^(x fl(log2 e) - R)) / fl(log2 e), R = fl(max fl(log2 e)) (0 for an all -inf
//      row, whose sum is then 0 and lse -inf): v4's formula with one partial.
//   3. T = the kk-th largest key (kk = min(k, V)) by a 2-bit-per-step search from the top (16 steps of
//      three counts and three reduxes): the largest t with #(key >= t) >= kk.
//   4. the items with key > T and, in id order, the first kk - #(key > T) with key == T (ballots give
//      every item its slot): exactly the top kk (key desc, lower id first), unsorted.
//   5. each item's rank = how many of the kk items beat it (broadcast reads); outputs x - lse.
// Exact for any input (ties, -inf, signed zeros, V < k); the same outputs and flag as v2/v3/v4.
// Measured (H200, session 5): NOT the ~2 µs predicted: 8.3-10.5 µs at 1x15x320 and 8.2-10.8 at 8x15x320,
// whatever k: one warp runs ~1,300 mostly dependent instructions (the 16-step search re-reads the row
// from shared memory 16 times, 10 loads a lane at V = 320) at one instruction per ~10 cycles. Opt-in
// (DDTREE_TOPK_SMALL=1); the next version wants the row spread over more warps (NOTES "v7").
#pragma once

#include "ddtree/kernels/draft_topk_lse_v4/helpers.cuh"

namespace ddtree {
namespace kernels {

constexpr int kSmallMaxV = 1024;  // rows up to this long take this kernel when opted in (k <= kV4MaxK)
constexpr int kSmallWarps = 4;    // rows per CTA (one warp each)

struct SmallSmem {
  uint32_t keys[kSmallWarps][kSmallMaxV];
  uint64_t items[kSmallWarps][kV4MaxK];
};

// grid = (1, ceil(rows / kSmallWarps)), block = 32 * kSmallWarps; vocab <= kSmallMaxV, k <= kV4MaxK.
template <typename T>
__global__ void __launch_bounds__(kSmallWarps * 32)
    draft_topk_lse_small_kernel(const T* __restrict__ logits, int rows, int positions, int vocab,
                                int64_t batch_stride, int64_t row_stride, int k, float* __restrict__ top_lp,
                                int32_t* __restrict__ top_id, float* __restrict__ lse, int32_t* __restrict__ flags) {
  pdl_launch_dependents();
  DDTREE_V4_SHARED(SmallSmem, sm);
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int row = int(blockIdx.y) * kSmallWarps + warp;
  pdl_wait();  // the previous kernel's writes (logits) are visible
  if (row >= rows) return;  // whole warps: no block barrier below
  const int b = row / positions, l = row - b * positions;
  const T* x = logits + int64_t(b) * batch_stride + int64_t(l) * row_stride;
  uint32_t* keys = sm.keys[warp];
  uint64_t* items = sm.items[warp];
  float* lp_out = top_lp + int64_t(row) * k;
  int32_t* id_out = top_id + int64_t(row) * k;

  // 1. Keys, maximum, NaN/+inf. Element i of the row is keys[i]; lane owns i = lane + 32 j.
  uint32_t kmax = 0u;
  bool bad = false;
  for (int j0 = 0; j0 < vocab; j0 += 8 * 32) {
    float f[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {  // eight loads in flight before the first use
      const int i = j0 + q * 32 + lane;
      f[q] = i < vocab ? to_float<T>(x[i]) : -INFINITY;
    }
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const int i = j0 + q * 32 + lane;
      bad |= !(f[q] < INFINITY);  // NaN or +inf
      const uint32_t key = v4_key(f[q]);
      if (i < vocab) keys[i] = key;
      kmax = max(kmax, key);
    }
  }
  kmax = __reduce_max_sync(0xffffffffu, kmax);
  if (__any_sync(0xffffffffu, bad)) {
    const float qnan = __int_as_float(0x7fc00000);
    for (int r = lane; r < k; r += 32) {
      lp_out[r] = qnan;
      id_out[r] = -1;
    }
    if (lane == 0) {
      lse[row] = qnan;
      raise_flag(flags, 0x1);
    }
    return;
  }
  __syncwarp();  // every lane's keys are in

  // 2. lse.
  const float m = key_to_float(kmax);
  const float ref = m == -INFINITY ? 0.f : m * kV4Log2e;
  float s0 = 0.f, s1 = 0.f;
  for (int i = lane; i < vocab; i += 64) {
    s0 += v4_ex2(fmaf(key_to_float(keys[i]), kV4Log2e, -ref));
    if (i + 32 < vocab) s1 += v4_ex2(fmaf(key_to_float(keys[i + 32]), kV4Log2e, -ref));
  }
  const float s = warp_sum(s0 + s1);
  const double lse_d = m == -INFINITY ? -double(INFINITY) : (double(ref) + double(log2f(s))) * (1.0 / double(kV4Log2e));

  // 3. T: the largest key t with at least kk keys >= t (pre keeps #(key >= pre) >= kk; key 0 is below all).
  const int kk = min(k, vocab);
  uint32_t pre = 0u;
#pragma unroll 1
  for (int bit = 30; bit >= 0; bit -= 2) {
    const uint32_t c1 = pre | (1u << bit), c2 = pre | (2u << bit), c3 = pre | (3u << bit);
    unsigned n1 = 0u, n2 = 0u, n3 = 0u;
    for (int i = lane; i < vocab; i += 32) {
      const uint32_t key = keys[i];
      n1 += unsigned(key >= c1);
      n2 += unsigned(key >= c2);
      n3 += unsigned(key >= c3);
    }
    n1 = __reduce_add_sync(0xffffffffu, n1);
    n2 = __reduce_add_sync(0xffffffffu, n2);
    n3 = __reduce_add_sync(0xffffffffu, n3);
    pre = n3 >= unsigned(kk) ? c3 : n2 >= unsigned(kk) ? c2 : n1 >= unsigned(kk) ? c1 : pre;
  }
  const uint32_t thr = pre;

  // 4. The top kk items, unsorted: every key > thr, then the lowest ids with key == thr.
  unsigned ngt = 0u;
  for (int i = lane; i < vocab; i += 32) ngt += unsigned(keys[i] > thr);
  int ties = kk - int(__reduce_add_sync(0xffffffffu, ngt));  // >= 1
  const unsigned lt = (1u << lane) - 1u;
  int n = 0;  // items written (warp-uniform)
  for (int j0 = 0; j0 < vocab; j0 += 32) {
    const int i = j0 + lane;
    const uint32_t key = i < vocab ? keys[i] : 0u;
    const bool gt = key > thr;  // key 0 (past the row) is never > thr
    const bool eq = i < vocab && key == thr;
    const unsigned beq = __ballot_sync(0xffffffffu, eq);
    const bool take = gt || (eq && __popc(beq & lt) < ties);
    const unsigned btake = __ballot_sync(0xffffffffu, take);
    if (take) items[n + __popc(btake & lt)] = pack_item(key, i);
    n += __popc(btake);
    ties -= min(__popc(beq), ties);
  }
  __syncwarp();  // n == kk items are in

  // 5. Ranks among the kk (distinct) items, outputs.
  for (int p = lane; p < kk; p += 32) {
    const uint64_t it = items[p];
    int r0 = 0, r1 = 0;
    int q = 0;
    for (; q + 1 < kk; q += 2) {
      r0 += int(items[q] > it);
      r1 += int(items[q + 1] > it);
    }
    if (q < kk) r0 += int(items[q] > it);
    const int rank = r0 + r1;
    const float f = key_to_float(item_key(it));
    lp_out[rank] = f == -INFINITY ? -INFINITY : float(double(f) - lse_d);
    id_out[rank] = item_id(it);
  }
  for (int r = kk + lane; r < k; r += 32) {
    lp_out[r] = -INFINITY;
    id_out[r] = -1;
  }
  if (lane == 0) lse[row] = float(lse_d);
}

}  // namespace kernels
}  // namespace ddtree
