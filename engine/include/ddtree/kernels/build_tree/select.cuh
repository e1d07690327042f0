// build_tree kernel, part 2 of 5: threshold selection (fast_select and its callers), pool compaction and
// level materialization.
// The algorithm is described in ../build_tree.cuh.
#pragma once

#include "ddtree/kernels/build_tree/common.cuh"

namespace ddtree {
namespace build_tree_k {

// ---- fast_select: the need-th best score of a flat set in 1-3 histogram rounds ----------------------
//
// Nested buckets: q0 = (hi - x) * kSelBins / (hi - lo), digit 0 = floor(q0) clamped to the last bin,
// q1 = (q0 - digit 0) * kSelBins, digit 1 = floor(q1) clamped, and so on. Every step is a monotone fp
// function, so the digit tuple is lexicographically non-decreasing as x decreases: all elements of an
// earlier bucket score >= every element of a later one, and equal scores share a bucket.
// Returns digit `round` of x if its digits 0..round-1 equal S.sel_digit, else -1.
__device__ __forceinline__ int sel_digit_of(const Smem& S, double x, double hi, double inv, int round) {
  double q = __dmul_rn(__dsub_rn(hi, x), inv);
  for (int i = 0;; ++i) {
    const int b = q >= static_cast<double>(kSelBins - 1) ? kSelBins - 1 : static_cast<int>(q);
    if (i == round) return b;
    if (b != S.sel_digit[i]) return -1;
    q = __dmul_rn(__dsub_rn(q, static_cast<double>(b)), static_cast<double>(kSelBins));
  }
}

// Over the elements `each(f)` enumerates (every one in [lo, hi], lo and hi finite), finds the finest
// bucket where the running count from the top reaches `need` and returns a score t' at or below every
// element of that bucket and the ones before it, so #(x >= t') >= need; *cnt gets the count of those
// buckets (elements within ~1e-12 below the bucket may add to it). A round costs one pass, one barrier,
// one warp-0 scan of the bins and one barrier; further rounds (inside the crossing bucket) run only
// while the count exceeds `target`. Leaves S.fhist zeroed.
__device__ DDTREE_BT_OUTLINE double fast_select(Smem& S, const SelSet& q, double lo, double hi, int need, int target,
                                              int* cnt) {
  const int lane = threadIdx.x & 31;
  double inv = 0.0;
  if (hi > lo) {
    inv = __ddiv_rn(static_cast<double>(kSelBins), __dsub_rn(hi, lo));
    if (!(inv < 1e300)) inv = 0.0;  // a subnormal range: one bucket
  }
  int round = 0;
#pragma unroll 1
  for (;; ++round) {
    sel_each(S, q, [&](double x) {
      const int b = sel_digit_of(S, x, hi, inv, round);
      if (b >= 0) atomicAdd(&S.fhist[b], 1u);
    });
    __syncthreads();
    DDTREE_BUILD_TREE_MARK(70 + round);
    if (threadIdx.x < 32) {  // warp 0: running count over the bins, crossing bin, clear the bins
      constexpr int per = kSelBins / 32;
      unsigned v[per];
      unsigned local = 0;
#pragma unroll
      for (int q = 0; q < per; ++q) {
        v[q] = S.fhist[lane * per + q];
        local += v[q];
      }
#pragma unroll
      for (int q = 0; q < per; ++q) S.fhist[lane * per + q] = 0u;
      unsigned inc = local;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
      }
      const unsigned above = round > 0 ? static_cast<unsigned>(S.sel_above) : 0u;
      const unsigned k = static_cast<unsigned>(need) > above ? static_cast<unsigned>(need) - above : 1u;
      const unsigned ballot = __ballot_sync(0xffffffffu, inc >= k);
      const int src = ballot ? __ffs(ballot) - 1 : 31;  // callers guarantee >= need elements
      __syncwarp();
      if (lane == src) {
        unsigned run = inc - local, here = 0;
        int b = lane * per + per - 1;
        bool found = false;
#pragma unroll
        for (int q = 0; q < per; ++q) {
          if (!found && (run + v[q] >= k || q == per - 1)) {
            b = lane * per + q;
            here = v[q];
            found = true;
          } else if (!found) {
            run += v[q];
          }
        }
        S.sel_digit[round] = b;
        S.sel_above = static_cast<int>(above + run);
        S.sel_cnt = static_cast<int>(above + run + here);
        S.sel_small = here <= 1;
      }
    }
    __syncthreads();
    if (S.sel_cnt <= target || S.sel_small || round == kSelRounds - 1 || inv == 0.0) break;
    if (threadIdx.x == 0) DDTREE_BUILD_TREE_EVENT(refine);
  }
  *cnt = S.sel_cnt;
  if (inv == 0.0) return lo;  // one bucket: everything
  // A score edge below the crossing bucket instead of its minimum (saves a pass and a barrier): an
  // element of a bucket at or before the crossing one has q0 < c = d0 + d1/B + ... + (dr + 1)/B^r
  // (q_{i+1} = (q_i - d_i) * B is exact), so x > hi - c * (hi - lo) / B up to a few ulps; the margins
  // (1e-12 relative, far above the rounding) keep every such element at or above the edge.
  double c = 1.0, scale = 1.0;
  for (int i = 0; i <= round; ++i) {
    c = i == 0 ? static_cast<double>(S.sel_digit[0]) : c + scale * static_cast<double>(S.sel_digit[i]);
    if (i < round) scale *= 1.0 / kSelBins;
  }
  c += scale;  // + 1 in the last round's digit
  const double width = __dmul_rn(__dsub_rn(hi, lo), 1.0 / kSelBins);
  const double margin = 1e-12 * (fabs(hi) + fabs(lo));
  const double edge = __dsub_rn(__dsub_rn(hi, __dmul_rn(__dmul_rn(c, width), 1.0 + 1e-12)), margin);
  return edge > lo ? edge : lo;  // S.sel_* are rewritten only after the next select's first barrier
}

// Smallest element of a selection (used while t is still -inf, to bound the buckets).
__device__ DDTREE_BT_OUTLINE double sel_min(Smem& S, const SelSet& q) {
  if (threadIdx.x == 0) S.pool_min = ~0ull;
  __syncthreads();
  unsigned long long mn = ~0ull;
  sel_each(S, q, [&](double x) {
    const unsigned long long o = ord_asc(x);
    mn = o < mn ? o : mn;
  });
  mn = warp_min_u64(mn);
  if ((threadIdx.x & 31) == 0 && mn != ~0ull) atomicMin(&S.pool_min, mn);
  __syncthreads();
  return from_ord(S.pool_min);
}

// Raises t over the flat pool: live entries (kappa >= t) of [0, size), the root included.
__device__ __forceinline__ double pool_select(Smem& S, int size, double t, int need, int target, int* cnt) {
  SelSet q{};
  q.mode = kSelPool;
  q.size = size;
  q.t = t;
  const double lo = t == kNegInf ? sel_min(S, q) : t;
  return fast_select(S, q, lo, 0.0, need, target, cnt);
}

// The pool selection when a level does not fit the pool: live entries and the virtual children of the
// current level (found by a binary search over the parents' offsets).
__device__ __forceinline__ double raise_threshold(Smem& S, const Row& row, int pa, int np, int total, int size,
                                                  double t, int need, int target, int* cnt) {
  SelSet q{};
  q.mode = kSelLevel;
  q.size = size;
  q.t = t;
  q.row = row;
  q.pa = pa;
  q.np = np;
  q.total = total;
  const double lo = t == kNegInf ? sel_min(S, q) : t;
  return fast_select(S, q, lo, 0.0, need, target, cnt);
}

// A starting threshold before any level is built: the score at which `need` candidates of the family
// F = { (0,..,0,r) } (the greedy chain with one deviation at its end, all distinct real candidates) are
// reached is a lower bound of the M-th best score, so it prunes without losing any of the top-M.
// S.chain[d] = kappa(0^d), computed with the same additions the pool uses; S.fam_lo / S.fam_hi bound
// the family's scores (its last and first members).
__device__ __forceinline__ double chain_bound(Smem& S, const float* lp, int K, int leff, int M, int need, int* cnt) {
  SelSet q{};
  q.mode = kSelFamily;
  q.lp = lp;
  q.K = K;
  q.leff = leff;
  q.R = min(K, M);
  return fast_select(S, q, S.fam_lo, S.fam_hi, need, need + max(32, need / 8), cnt);
}

// The same bound without a histogram (session 10; the default where K >= M, see parallel_select; `chain_bound`
// above stays for K < M and for v6, the same-process peer): every warp probes two thresholds per round, one per
// half-warp, and counts the family members scoring >= theta exactly (per depth one bisection over the sorted
// row: the members of depth d are the prefix r < nvalid[d] with fl(chain[d] + lp[d][r]) >= theta, the very
// values the pool computes), so any probe whose count reaches `need` is a valid bound, with no rounding margin.
// Probes split [lo, hi] into 2 * kWarps steps; the highest one reaching `need` becomes lo, its neighbour above
// hi, and the search stops once lo's count is <= target. H200 (bench/NOTES.md "### Session 10"): ~2k cycles a
// round, 1-2 rounds at M = 256, against ~5.5-8.5k for the histogram bound (atomics into 512 bins over up to
// 3,840 members, a warp-0 scan, 2-3 barriers a round).
constexpr int kCbRounds = 3;
constexpr int kCbProbes = 2 * kWarps;  // <= 32: one ballot decides a round
static_assert(kCbProbes <= 32, "the probes of a round must fit one warp's lanes");

__device__ __forceinline__ double cb_theta(double lo, double hi, double step, int j) {
  if (j >= kCbProbes - 1) return lo;
  const double th = __dsub_rn(hi, __dmul_rn(static_cast<double>(j + 1), step));
  return th > lo ? th : lo;
}

__device__ __forceinline__ double chain_bound_probes(Smem& S, const float* lp, int K, int leff, int need, int target,
                                                     int* cnt) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int half = lane >> 4, hl = lane & 15;
  const int j = 2 * warp + half;  // this half-warp's probe
  double lo = S.fam_lo, hi = S.fam_hi;
  int c_lo = S.fam;  // every member scores >= fam_lo; the caller checked fam > need
#pragma unroll 1
  for (int round = 0; round < kCbRounds; ++round) {
    if (threadIdx.x == 0) DDTREE_BUILD_TREE_EVENT(cb_round);
    const double step = __dmul_rn(__dsub_rn(hi, lo), 1.0 / kCbProbes);
    const double th = cb_theta(lo, hi, step, j);
    unsigned c = 0;
#pragma unroll 1
    for (int d = hl; d < leff; d += 16) {
      const Row row = row_of(S, lp, K, d);
      const double cd = S.chain[d];
      int a = 0, b = S.nvalid[d];  // first rank whose member falls below th
      while (a < b) {
        const int mid = (a + b) >> 1;
        if (child_score(cd, row, mid) >= th) a = mid + 1; else b = mid;
      }
      c += static_cast<unsigned>(a);
    }
    // Both half-warps' sums in one reduction: a half's count is < 2^16 (leff <= 63 depths x
    // nvalid <= M <= 1024 ranks), so the halves cannot carry into each other.
    const unsigned both = __reduce_add_sync(0xffffffffu, half ? c << 16 : c);
    int* counts = S.cb_count[round & 1];  // double-buffered: round r + 1 writes what round r - 1 read
    if (lane == 0) {
      counts[2 * warp] = static_cast<int>(both & 0xFFFFu);
      counts[2 * warp + 1] = static_cast<int>(both >> 16);
    }
    __syncthreads();
    // Every warp takes the same decision: the first probe (highest threshold) whose count reaches need.
    // The last probe is lo itself, whose count is c_lo >= need, so there always is one.
    const int v = lane < kCbProbes ? counts[lane] : 0;
    const unsigned ok = __ballot_sync(0xffffffffu, lane < kCbProbes && v >= need);
    const int k = __ffs(static_cast<int>(ok)) - 1;
    c_lo = __shfl_sync(0xffffffffu, v, k);
    const double nlo = cb_theta(lo, hi, step, k);
    hi = k > 0 ? cb_theta(lo, hi, step, k - 1) : hi;
    lo = nlo;
    if (c_lo <= target || !(hi > lo)) break;
  }
  *cnt = c_lo;
  return lo;
}

