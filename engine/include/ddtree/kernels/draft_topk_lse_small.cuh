// draft_topk_lse for small vocabularies (V <= kSmallMaxV): one warp per row, the row in registers, no block
// barrier, no cluster, no workspace (engine/bench/NOTES.md, "v7 (session 5)" and "Session 6").
//
// Why: the end-to-end bench's drafter has V = 320 (L = 15, K = 16 or 64). v4 gives such a row one
// 512-thread CTA of which 40 threads hold a vector, and runs its whole stage chain on them (its bound
// degenerates to "admit everything" when fewer than k of its 128 lane groups hold a logit, then counted ranks
// over all V candidates): 5.4-9.1 µs per call inside a decode round. Session 5's small-row kernel (one warp,
// the row in shared memory, a 16-step 2-bit key search re-reading the row every step) ran ~1,300 mostly
// dependent instructions: 7.7-10.5 µs. This version keeps lane l's logits l, l + 32, ... (PL of them) in
// registers and replaces the search by a bound:
//   1. PL loads in flight per lane; keys (ordered, -0 read as +0); the row maximum by one redux; NaN or +inf
//      anywhere -> a NaN row and the error flag (as v4).
//   2. lse = (R + log2 sum 2^(x fl(log2 e) - R)) / fl(log2 e), R = fl(max fl(log2 e)) (0 for an all -inf
//      row, whose sum is then 0 and lse -inf): v4's formula with one partial.
//   3. A lower bound of the kk-th largest key (kk = min(k, V)): every lane offers its q = ceil(kk / 32) largest
//      keys (q <= 2 since k <= 64); the largest offered key a with at least kk offered keys >= a (32 q
//      broadcasts) has at least kk row elements at or above it, so the kk-th largest key is >= a.
//   4. Candidates = the row elements with key >= bound (ballot compaction into shared memory, PL ballots);
//      they include the top kk, and anything beating a top-kk element is a candidate too.
//   5. Each candidate's rank = how many candidates beat it (pack_item order: key desc, lower id first;
//      broadcast reads); ranks < kk are written: x - lse and the id.
// Exact for any input (ties, -inf, signed zeros, V < k); the same outputs and flag as v2/v3/v4. For random
// rows the candidates number ~kk..2kk; a row of equal logits makes every element a candidate (V^2 / 32
// compares per lane: slower, still exact).
// Measured (H200, session 6, CUPTI inside the end-to-end round, V = 320): 2.69 / 2.88 µs at k = 16 (15 / 120
// rows) and 5.09 / 5.22 at k = 64, against v4's 5.25 / 5.41 and 8.67 / 8.82 in the same process: the default
// there (256 < V <= 384, k >= 16, src/draft_topk_lse.cu); elsewhere opt-in with DDTREE_TOPK_SMALL=1.
#pragma once

#include "ddtree/kernels/draft_topk_lse_v4/helpers.cuh"

