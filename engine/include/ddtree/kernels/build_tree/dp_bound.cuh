// build_tree kernel: the counting bound (a one-shot lower bound of the M-th best score, v7).
// The algorithm is described in ../build_tree.cuh; this part replaces the chain-bound selection.
#pragma once

#include "ddtree/kernels/build_tree/serial_heap.cuh"

namespace ddtree {
namespace build_tree_k {

// Why it works. Write a candidate of depth d as the greedy chain 0^d with deviations: its real-valued
// score is C_d - sum of gaps g_i(r_i) = lp[i][0] - lp[i][r_i] >= 0 over the positions where r_i > 0
// (C_d = sum of the row heads). Round every gap UP to a multiple of h (q = ceil(g / h)). Then
// F_d[b] = number of rank tuples of depth d whose rounded gaps sum to <= b bins is a d-fold convolution
// of per-row bin counts (F_d[b] = sum_r F_{d-1}[b - q_d(r)], F_0 = 1), one pass per depth. A tuple
// counted at score budget Delta = b * h for depth d (rounded gap sum <= b - ceil((hi - C_d) / h)) has a
// real score >= hi - Delta, so tot[b] = sum_d F_d[b - o_d] never over-counts: if tot[b] >= M, at least
// M candidates score >= hi - b * h, which is therefore <= the M-th best score (minus a margin for the
// fp64 rounding of kappa, far below 1e-9). The rounding only costs tightness: on the bench's rows
// (L = 15, K = 64/1024, sharpness 1-8, M = 64-1024) the CPU model found 1.00-1.18 M candidates above
// the bound with 256 bins, against 1.3-17 M for the chain bound. The bin width comes from a cheap
// upper estimate U of the M-th score's distance to the best one: ceil(sqrt(M))^2 tuples of depth 2
// (or M of depth 1) score at least hi - U; U only sets the resolution, the count decides validity.
constexpr int kDpBins = 255;  // bins 0..kDpBins
// Threads per bin (2 at 512 threads): they split the ranks of the sum and add up with one shuffle.
constexpr int kDpSplit = kThreads >= 2 * (kDpBins + 1) ? 2 : 1;
static_assert(kDpBins + 1 <= kThreads, "at least one thread per bin");
static_assert(2 * (kDpBins + 1) <= kCap, "ping-pong counts live in S.scr");
static_assert(kLps <= kSort, "the rounded gaps live in S.sidx");
constexpr uint32_t kDpSat = 1u << 24;
// -DDDTREE_BUILD_TREE_NO_DP_BOUND restores the chain-bound selection (the emulator tests use it to keep
// the raise / refine / compact paths covered: with the counting bound they rarely run).
#ifdef DDTREE_BUILD_TREE_NO_DP_BOUND
constexpr bool kUseDpBound = false;
#else
constexpr bool kUseDpBound = true;
#endif

// Block-uniform call after the rows (S.lps), S.nvalid and S.leff are ready. Returns true and *t_out
// (a valid lower bound of the M-th best kappa) or false (no bound found: the caller falls back to the
// chain bound). Uses S.scr and S.sidx as scratch; ends with a barrier.
__device__ __forceinline__ bool dp_bound(Smem& S, int leff, int M, double* t_out) {
  const int tid = threadIdx.x, rs = S.rs;
  const float* L0 = S.lps;
  const double hi = static_cast<double>(L0[0]);
  int a = 1;
  while (a * a < M) ++a;
  double U;
  const int nv0 = min(S.nvalid[0], rs);
  if (leff >= 2) {
    a = min(a, min(nv0, min(S.nvalid[1], rs)));
    U = hi - (static_cast<double>(L0[a - 1]) + static_cast<double>(L0[rs + a - 1]));
  } else {
    a = min(M, nv0);
    U = hi - static_cast<double>(L0[a - 1]);
  }
  if (!(U > 0.0) || !(U < 1e300) || a < 1) return false;  // block-uniform
  const double h = U / static_cast<double>(kDpBins - 4);
  const double inv_h = 1.0 / h;
  // Rounded gaps of every (depth, rank) the DP uses: q <= kDpBins + 1 (larger gaps never fit).
  #pragma unroll 1
  for (int idx = tid; idx < leff * rs; idx += kThreads) {
    const int d = idx / rs, r = idx - d * rs;
    if (r < min(S.nvalid[d], rs)) {
      const double g = static_cast<double>(L0[d * rs]) - static_cast<double>(L0[idx]);
      const double q = ceil(g * inv_h);
      S.sidx[idx] = static_cast<uint16_t>(q < static_cast<double>(kDpBins + 1) ? q : static_cast<double>(kDpBins + 1));
    }
  }
  if (tid == 0) S.dp_bin = kDpBins + 1;
  __syncthreads();
  uint32_t* buf = S.scr;  // F_{d-1} in buf[((d - 1) & 1) * (kDpBins + 1) + b]
  const int b = tid / kDpSplit, part = tid % kDpSplit;
  uint32_t tot = 0;
  double C = 0.0;
  #pragma unroll 1
  for (int d = 1; d <= leff; ++d) {
    C += static_cast<double>(L0[(d - 1) * rs]);
    const double od = ceil((hi - C) * inv_h);
    if (!(od <= static_cast<double>(kDpBins))) break;  // this depth and deeper ones contribute nothing
    const int o = static_cast<int>(od);
    const int lim = min(S.nvalid[d - 1], rs);
    const uint16_t* q = S.sidx + (d - 1) * rs;
    uint32_t* cur = buf + (d & 1) * (kDpBins + 1);
    const uint32_t* prev = buf + ((d - 1) & 1) * (kDpBins + 1);
    const bool mine = b <= kDpBins - o;
    uint32_t acc = 0;
    if (mine) {
      // Ranks whose rounded gap fits b bins: a prefix (gaps grow with the rank), found by bisection,
      // so that the sum below has a known trip count and its loads overlap (4 per step). A plain
      // loop with an early exit made every step two dependent shared loads: ~15k cycles per depth
      // at K = 1024 on the H200.
      int n = 0, hi2 = lim;
      while (n < hi2) {
        const int mid = (n + hi2) >> 1;
        if (static_cast<int>(q[mid]) <= b) n = mid + 1; else hi2 = mid;
      }
      if (d == 1) {
        acc = part == 0 ? static_cast<uint32_t>(n) : 0u;  // F_0 = 1 everywhere
      } else {
        int r = part;
        constexpr int st = kDpSplit;
        #pragma unroll 1
        for (; r + 3 * st < n; r += 4 * st) {
          const int q0 = q[r], q1 = q[r + st], q2 = q[r + 2 * st], q3 = q[r + 3 * st];
          acc += (prev[b - q0] + prev[b - q1]) + (prev[b - q2] + prev[b - q3]);
          acc = acc < kDpSat ? acc : kDpSat;  // each term <= kDpSat: no u32 overflow
        }
        #pragma unroll 1
        for (; r < n; r += st) acc += prev[b - q[r]];
        acc = acc < kDpSat ? acc : kDpSat;
      }
    }
    if (kDpSplit == 2) {  // the pair sits in one warp; every lane takes part in the shuffle
      acc += __shfl_xor_sync(0xffffffffu, acc, 1);
      acc = acc < kDpSat ? acc : kDpSat;
    }
    if (mine && part == 0) cur[b] = acc;
    __syncthreads();
    if (part == 0 && b <= kDpBins && b >= o) tot += cur[b - o];
    // cur is rewritten two depths later, after the next iteration's barrier: no second barrier here.
  }
  const bool ok = part == 0 && b <= kDpBins && tot >= static_cast<uint32_t>(M);
  const unsigned bal = __ballot_sync(0xffffffffu, ok);
  if ((tid & 31) == 0 && bal) atomicMin(&S.dp_bin, ((tid & ~31) + __ffs(bal) - 1) / kDpSplit);
  __syncthreads();
  const int bin = S.dp_bin;
  if (bin > kDpBins) return false;
  const double t = hi - static_cast<double>(bin) * h;
  *t_out = t - 1e-9 * (1.0 + fabs(t) + U);
  return true;
}

}  // namespace build_tree_k
}  // namespace ddtree