// Drops pool entries with kappa < t (stable) and remaps parent indices; returns the new size and
// moves *pa (start of the current parents) accordingly.
__device__ DDTREE_BT_OUTLINE int compact_pool(Smem& S, int size, double t, int* pa) {
  const int chunk = (size + kThreads - 1) / kThreads;  // <= kPerThread
  const int beg = min(size, static_cast<int>(threadIdx.x) * chunk), end = min(size, beg + chunk);
  unsigned kept = 0;
  for (int j = beg; j < end; ++j) kept += S.score[j] >= t ? 1u : 0u;
  unsigned total;
  unsigned base = block_exclusive_scan(S, kept, &total);
  for (int j = beg; j < end; ++j) {
    S.scr[j] = base;
    base += S.score[j] >= t ? 1u : 0u;
  }
  __syncthreads();
  const int new_pa = *pa < size ? static_cast<int>(S.scr[*pa]) : static_cast<int>(total);
  // Two passes (scores + codes, then the index words) keep fewer values in registers at once; the
  // barrier between read and write makes the in-place move safe (a destination is never after its
  // source, but may be another thread's unread source).
  {
    double rs[kPerThread];
    unsigned long long rl[kPerThread];
    int dst[kPerThread];
#pragma unroll
    for (int q = 0; q < kPerThread; ++q) {
      const int j = beg + q;
      dst[q] = -1;
      if (j < end && S.score[j] >= t) {
        rs[q] = S.score[j];
        rl[q] = S.lex[j];
        dst[q] = static_cast<int>(S.scr[j]);
      }
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kPerThread; ++q)
      if (dst[q] >= 0) { S.score[dst[q]] = rs[q]; S.lex[dst[q]] = rl[q]; }
  }
  __syncthreads();
  {
    uint32_t r0[kPerThread], r1[kPerThread];
    int dst[kPerThread];
#pragma unroll
    for (int q = 0; q < kPerThread; ++q) {
      const int j = beg + q;
      dst[q] = -1;
      // kept iff the prefix grows after j (the scores were already moved)
      const bool kept = j < end && static_cast<int>(j + 1 < size ? S.scr[j + 1] : total) > static_cast<int>(S.scr[j]);
      if (kept) {
        r1[q] = S.info1[j];
        const uint32_t i0 = S.info0[j];
        const uint32_t par = (r1[q] >> 18) ? S.scr[i0 & 0xFFFu] : 0u;  // the root has no parent
        r0[q] = (i0 & ~0xFFFu) | par;
        dst[q] = static_cast<int>(S.scr[j]);
      }
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < kPerThread; ++q)
      if (dst[q] >= 0) { S.info0[dst[q]] = r0[q]; S.info1[dst[q]] = r1[q]; }
  }
  __syncthreads();
  *pa = new_pa;
  return static_cast<int>(total);
}

