// build_tree, part 3b: the survivors' order by a bucketed rank (session 13, issue #3), the default in front of
// sort.cuh's sorts (which stay as its fallback and, with the tighten, behind DDTREE_BUILD_TREE_ORDER=bitonic).
// The algorithm is described in ../build_tree.cuh; bench/NOTES.md "### Session 13 (s13tree)" has the
// measurements.
#pragma once

#include "ddtree/kernels/build_tree/sort.cuh"

namespace ddtree {
namespace build_tree_k {

// Params::order: 0 = the bucketed rank without the tighten (the default: parallel_select cuts the survivors to ~M
// only above 2 * kThreads), 1 = the tighten and the packed / bitonic sorts alone (the default before session 13,
// the A/B peer), 2 = the tighten, then the rank (opt-in; session 13's first step, kept for the A/B).
constexpr int kOrderRank = 0;
constexpr int kOrderBitonic = 1;
constexpr int kOrderRankTighten = 2;
constexpr int kRankBins = kSelBins;  // histogram bins: S.fhist, zero outside fast_select
constexpr int kRankBinCap = 64;      // a fuller bin (scores bunched, or ties) goes back to the sort
constexpr int kRankBase = kSort / 2;  // the bucket-ordered copy lives in S.sidx[kRankBase, +ns)
static_assert(2 * kThreads + 1 <= kRankBase, "the result S.sidx[0, 1 + ns) and the copy must not overlap");
static_assert(kRankBins % 32 == 0, "warp 0 scans kRankBins / 32 bins a lane");

// The heap's order: score desc, then the tuple code asc; the pool index only makes the order total (equal
// codes of equal scores do not occur; it keeps the ranks a permutation if they ever did).
__device__ __forceinline__ bool rank_before(const Smem& S, int a, unsigned long long ka, int b,
                                            unsigned long long kb) {
  if (ka != kb) return ka < kb;
  const unsigned long long la = S.lex[a], lb = S.lex[b];
  return la != lb ? la < lb : a < b;
}

// Orders the non-root survivors S.sidx[1, 1 + ns) (pool indices, any order; ns <= kThreads * E) exactly as
// sort_merge + fix_tie_runs do (score desc, tuple code asc) and sets S.sidx[0] = 0. Scores lie in [lo, hi].
// Each survivor goes to one of kRankBins equal-width score bins, b(x) = floor(fl(hi - x) * (kRankBins /
// (hi - lo))) clamped: every step is monotone, so a lower bin means a strictly higher score and equal
// scores share a bin. Then one warp scans the bin counts, each survivor is written to its bin's slice of a
// bucket-ordered copy, and its position is its bin's offset plus the members of its own bin that come
// before it. Four barriers, no sort network; the per-thread chain is one bin (<= kRankBinCap compares).
// Returns false, with S.sidx[1, 1 + ns) untouched, when a bin holds more than kRankBinCap survivors: the
// caller sorts. Leaves S.fhist dirty, as fix_tie_runs does (parallel_select clears it at entry).
template <int E>
__device__ __noinline__ bool rank_buckets(Smem& S, int ns, double lo, double hi) {
  const int tid = threadIdx.x;
  double scale = 0.0;  // 0: one bin (hi == lo, or a range the division cannot represent)
  if (hi > lo) {
    scale = __ddiv_rn(static_cast<double>(kRankBins), __dsub_rn(hi, lo));
    if (!(scale < 1e300)) scale = 0.0;
  }
  int pe[E], bin[E];
  unsigned slot[E];
  unsigned long long key[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = tid + kThreads * e;
    bin[e] = -1;
    if (i < ns) {
      pe[e] = S.sidx[1 + i];
      const double x = S.score[pe[e]];
      key[e] = ~ord_asc(x);
      const double q = __dmul_rn(__dsub_rn(hi, x), scale);  // NaN only for x = -inf: the last bin
      bin[e] = q < static_cast<double>(kRankBins - 1) ? static_cast<int>(q) : kRankBins - 1;
      slot[e] = atomicAdd(&S.fhist[bin[e]], 1u);
    }
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(65);
  if (tid < 32) {  // warp 0: bin counts -> exclusive offsets (in place), and the fullest bin
    constexpr int per = kRankBins / 32;
    const int lane = tid;
    unsigned v[per];
    unsigned local = 0, most = 0;
#pragma unroll
    for (int q = 0; q < per; ++q) {
      v[q] = S.fhist[lane * per + q];
      local += v[q];
      most = v[q] > most ? v[q] : most;
    }
    unsigned inc = local;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
      const unsigned m = __shfl_xor_sync(0xffffffffu, most, o);
      most = m > most ? m : most;
    }
    unsigned run = inc - local;
#pragma unroll
    for (int q = 0; q < per; ++q) {
      S.fhist[lane * per + q] = run;
      run += v[q];
    }
    if (lane == 0) S.rank_full = most > static_cast<unsigned>(kRankBinCap);
  }
  __syncthreads();
  if (S.rank_full) return false;  // block-uniform; S.rank_full is written again only after this phase's barriers
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (bin[e] >= 0) S.sidx[kRankBase + S.fhist[bin[e]] + slot[e]] = static_cast<uint16_t>(pe[e]);
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(66);
  // S.sidx[1, 1 + ns) was read before the first barrier and the copy is read only from kRankBase up, so the
  // result can be written while other threads still rank.
#pragma unroll
  for (int e = 0; e < E; ++e) {
    if (bin[e] < 0) continue;
    const int start = static_cast<int>(S.fhist[bin[e]]);
    const int end = bin[e] + 1 < kRankBins ? static_cast<int>(S.fhist[bin[e] + 1]) : ns;
    int r = start;
#pragma unroll 4
    for (int j = start; j < end; ++j) {
      const int o = S.sidx[kRankBase + j];
      const unsigned long long ko = ~ord_asc(S.score[o]);
      r += o != pe[e] && rank_before(S, o, ko, pe[e], key[e]) ? 1 : 0;
    }
    S.sidx[1 + r] = static_cast<uint16_t>(pe[e]);
  }
  if (tid == 0) S.sidx[0] = 0;
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(67);
  return true;
}

}  // namespace build_tree_k
}  // namespace ddtree
