// build_tree, part 5a: parallel_select, the level-by-level pool selection that drives parts 1-4 (the
// bounds, v7's enumeration, the raises and compaction, the bitonic sort, the after-the-fact exactness
// checks). build_tree.cuh's header comment has the design; its kernels call this for every request that
// v8 / v10 / v11 hand back. Separate from build_tree.cuh (which keeps the kernels) so that each file
// stays under 500 lines; build_tree.cuh includes this file where these lines used to be, so the
// translation units see the same code.
#pragma once

#include "ddtree/kernels/build_tree/enumerate.cuh"
#include "ddtree/kernels/build_tree/rank.cuh"

namespace ddtree {
namespace build_tree_k {

// ---- the parallel selection ----------------------------------------------------------------------

// Returns the node count with the node arrays filled, or -1 when the serial heap must decide.
__device__ int parallel_select(Smem& S, Nodes& N, const float* lp, const int32_t* ids, int L, int K, int M,
                               int n_max, int impl, int order) {
  const int tid = threadIdx.x;
  const int R = min(K, M + 1);  // ranks the checks look at (a popped rank < M, its sibling <= M)
  const int rs = min(R, kLps / L);
  #pragma unroll 1
  for (int d = tid; d < L; d += kThreads) S.nvalid[d] = R;
  #pragma unroll 1
  for (int i = tid; i < kSelBins; i += kThreads) S.fhist[i] = 0u;
  if (tid == 0) {
    S.bad = 0;
    S.rs = rs;
  }
  __syncthreads();
  {
    // Four elements per thread per step, all loads issued before any check (first touches of the
    // rows go to L2/HBM; this pass also warms L1 for the binary searches that follow).
    int bad = 0;
    constexpr int kU = 4;
    #pragma unroll 1
    for (int base = tid; base < L * R; base += kU * kThreads) {
      float x[kU], y[kU];
      int dd[kU], rr[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int idx = base + u * kThreads;
        dd[u] = idx / R;
        rr[u] = idx - dd[u] * R;
        const bool in = idx < L * R;
        const float* q = lp + static_cast<size_t>(dd[u]) * K + rr[u];
        x[u] = in ? __ldg(q) : -1.f;
        y[u] = in && rr[u] > 0 ? __ldg(q - 1) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (base + u * kThreads >= L * R) continue;
        if (rr[u] < rs) S.lps[dd[u] * rs + rr[u]] = x[u];
        if (!(x[u] <= 0.f)) bad = 1;                 // positive or NaN
        if (rr[u] > 0 && x[u] > y[u]) bad = 1;       // not sorted descending
        if (x[u] == -__builtin_huge_valf()) atomicMin(&S.nvalid[dd[u]], rr[u]);
      }
    }
    if (bad) S.bad = 1;
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(1);
  if (tid < 32) {
    // Warp 0: clamp the rank counts, find the effective depth (first depth without a candidate), the
    // greedy chain kappa(0^d) (sequential fp64 additions, every lane in step, the row heads broadcast
    // by shuffles) and the chain-bound family's size and score range.
    const int lane = tid;
    const int rm = min(K, M);
    int leff = L, fam = 0;
    double a = 0.0;
    unsigned long long fam_lo = ~0ull;
    for (int base = 0; base < L; base += 32) {
      const int dd = base + lane;
      int nv = 0;
      if (dd < L) {
        nv = min(S.nvalid[dd], rm);
        S.nvalid[dd] = nv;
      }
      const unsigned empty = __ballot_sync(0xffffffffu, dd < L && nv == 0);
      const int lim = empty ? __ffs(empty) - 1 : min(32, L - base);
      const float x0 = lane < lim ? row_of(S, lp, K, dd).at(0) : 0.f;
      const float xl = lane < lim ? row_of(S, lp, K, dd).at(nv - 1) : 0.f;
      double mine = 0.0;
#pragma unroll 1
      for (int i = 0; i < lim; ++i) {
        const double xi = static_cast<double>(__shfl_sync(0xffffffffu, x0, i));
        if (lane == i) mine = a;
        a = __dadd_rn(a, xi);
      }
      if (lane < lim) {
        S.chain[dd] = mine;
        fam += nv;
        const unsigned long long o = ord_asc(__dadd_rn(mine, static_cast<double>(xl)));
        fam_lo = o < fam_lo ? o : fam_lo;
      }
      if (empty) {
        leff = base + lim;
        break;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) fam += __shfl_xor_sync(0xffffffffu, fam, o);
    fam_lo = warp_min_u64(fam_lo);
    if (lane == 0) {
      S.leff = leff;
      S.fam = fam;
      S.fam_lo = fam_lo != ~0ull ? from_ord(fam_lo) : 0.0;
      S.fam_hi = leff > 0 ? static_cast<double>(row_of(S, lp, K, 0).at(0)) : 0.0;  // chain[1] >= every member
      const int log2m = 31 - __clz(static_cast<unsigned>(M));
      if (2 * leff + 2 * log2m > 64) S.bad = 1;  // the tuple code would not fit 64 bits
      S.score[0] = 0.0; S.lex[0] = 0; S.info0[0] = 0; S.info1[0] = 1u;  // the root: pi 1, depth 0
    }
  }
  __syncthreads();
  if (S.bad) {
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(invalid_rows);
    return -1;
  }
  const int leff = S.leff;
  const int need = M + 1;
  // The pool may grow to `soft` live entries before a raise (fast_select over the flat pool).
  const int soft = min(kCap, max(256, 2 * need));
  const int raise_target = need + max(32, need / 8);
  int size = 1, pa = 0, pb = 1, live = 1;
  double t = kNegInf;
  bool counted = false;  // t is the counting bound (valid: >= M candidates score >= t)
  const bool try_dp = impl == kImplV6Dp || impl == kImplV7 || (impl == kImplAuto && M > kAutoDpMinM);
  if (kUseDpBound && try_dp && dp_bound(S, leff, M, &t)) {  // the counting bound (dp_bound.cuh)
    counted = true;
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(dp_bound);
  } else if (S.fam > M) {  // enough distinct candidates to bound the M-th best score
    int cnt = 0;
    // The probes where K >= M (the family holds the M depth-1 ranks); the histogram elsewhere and
    // under v6 (the same-process peer). H200 (bench/NOTES.md "### Session 10"): the probes were faster
    // on every measured K = 1024 row at M = 256 (1.03-1.17x, B = 1 / 8 / 64), but at K = 64 their
    // bound, exact to M members, leaves some requests a tighten the histogram's lower edge spares
    // (CPU emulator), and batches wait for such a request: 0.95-0.99x on four of the six K = 64
    // batch rows although every K = 64 single request was faster (1.02-1.10x).
    t = impl != kImplV6 && K >= M ? chain_bound_probes(S, lp, K, leff, M, M + max(32, M / 8), &cnt)
                                  : chain_bound(S, lp, K, leff, M, M, &cnt);
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(chain_bound);
  }
  DDTREE_BUILD_TREE_MARK(2);
  if (kUseV7 && impl == kImplV7 && counted && rs >= min(K, M)) {  // v7: deviation rounds + counting order (enumerate.cuh)
    const int n7 = v7_select(S, N, ids, K, M, n_max, leff, t);
    if (n7 != kV7Retry) return n7;
  }
  int d = 1;
  bool warp_tried = false;  // warp mode already stopped at this level: take it block-wide
  while (d <= leff && pb > pa) {
    if (pb - pa <= 32 && !warp_tried) {
      LevelState st{d, size, pa, pb, live};
      if (tid < 32) warp_levels(S, lp, K, M, leff, soft, t, st);
      if (tid == 0) { S.lvl = st; }
      __syncthreads();
      const LevelState got = S.lvl;
      __syncthreads();  // S.lvl is rewritten by the next warp-mode episode
      warp_tried = got.d == d;
      d = got.d; size = got.size; pa = got.pa; pb = got.pb; live = got.live;
      DDTREE_BUILD_TREE_MARK(40 + d);
      continue;
    }
    warp_tried = false;
    const Row row = row_of(S, lp, K, d - 1);
    const int nv = S.nvalid[d - 1];
    int np = pb - pa;
    int total = count_children(S, row, nv, M, pa, np, t);
    if (size + total > kCap) {
      // The level does not fit the pool: drop the entries that earlier raises left dead first (no
      // selection needed); only if it still does not fit, raise over the pool and the level's virtual
      // children (nothing materialized) and compact again.
      if (tid == 0) DDTREE_BUILD_TREE_EVENT(compact);
      size = compact_pool(S, size, t, &pa);
      live = size;
      np = size - pa;
      total = count_children(S, row, nv, M, pa, np, t);
      if (size + total > kCap && live + total > soft) {
        int cnt = 0;
        DDTREE_BUILD_TREE_MARK(90);
        const double t2 = raise_threshold(S, row, pa, np, total, size, t, need, raise_target, &cnt);
        DDTREE_BUILD_TREE_MARK(91);
        if (tid == 0) DDTREE_BUILD_TREE_EVENT(raise);
        if (t2 > t) {
          t = t2;
          total = count_children(S, row, nv, M, pa, np, t);
          live = cnt - total;
          if (size + total > kCap) {
            size = compact_pool(S, size, t, &pa);
            np = size - pa;
            total = count_children(S, row, nv, M, pa, np, t);
          }
        }
      }
      if (size + total > kCap) {  // massive score ties: let the serial heap decide
        if (tid == 0) DDTREE_BUILD_TREE_EVENT(overflow);
        return -1;
      }
    }
    materialize(S, row, pa, np, total, size, d);
    pa = size;
    size += total;
    pb = size;
    live += total;
    __syncthreads();
    if (live > soft) {  // raise t to (about) the need-th best score of the pool, all in place
      int cnt = 0;
      DDTREE_BUILD_TREE_MARK(92);
      const double t2 = pool_select(S, size, t, need, raise_target, &cnt);
      DDTREE_BUILD_TREE_MARK(93);
      if (tid == 0) DDTREE_BUILD_TREE_EVENT(raise);
      if (t2 > t) t = t2;
      live = cnt;
    }
    DDTREE_BUILD_TREE_MARK(10 + d);
    ++d;
  }
  int n_live = live;
  {
    int pmin = 1;
    while (pmin < M) pmin <<= 1;
    // The sorts would double: cut the survivors to (about) exactly M first. The rank has no power-of-two size,
    // so the default order ranks up to 2 * kThreads survivors instead (the first M + 1 are the same nodes;
    // H200, bench/NOTES.md "### Session 13 (s13tree)": 1.07-1.22x over the tighten + sorts at M = 256).
    const int keep = order == kOrderRank ? max(pmin, 2 * kThreads) : pmin;
    if (n_live - 1 > keep) {
      if (tid == 0) DDTREE_BUILD_TREE_EVENT(tighten);
      t = pool_select(S, size, t, need, need, &n_live);
    }
  }
  DDTREE_BUILD_TREE_MARK(80);
  // Survivors (kappa >= t; n_live of them): the root in S.sidx[0], the others after it in any order.
  if (tid == 0) {
    S.count = 1;
    S.sidx[0] = 0;
    S.pool_min = ~0ull;
    S.rank_hi_inv = ~0ull;
  }
  __syncthreads();
  {
    // One shared atomic per warp and step (a single counter hit by every survivor serializes).
    const int lane = tid & 31;
    unsigned long long mn = ~0ull, mx = 0ull;
    #pragma unroll 1
    for (int base = 0; base < size; base += kThreads) {
      const int e = base + tid;
      const double x = e >= 1 && e < size ? S.score[e] : kNegInf;
      const bool keep = e >= 1 && e < size && x >= t;
      const unsigned ballot = __ballot_sync(0xffffffffu, keep);
      int off = 0;
      if (lane == 0 && ballot) off = atomicAdd(&S.count, popc32(ballot));
      off = __shfl_sync(0xffffffffu, off, 0);
      if (keep) {
        S.sidx[off + popc32(ballot & ((1u << lane) - 1u))] = static_cast<uint16_t>(e);
        const unsigned long long o = ord_asc(x);
        mn = o < mn ? o : mn;
        mx = o > mx ? o : mx;
      }
    }
    if (order != kOrderBitonic) {  // the rank's bins span [key_lo, the highest survivor]
      const unsigned long long hi_inv = warp_min_u64(~mx);
      if ((tid & 31) == 0 && hi_inv != ~0ull) atomicMin(&S.rank_hi_inv, hi_inv);
    }
    if (t == kNegInf) {  // no threshold yet: the packed keys need the survivors' smallest score
      mn = warp_min_u64(mn);
      if ((tid & 31) == 0 && mn != ~0ull) atomicMin(&S.pool_min, mn);
    }
  }
  __syncthreads();
  n_live = S.count;
  const double key_lo = t != kNegInf ? t : (S.pool_min != ~0ull ? from_ord(S.pool_min) : 0.0);
  DDTREE_BUILD_TREE_MARK(81);
  const int ns = n_live - 1;
  bool tie = true;
  bool ranked = false;
  if (order != kOrderBitonic && ns >= 1 && ns <= 2 * kThreads) {
    const double hi = from_ord(~S.rank_hi_inv);
    ranked = ns <= kThreads ? rank_buckets<1>(S, ns, key_lo, hi) : rank_buckets<2>(S, ns, key_lo, hi);
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(rank);
    if (!ranked && tid == 0) DDTREE_BUILD_TREE_EVENT(rank_full);
  }
  if (ranked) {  // ordered: the sorts below run only where the rank did not (a full bin, or the peer)
    tie = false;
  } else if (ns <= kThreads) {
    tie = sort_merge<1>(S, ns, key_lo);
  } else if (ns <= 2 * kThreads) {
    tie = sort_merge<2>(S, ns, key_lo);
  } else if (ns <= 4 * kThreads) {
    tie = sort_packed<4>(S, ns, key_lo);
  }
  if (tie) {  // equal packed keys (real score ties, or scores too close for 32 bits): full keys
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(full_sort);
    if (n_live <= kThreads) {
      sort_survivors<1>(S, n_live);
    } else if (n_live <= 2 * kThreads) {
      sort_survivors<2>(S, n_live);
    } else if (n_live <= 4 * kThreads) {
      sort_survivors<4>(S, n_live);
    } else {  // only with heavy score ties near the cutoff
      int P = 1;
      while (P < n_live) P <<= 1;
      #pragma unroll 1
      for (int i = n_live + tid; i < P; i += kThreads) S.sidx[i] = 0xFFFF;
      __syncthreads();
      bitonic_sort(S, P);
    }
  }
  DDTREE_BUILD_TREE_MARK(82);
  const int n = min(need, n_live);
  #pragma unroll 1
  for (int i = tid; i < n; i += kThreads) S.scr[S.sidx[i]] = static_cast<uint32_t>(i);
  // From here `lex` is dead (the sorts ended with a barrier): its storage holds the node arrays.
  #pragma unroll 1
  for (int i = tid; i < n_max; i += kThreads) { N.fc[i] = -1; N.ns[i] = -1; }
  __syncthreads();
  int bad = 0;
  #pragma unroll 1
  for (int i = tid; i < n; i += kThreads) {
    if (i == 0) { N.par[0] = -1; N.rank[0] = 0; N.dep[0] = 0; N.prev[0] = -1; continue; }
    const int e = S.sidx[i];
    const uint32_t i0 = S.info0[e], i1 = S.info1[e];
    const int ep = static_cast<int>(i0 & 0xFFFu), r = static_cast<int>(i0 >> 12), dep = static_cast<int>(i1 >> 18);
    N.par[i] = static_cast<int16_t>(S.scr[ep]);
    N.rank[i] = static_cast<uint16_t>(r);
    N.dep[i] = static_cast<uint8_t>(dep);
    N.tok[i] = __ldg(ids + static_cast<size_t>(dep - 1) * K + r);  // overlaps the checks below
    // Sibling lists: pool entry e - 1 is the previous sibling (rank r - 1), selected before i (the
    // top-M is prefix-closed), so every node writes one slot of its own.
    const int16_t prev = r > 0 ? static_cast<int16_t>(S.scr[e - 1]) : int16_t(-1);
    N.prev[i] = prev;
    if (r == 0) N.fc[N.par[i]] = static_cast<int16_t>(i);
    else N.ns[prev] = static_cast<int16_t>(i);
    // The heap scores the next sibling from this node's score: fl(fl(s - lp[r]) + lp[r+1]). It equals
    // kappa(sibling) = fl(kappa(parent) + lp[r+1]) when fl(s - lp[r]) gives the parent's score back.
    if (r + 1 < K) {
      const double back = __dsub_rn(S.score[e], static_cast<double>(row_of(S, lp, K, dep - 1).at(r)));
      if (back != S.score[ep]) bad = 1;
    }
  }
  if (bad) S.bad = 1;
  __syncthreads();
  if (tid == 0 && S.bad) DDTREE_BUILD_TREE_EVENT(inexact);
  DDTREE_BUILD_TREE_MARK(83);
  return S.bad ? -1 : n;
}

}  // namespace build_tree_k
}  // namespace ddtree