// Writes the `total` children counted by count_children into the pool at [size, size + total).
// Writes child slot j (of the children counted by count_children: offsets in S.scr over np parents
// from pa) into the pool at size + j.
__device__ __forceinline__ void materialize_one(Smem& S, const Row& row, int pa, int np, int size, int depth, int j) {
  const int p = slot_parent(S, np, j);
  const int r = j - static_cast<int>(S.scr[p]);
  const int e_par = pa + p;
  const uint32_t i1 = S.info1[e_par];
  const uint32_t pi = (i1 & 0x7FFu) * static_cast<uint32_t>(r + 1);
  const int len_p = static_cast<int>((i1 >> 11) & 0x7Fu);
  // Order-preserving prefix code of rank r: a continuation bit, then b ones, a zero, and the b low
  // bits of r+1 (b = floor(log2(r+1))). A shorter tuple is a prefix padded with zeros: it sorts first.
  const uint32_t v = static_cast<uint32_t>(r + 1);
  const int b = 31 - __clz(v);
  const int n = 2 * b + 2;
  const unsigned long long code = (((1ull << (b + 1)) - 1ull) << (b + 1)) | (v - (1u << b));
  const int e = size + j;
  S.score[e] = child_score(S.score[e_par], row, r);
  S.lex[e] = S.lex[e_par] | (code << (64 - len_p - n));
  S.info0[e] = static_cast<uint32_t>(e_par) | (static_cast<uint32_t>(r) << 12);
  S.info1[e] = pi | (static_cast<uint32_t>(len_p + n) << 11) | (static_cast<uint32_t>(depth) << 18);
}

