// build_tree kernel, part 4 of 5: the exact single-thread heap a request falls back to when a check fails.
// The algorithm is described in ../build_tree.cuh.
#pragma once

#include "ddtree/kernels/build_tree/sort.cuh"

namespace ddtree {
namespace build_tree_k {

// ---- the exact serial fallback -----------------------------------------------------------------

// Lexicographic order of the rank tuples path(pa)+(ra) (length da) and path(pb)+(rb) (length db); pa/pb
// are node indices. A position is a (parent node, rank) pair; both climb to the common length, then in
// lockstep until they share the parent, where the ranks decide (equal positions: the shorter first).
__device__ bool tuple_less(const Nodes& N, int pa, int ra, int da, int pb, int rb, int db) {
  const int m = da < db ? da : db;
  for (int d = da; d > m; --d) { ra = N.rank[pa]; pa = N.par[pa]; }
  for (int d = db; d > m; --d) { rb = N.rank[pb]; pb = N.par[pb]; }
  if (pa == pb && ra == rb) return da < db;
  while (pa != pb) {
    ra = N.rank[pa]; pa = N.par[pa];
    rb = N.rank[pb]; pb = N.par[pb];
  }
  return ra < rb;
}

// Heap entry meta: parent node (11 bits) | depth << 11 (6 bits) | rank << 17 (15 bits).
__device__ __forceinline__ bool heap_better(const Smem& S, const Nodes& N, int x, int y) {
  const double sx = S.score[x], sy = S.score[y];
  if (sx > sy) return true;
  if (sx < sy) return false;
  const uint32_t mx = S.info0[x], my = S.info0[y];
  return tuple_less(N, mx & 0x7FF, mx >> 17, (mx >> 11) & 63, my & 0x7FF, my >> 17, (my >> 11) & 63);
}

__device__ __forceinline__ void heap_swap(Smem& S, int x, int y) {
  const double s = S.score[x]; S.score[x] = S.score[y]; S.score[y] = s;
  const uint32_t m = S.info0[x]; S.info0[x] = S.info0[y]; S.info0[y] = m;
}

__device__ void heap_push(Smem& S, const Nodes& N, int* size, double s, int parent, int depth, int rank) {
  int i = (*size)++;
  S.score[i] = s;
  S.info0[i] = static_cast<uint32_t>(parent) | (static_cast<uint32_t>(depth) << 11) | (static_cast<uint32_t>(rank) << 17);
  while (i > 0) {
    const int up = (i - 1) >> 1;
    if (!heap_better(S, N, i, up)) break;
    heap_swap(S, i, up);
    i = up;
  }
}

__device__ void heap_pop_top(Smem& S, const Nodes& N, int* size) {
  const int n = --(*size);
  heap_swap(S, 0, n);
  int i = 0;
  for (;;) {
    const int l = 2 * i + 1, r = l + 1;
    int best = i;
    if (l < n && heap_better(S, N, l, best)) best = l;
    if (r < n && heap_better(S, N, r, best)) best = r;
    if (best == i) break;
    heap_swap(S, i, best);
    i = best;
  }
}

// One thread runs the reference heap; returns the node count (node arrays filled).
__device__ __noinline__ int serial_heap(Smem& S, Nodes& N, const float* lp, int L, int K, int M) {
  int n = 1, hs = 0;
  N.par[0] = -1; N.rank[0] = 0; N.dep[0] = 0; N.prev[0] = -1; N.fc[0] = -1;
  if (L >= 1 && M >= 1 && __ldg(lp) != -__builtin_huge_valf()) heap_push(S, N, &hs, static_cast<double>(__ldg(lp)), 0, 1, 0);
  while (hs > 0 && n <= M) {
    const double s = S.score[0];
    const uint32_t m = S.info0[0];
    heap_pop_top(S, N, &hs);
    const int parent = static_cast<int>(m & 0x7FF), depth = static_cast<int>((m >> 11) & 63), rank = static_cast<int>(m >> 17);
    const int i = n++;
    N.par[i] = static_cast<int16_t>(parent);
    N.rank[i] = static_cast<uint16_t>(rank);
    N.dep[i] = static_cast<uint8_t>(depth);
    N.prev[i] = N.fc[parent];  // fc = last child popped so far
    N.fc[parent] = static_cast<int16_t>(i);
    N.fc[i] = -1;
    const float* row = lp + static_cast<size_t>(depth - 1) * K;
    if (rank + 1 < K && __ldg(row + rank + 1) != -__builtin_huge_valf())
      heap_push(S, N, &hs, __dadd_rn(__dsub_rn(s, static_cast<double>(__ldg(row + rank))), static_cast<double>(__ldg(row + rank + 1))), parent, depth, rank + 1);
    if (depth < L && __ldg(lp + static_cast<size_t>(depth) * K) != -__builtin_huge_valf())
      heap_push(S, N, &hs, __dadd_rn(s, static_cast<double>(__ldg(lp + static_cast<size_t>(depth) * K))), i, depth + 1, 0);
  }
  return n;
}

}  // namespace build_tree_k
}  // namespace ddtree
