// build_tree kernel, v7 fast path: enumerate every candidate above the counting bound by deviation
// rounds, order them by counting, build the node arrays. The algorithm is described in ../build_tree.cuh.
#pragma once

#include "ddtree/kernels/build_tree/dp_bound.cuh"

namespace ddtree {
namespace build_tree_k {

// -DDDTREE_BUILD_TREE_NO_V7 keeps the level-by-level pool (v6) after the counting bound.
#ifdef DDTREE_BUILD_TREE_NO_V7
constexpr bool kUseV7 = false;
#else
constexpr bool kUseV7 = true;
#endif
constexpr uint16_t kNoPrev = 0xFFFF;
constexpr int kV7Retry = -2;  // v7 cannot decide (pool capacity): the level loop takes over

// Ranks r in [1, nv) with fl(s + row[r]) >= t (a prefix: the row is sorted): gallop, then bisect.
__device__ __forceinline__ int v7_kids(const float* row, int nv, double s, double t) {
  if (nv <= 1 || __dadd_rn(s, static_cast<double>(row[1])) < t) return 0;
  int lo = 2, probe = 2, step = 1;  // ranks < lo pass
  while (probe < nv && __dadd_rn(s, static_cast<double>(row[probe])) >= t) {
    lo = probe + 1;
    probe += step;
    step <<= 1;
  }
  int h2 = probe < nv ? probe : nv;  // rank h2 fails (or is nv)
  while (lo < h2) {
    const int mid = (lo + h2) >> 1;
    if (__dadd_rn(s, static_cast<double>(row[mid])) >= t) lo = mid + 1; else h2 = mid;
  }
  return lo - 1;
}

// Lexicographic order of the rank tuples of pool entries a != b (only for exact score ties).
__device__ bool v7_tuple_less(const Smem& S, int a, int b) {
  int da = static_cast<int>(S.info1[a] >> 18), db = static_cast<int>(S.info1[b] >> 18);
  int ra = static_cast<int>(S.info0[a] >> 12), rb = static_cast<int>(S.info0[b] >> 12);
  int pa = static_cast<int>(S.info0[a] & 0xFFFu), pb = static_cast<int>(S.info0[b] & 0xFFFu);
  const int m = da < db ? da : db;
  for (int d = da; d > m; --d) { ra = static_cast<int>(S.info0[pa] >> 12); pa = static_cast<int>(S.info0[pa] & 0xFFFu); }
  for (int d = db; d > m; --d) { rb = static_cast<int>(S.info0[pb] >> 12); pb = static_cast<int>(S.info0[pb] & 0xFFFu); }
  if (pa == pb && ra == rb) return da < db;  // one is a prefix of the other
  while (pa != pb) {
    ra = static_cast<int>(S.info0[pa] >> 12); pa = static_cast<int>(S.info0[pa] & 0xFFFu);
    rb = static_cast<int>(S.info0[pb] >> 12); pb = static_cast<int>(S.info0[pb] & 0xFFFu);
  }
  return ra < rb;
}

// Block-uniform. Pool entry 0 is the root (score 0, info0 0, info1 depth 0). Every rank this touches is
// in the shared rows (caller: S.rs >= min(K, M)). t must be a valid bound: at least M candidates
// score >= t. Returns the node count (M + 1) with the node arrays and sibling lists filled, -1 when an
// exactness check fails (the serial heap decides), kV7Retry when the pool would overflow.
__device__ int v7_select(Smem& S, Nodes& N, const int32_t* ids, int K, int M, int n_max, int leff, double t) {
  const int tid = threadIdx.x, rs = S.rs;
  // Rounds: the items of a round are the root (round 0) or the entries that end in a rank >= 1 (a
  // deviation from the greedy chain) made by the previous round. An item T of depth p emits its chain
  // extensions T.0^j (rank 0, j >= 1) and, below each of T.0^j (j >= 0), the ranks r >= 1 with
  // kappa >= t: the next round's items. Every candidate above t is emitted exactly once, so the
  // rounds number (deviations of the deepest-deviating candidate) + 1, not the tree depth.
  int size = 1, ia = 0, ib = 1;
  DDTREE_BUILD_TREE_MARK(50);
  #pragma unroll 1
  while (ia < ib) {
    #pragma unroll 1
    for (int c0 = ia; c0 < ib; c0 += kThreads) {
      const int e = c0 + tid;
      bool item = false;
      int p = 0;
      double s0 = 0.0;
      if (e < ib) {
        p = static_cast<int>(S.info1[e] >> 18);
        item = e == 0 || (S.info0[e] >> 12) != 0u;
        s0 = S.score[e];
      }
      unsigned cnt = 0;
      if (item) {
        double s = s0;
        #pragma unroll 1
        for (int q = p + 1; q <= leff; ++q) {
          const float* row = S.lps + (q - 1) * rs;
          const double sn = __dadd_rn(s, static_cast<double>(row[0]));
          if (sn < t) break;  // rank 0 is the best child: nothing deeper either
          cnt += 1u + static_cast<unsigned>(v7_kids(row, S.nvalid[q - 1], s, t));
          s = sn;
        }
      }
      unsigned total;
      const unsigned base = block_exclusive_scan(S, cnt, &total) + static_cast<unsigned>(size);
      if (size + static_cast<int>(total) >= kCap) {  // block-uniform
        __syncthreads();
        if (tid == 0) DDTREE_BUILD_TREE_EVENT(v7_overflow);
        return kV7Retry;
      }
      if (item) {
        unsigned pos = base;
        uint32_t par = static_cast<uint32_t>(e);
        double s = s0;
        #pragma unroll 1
        for (int q = p + 1; q <= leff; ++q) {
          const float* row = S.lps + (q - 1) * rs;
          const double sn = __dadd_rn(s, static_cast<double>(row[0]));
          if (sn < t) break;
          const int c = v7_kids(row, S.nvalid[q - 1], s, t);
          const unsigned ext = pos++;
          const uint32_t i1 = 1u | (static_cast<uint32_t>(q) << 18);
          S.score[ext] = sn; S.info0[ext] = par; S.info1[ext] = i1; S.sidx[ext] = kNoPrev;
          #pragma unroll 1
          for (int r = 1; r <= c; ++r, ++pos) {
            S.score[pos] = __dadd_rn(s, static_cast<double>(row[r]));
            S.info0[pos] = par | (static_cast<uint32_t>(r) << 12);
            S.info1[pos] = i1;
            S.sidx[pos] = static_cast<uint16_t>(r == 1 ? ext : pos - 1);
          }
          par = ext;
          s = sn;
        }
      }
      size += static_cast<int>(total);
      __syncthreads();  // the next scan reuses S.warp_sum; the next round reads these entries
    }
    ia = ib;
    ib = size;
    DDTREE_BUILD_TREE_MARK(51);
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(v7_round);
  }
  if (size - 1 < M) return kV7Retry;  // cannot happen with a valid bound; the level loop would decide
  if (tid == 0) S.score[size] = kNegInf;  // pads the pairwise loads below (size < kCap)
  __syncthreads();
  // Node index of every entry = 1 + number of entries ahead of it in (kappa desc, tuple asc). Pairs of
  // scores per 16-byte load; the root (entry 0, score 0) is counted and then taken out again.
  const int pairs = (size + 1) >> 1;
  const double2* sc2 = reinterpret_cast<const double2*>(S.score);
  #pragma unroll 1
  for (int e = 1 + tid; e < size; e += kThreads) {
    const double x = S.score[e];
    int above = 0, eq = 0;
    #pragma unroll 4
    for (int f = 0; f < pairs; ++f) {
      const double2 y = sc2[f];
      above += (y.x > x ? 1 : 0) + (y.y > x ? 1 : 0);
      eq += (y.x == x ? 1 : 0) + (y.y == x ? 1 : 0);
    }
    above -= 0.0 > x ? 1 : 0;           // the root
    eq -= 1 + (x == 0.0 ? 1 : 0);       // itself, and the root when x == 0
    if (eq > 0) {                       // exact score ties: the tuples decide
      #pragma unroll 1
      for (int f = 1; f < size; ++f)
        if (f != e && S.score[f] == x && v7_tuple_less(S, f, e)) ++above;
    }
    S.scr[e] = static_cast<uint32_t>(1 + above);
  }
  if (tid == 0) S.scr[0] = 0u;
  #pragma unroll 1
  for (int i = tid; i < n_max; i += kThreads) { N.fc[i] = -1; N.ns[i] = -1; }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(52);
  int bad = 0;
  #pragma unroll 1
  for (int e = 1 + tid; e < size; e += kThreads) {
    const int i = static_cast<int>(S.scr[e]);
    if (i > M) continue;
    const uint32_t i0 = S.info0[e];
    const int ep = static_cast<int>(i0 & 0xFFFu), r = static_cast<int>(i0 >> 12);
    const int dep = static_cast<int>(S.info1[e] >> 18);
    const int par = static_cast<int>(S.scr[ep]);
    N.par[i] = static_cast<int16_t>(par);
    N.rank[i] = static_cast<uint16_t>(r);
    N.dep[i] = static_cast<uint8_t>(dep);
    N.tok[i] = __ldg(ids + static_cast<size_t>(dep - 1) * K + r);
    const uint16_t pe = S.sidx[e];
    const int16_t prev = pe != kNoPrev ? static_cast<int16_t>(S.scr[pe]) : int16_t(-1);
    N.prev[i] = prev;
    // The previous sibling (rank r - 1) and the parent beat this node, so they are nodes too.
    if (r == 0) N.fc[par] = static_cast<int16_t>(i);
    else N.ns[prev] = static_cast<int16_t>(i);
    // The heap scores the next sibling as fl(fl(s - lp[r]) + lp[r+1]): equal to kappa when
    // fl(s - lp[r]) gives the parent's score back (same check as the level path).
    if (r + 1 < K) {
      const double back = __dsub_rn(S.score[e], static_cast<double>(S.lps[(dep - 1) * rs + r]));
      if (back != S.score[ep]) bad = 1;
    }
  }
  if (tid == 0) { N.par[0] = -1; N.rank[0] = 0; N.dep[0] = 0; N.prev[0] = -1; }
  if (bad) S.bad = 1;
  __syncthreads();
  if (tid == 0 && S.bad) DDTREE_BUILD_TREE_EVENT(inexact);
  DDTREE_BUILD_TREE_MARK(53);
  return S.bad ? -1 : M + 1;
}

}  // namespace build_tree_k
}  // namespace ddtree