namespace ddtree {
namespace kernels {

constexpr int kSmallMaxV = 1024;  // rows up to this long may take this kernel (k <= kV4MaxK; src/draft_topk_lse.cu)
constexpr int kSmallWarps = 4;    // rows per CTA (one warp each)

// Logits per lane the kernel is instantiated for (registers are indexed with compile-time constants only).
__host__ __device__ constexpr int small_per_lane(int vocab) {
  return vocab <= 256 ? 8 : vocab <= 384 ? 12 : vocab <= 512 ? 16 : 32;
}

struct SmallSmem {
  alignas(16) uint64_t items[kSmallWarps][kSmallMaxV];  // each warp's candidates
};

// grid = (1, ceil(rows / kSmallWarps)), block = 32 * kSmallWarps; vocab <= 32 * PL, k <= kV4MaxK.
template <typename T, int PL>
__global__ void __launch_bounds__(kSmallWarps * 32)
    draft_topk_lse_small_kernel(const T* __restrict__ logits, int rows, int positions, int vocab,
                                int64_t batch_stride, int64_t row_stride, int k, float* __restrict__ top_lp,
                                int32_t* __restrict__ top_id, float* __restrict__ lse, int32_t* __restrict__ flags) {
  static_assert(PL * 32 <= kSmallMaxV, "a warp's candidates fit its shared list");
  pdl_launch_dependents();
  DDTREE_V4_SHARED(SmallSmem, sm);
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int row = int(blockIdx.y) * kSmallWarps + warp;
  pdl_wait();  // the previous kernel's writes (logits) are visible
  if (row >= rows) return;  // whole warps: no block barrier below
  const int b = row / positions, l = row - b * positions;
  const T* x = logits + int64_t(b) * batch_stride + int64_t(l) * row_stride;
  uint64_t* items = sm.items[warp];
  float* lp_out = top_lp + int64_t(row) * k;
  int32_t* id_out = top_id + int64_t(row) * k;
  constexpr unsigned kFull = 0xffffffffu;

  // 1. Element lane + 32 j of the row is f[j] / key[j] (key 0 past the row: below every element).
  float f[PL];
#pragma unroll
  for (int j = 0; j < PL; ++j) {
    const int i = lane + 32 * j;
    f[j] = i < vocab ? to_float<T>(x[i]) : -INFINITY;
  }
  uint32_t key[PL];
  uint32_t kmax = 0u;
  bool bad = false;
#pragma unroll
  for (int j = 0; j < PL; ++j) {
    const int i = lane + 32 * j;
    bad |= !(f[j] < INFINITY);  // NaN or +inf (padding is -inf)
    key[j] = i < vocab ? v4_key(f[j]) : 0u;
    kmax = max(kmax, key[j]);
  }
  kmax = __reduce_max_sync(kFull, kmax);
  if (__any_sync(kFull, bad)) {
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

  // 2. lse (padding and -inf terms are 0).
  const float m = key_to_float(kmax);
  const float ref = m == -INFINITY ? 0.f : m * kV4Log2e;
  float s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int j = 0; j < PL; j += 2) {
    s0 += v4_ex2(fmaf(f[j], kV4Log2e, -ref));
    if (j + 1 < PL) s1 += v4_ex2(fmaf(f[j + 1], kV4Log2e, -ref));
  }
  const float s = warp_sum(s0 + s1);
  const double lse_d = m == -INFINITY ? -double(INFINITY) : (double(ref) + double(log2f(s))) * (1.0 / double(kV4Log2e));

  // 3. The bound: a0 >= a1 are the lane's two largest keys (0 = none).
  const int kk = min(k, vocab);
  uint32_t a0 = 0u, a1 = 0u;
#pragma unroll
  for (int j = 0; j < PL; ++j) {
    a1 = max(a1, min(a0, key[j]));
    a0 = max(a0, key[j]);
  }
  uint32_t bnd = 0u;
  if (kk <= 32) {  // warp-uniform
    int c0 = 0;
#pragma unroll
    for (int s = 0; s < 32; ++s) c0 += int(__shfl_sync(kFull, a0, s) >= a0);
    bnd = c0 >= kk ? a0 : 0u;
  } else {
    int c0 = 0, c1 = 0;
#pragma unroll
    for (int s = 0; s < 32; ++s) {
      const uint32_t v0 = __shfl_sync(kFull, a0, s), v1 = __shfl_sync(kFull, a1, s);
      c0 += int(v0 >= a0) + int(v1 >= a0);
      c1 += int(v0 >= a1) + int(v1 >= a1);
    }
    bnd = c0 >= kk ? a0 : c1 >= kk ? a1 : 0u;
  }
  // Offered keys of 0 (no element) never count towards a positive a, and bound 0 admits every element.
  const uint32_t bound = __reduce_max_sync(kFull, bnd);

  // 4. Candidates into the warp's list.
  const unsigned lt = (1u << lane) - 1u;
  int n = 0;  // candidates (warp-uniform)
#pragma unroll
  for (int j = 0; j < PL; ++j) {
    const int i = lane + 32 * j;
    const bool take = i < vocab && key[j] >= bound;
    const unsigned bt = __ballot_sync(kFull, take);
    if (take) items[n + __popc(bt & lt)] = pack_item(key[j], i);
    n += __popc(bt);
  }
  if (n & 1) {  // pad to an even count with an item below every element (pairs are read 16 bytes at a time)
    if (lane == 0) items[n] = 0u;
  }
  __syncwarp();

  // 5. Ranks among the candidates, outputs.
  const int n2 = (n + 1) >> 1;
  const ulonglong2* pairs = reinterpret_cast<const ulonglong2*>(items);
  for (int p = lane; p < n; p += 32) {
    const uint64_t it = items[p];
    int r0 = 0, r1 = 0;
#pragma unroll 4
    for (int q = 0; q < n2; ++q) {
      const ulonglong2 two = pairs[q];
      r0 += int(two.x > it);
      r1 += int(two.y > it);
    }
    const int rank = r0 + r1;
    if (rank < kk) {
      const float v = key_to_float(item_key(it));
      lp_out[rank] = v == -INFINITY ? -INFINITY : float(double(v) - lse_d);
      id_out[rank] = item_id(it);
    }
  }
  for (int r = kk + lane; r < k; r += 32) {
    lp_out[r] = -INFINITY;
    id_out[r] = -1;
  }
  if (lane == 0) lse[row] = float(lse_d);
}

}  // namespace kernels
}  // namespace ddtree