__device__ void materialize(Smem& S, const Row& row, int pa, int np, int total, int size, int depth) {
  #pragma unroll 1
  for (int j = threadIdx.x; j < total; j += kThreads) materialize_one(S, row, pa, np, size, depth, j);
}

constexpr int kWarpMaxChildren = 256;

// Narrow levels (<= 32 parents, few children, no raise or compaction due) run on warp 0 alone, level
// after level, with no block barrier: deep chains of small levels cost a few hundred cycles each.
// Stops (leaving the state at the level it could not take) when a level is wide or needs the block.
__device__ void warp_levels(Smem& S, const float* lp, int K, int M, int leff, int soft, double t, LevelState& st) {
  const int lane = threadIdx.x & 31;
  while (st.d <= leff && st.pb > st.pa && st.pb - st.pa <= 32) {
    const Row row = row_of(S, lp, K, st.d - 1);
    const int nv = S.nvalid[st.d - 1];
    const int np = st.pb - st.pa;
    const unsigned c = lane < np ? count_one(S, row, nv, M, st.pa + lane, t) : 0u;
    unsigned inc = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      unsigned y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
    }
    const int total = static_cast<int>(__shfl_sync(0xffffffffu, inc, 31));
    if (st.live + total > soft || st.size + total > kCap || total > kWarpMaxChildren) break;
    if (lane < np) S.scr[lane] = inc - c;
    __syncwarp();
    for (int j = lane; j < total; j += 32) materialize_one(S, row, st.pa, np, st.size, st.d, j);
    __syncwarp();
    if (lane == 0) DDTREE_BUILD_TREE_EVENT(warp_level);
    st.pa = st.size;
    st.size += total;
    st.pb = st.size;
    st.live += total;
    ++st.d;
  }
}

}  // namespace build_tree_k
}  // namespace ddtree
