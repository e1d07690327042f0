// build_tree kernel: DDTree's best-first heap reproduced by a parallel selection (one CTA per request).
//
// Why a selection replaces the heap. Let kappa(p.r) = fl(kappa(p) + lp[d][r]) (fp64, round to nearest),
// kappa(root) = 0. When every row of lp used is <= 0 and non-increasing, kappa never increases along a
// heap edge (first child, next sibling) while the rank tuple strictly increases lexicographically, so a
// heap keyed on kappa pops exactly the candidates sorted by (kappa desc, tuple asc), and the top-M set
// is prefix-closed. The real heap scores a sibling with fl(fl(s - lp[r]) + lp[r+1]); that equals
// kappa whenever fl(kappa(c) - lp[r]) == kappa(parent) for every popped node c. The kernel checks
// exactly that for every selected node after the fact (every frontier item is a successor of a
// selected node, so the heap saw kappa on every item it compared), and it validates the rows. Any
// failed check (unsorted or positive rows, NaN, the rare inexact fp64 sum, a pool overflow on massive
// score ties, a depth the 64-bit tuple code cannot hold) reruns the request with a serial heap that
// emulates the reference exactly: slow, never wrong.
//
// The selection. A pool U (shared memory) holds candidates level by level: depth d's candidates are
// the children p.r of depth d-1 pool entries with kappa >= t, where t is a running lower bound of the
// M-th best score (so nothing that belongs to the top-M is ever dropped). A child of rank r of p is in
// the top-M only if prod_i (r_i + 1) <= M (all componentwise-smaller tuples beat it), which bounds the
// ranks scanned per parent and makes an order-preserving prefix code of the tuple fit in 64 bits
// (2 bits per level + 2 * floor(log2 M)). When the pool would outgrow its soft capacity, t is raised
// to the score of the (M+1)-th best element (histogram over score buckets, refined inside the crossing
// bucket) and dead entries are compacted. Finally the survivors are put in (score desc, tuple code asc)
// order: position = node index = heap pop number. By default a bucketed rank does it (build_tree/rank.cuh:
// equal-width score bins, each survivor ranked inside its own bin); the packed / bitonic sorts of
// build_tree/sort.cuh take over for a bin over 64 survivors or more than 1024 survivors (after a tighten that
// cuts them to ~M), and run alone under DDTREE_BUILD_TREE_ORDER=bitonic.
//
// Selections (Params::impl, picked per call by the launcher; see build_tree/common.cuh): v6 starts
// the pool from the chain bound (a selection over "greedy chain + one deviation"); v6dp from the
// counting bound (build_tree/dp_bound.cuh: a per-depth convolution of rounded gaps counts candidates
// above each score, no selection, 1.0-1.2 M candidates above it), which spares the pool raises; v7
// (build_tree/enumerate.cuh) enumerates the candidates above the counting bound by deviation rounds
// and orders them by counting. "auto" is v6dp for requests with M > 256, else v6 (measured fastest per
// shape on the H200, bench/NOTES.md, build_tree v7). v8 (build_tree/v8.cuh: exact integer scores, warp
// threshold probes, order by counting) takes requests with M <= 64 and L <= 16 and hands anything it
// cannot decide exactly to auto; "v8auto" uses it for M <= 32 only (common.cuh). Launches with n_max <= 65
// and L <= 16 do not reach this kernel under the library default (v9auto, since session 7): they run the
// one-warp heap of build_tree/warp_heap.cuh; every other launch runs here with the v8auto choice.
// build_tree_v11_kernel (DDTREE_BUILD_TREE_IMPL=v11, opt-in) puts build_tree/v11.cuh (one warp's banded
// threshold search, exact final order) in front of that choice.
#pragma once

// Parts 1-4 (configuration and helpers, selection, sorting, the serial fallback) live in build_tree/;
// part 5a (build_tree/parallel_select.cuh) holds the parallel selection that drives them; this file
// (part 5b) holds the kernels.
#include "ddtree/kernels/build_tree/enumerate.cuh"
#include "ddtree/kernels/build_tree/v8.cuh"
#include "ddtree/kernels/build_tree/v10.cuh"
#include "ddtree/kernels/build_tree/v11.cuh"
#include "ddtree/kernels/build_tree/parallel_select.cuh"

namespace ddtree {
namespace build_tree_k {

// ---- the kernels -----------------------------------------------------------------------------------

// One request per CTA. kWithV10: the opt-in v10 path (v10.cuh) is compiled in only in
// build_tree_v10_kernel, so the default kernel's code (registers, stack frame) stays as without it: the
// H200 calls that measured v10 inside the one kernel had the default ~0.7-1.0 us slower than the session-5
// figures at M >= 256 (not A/B'd in one process; the separate kernel removes the question).
// kWithV11: likewise for v11 (v11.cuh, opt-in through DDTREE_BUILD_TREE_IMPL=v11), in build_tree_v11_kernel.
template <bool kWithV10, bool kWithV11 = false>
__device__ __forceinline__ void build_tree_block(const Params& p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& S = *reinterpret_cast<Smem*>(smem_raw);
  Nodes& N = *reinterpret_cast<Nodes*>(S.lex);
  const int b = blockIdx.x, tid = threadIdx.x;
  const int L = p.depth, K = p.k;
  const float* lp = p.lp + static_cast<size_t>(b) * L * K;
  const int M = min(max(__ldg(p.budget + b), 0), p.n_max - 1);
  const int ctx = __ldg(p.ctx_len + b), root = __ldg(p.root_token + b);  // loaded now, used at the end
  DDTREE_BUILD_TREE_MARK(0);

  // Warm L1 with the token rows the output gathers (ranks < min(K, M + 1)): the gather then waits on
  // an L1 hit instead of L2 at the very end of the kernel.
  {
    const int R = min(K, M + 1), chunks = (R + 31) / 32;
    #pragma unroll 1
    for (int c = tid; c < L * chunks; c += kThreads) {
      const int d = c / chunks;
      DDTREE_PREFETCH_L1(p.ids + (static_cast<size_t>(b) * L + d) * K + (c - d * chunks) * 32);
    }
  }
  int n = 1;
  bool lists = false;  // sibling lists already built (the parallel path)
  if (M > 0 && L > 0) {
    // v8 (v8.cuh) for small budgets; it hands anything it cannot decide exactly to the older paths.
    n = -1;
    // v10 (v10.cuh, opt-in) for M > 64; below that, and for whatever v10 hands back, the v8auto choice.
    const int impl0 = (kWithV10 && p.impl == kImplV10) || (kWithV11 && p.impl == kImplV11) ? kImplV8Auto : p.impl;
    if (kWithV10 && p.impl == kImplV10 && M >= kV10MinM && L <= kV10MaxL) {
      n = v10_select(S, N, lp, p.ids + static_cast<size_t>(b) * L * K, L, K, M, p.n_max);
      lists = n >= 0;
    }
    // v11 (v11.cuh, opt-in) for every request with L <= 16; what it hands back takes the v8auto choice.
    if (kWithV11 && p.impl == kImplV11 && L <= kV11MaxL) {
      n = v11_select(S, N, lp, L, K, M);
      __syncthreads();  // v11's node arrays are complete; the older paths below reuse the shared memory
    }
    const bool v8 = impl0 == kImplV8 || impl0 == kImplV8P8 || impl0 == kImplV8Auto;
    const int v8_max_m = impl0 == kImplV8Auto ? kV8AutoMaxM : kV8MaxM;
    if (n < 0 && v8 && M <= v8_max_m && L <= kV8MaxL) n = v8_select(S, N, lp, L, K, M, impl0 == kImplV8P8 ? 8 : kWarps);
    if (n < 0) {
      const int impl = v8 ? kImplAuto : impl0;
      n = parallel_select(S, N, lp, p.ids + static_cast<size_t>(b) * L * K, L, K, M, p.n_max, impl, p.order);
      lists = n >= 0;
    }
#ifdef DDTREE_BUILD_TREE_TRACE
    if (tid == 0) DDTREE_BUILD_TREE_TRACE(b, n < 0);  // test hook: which path decided
#endif
    if (n < 0) {
      if (tid == 0) S.count = serial_heap(S, N, lp, L, K, M);
      __syncthreads();
      n = S.count;
    }
  } else if (tid == 0) {
    N.par[0] = -1; N.rank[0] = 0; N.dep[0] = 0; N.prev[0] = -1;
  }
  __syncthreads();

  // Sibling lists: children of a node are popped in rank order (rank r+1 is pushed when r pops).
  if (!lists) {
    #pragma unroll 1
    for (int i = tid; i < p.n_max; i += kThreads) { N.fc[i] = -1; N.ns[i] = -1; }
    __syncthreads();
    #pragma unroll 1
    for (int i = 1 + tid; i < n; i += kThreads) {
      if (N.rank[i] == 0) N.fc[N.par[i]] = static_cast<int16_t>(i);
      else N.ns[N.prev[i]] = static_cast<int16_t>(i);
    }
    __syncthreads();
  }
  DDTREE_BUILD_TREE_MARK(84);

  const size_t row0 = static_cast<size_t>(b) * p.n_max;
  #pragma unroll 1
  for (int i = tid; i < p.n_max; i += kThreads) {
    int tok = -1, par = -1, dep = 0, fc = -1, ns = -1;
    if (i < n) {
      dep = N.dep[i];
      par = N.par[i];
      fc = N.fc[i];
      ns = N.ns[i];
      tok = i == 0 ? root : lists ? N.tok[i] : __ldg(p.ids + (static_cast<size_t>(b) * L + (dep - 1)) * K + N.rank[i]);
    }
    p.node_token[row0 + i] = tok;
    p.node_parent[row0 + i] = par;
    p.node_depth[row0 + i] = dep;
    p.positions[row0 + i] = ctx + dep;
    p.first_child[row0 + i] = fc;
    p.next_sibling[row0 + i] = ns;
  }
  // anc rows, staged in shared memory a chunk of rows at a time so that the global stores coalesce
  // (one SM writes up to 135 KB here). Row i: one walk up the parent chain (indices strictly decrease)
  // emits each u32 word when the walk leaves it; words above i's and between visited words are zero.
  const int W = p.words;
  uint32_t* anc = p.anc + row0 * W;
  // The output stage: `score` and the union behind it (both dead by now), 5 * kCap words.
  uint32_t* stage = reinterpret_cast<uint32_t*>(S.score);
  static_assert(offsetof(Smem, info0) == offsetof(Smem, score) + sizeof(double) * kCap, "stage is contiguous");
  const int rows_per = min(2 * kThreads, (5 * kCap) / W);
  for (int r0 = 0; r0 < p.n_max; r0 += rows_per) {
    const int rows = min(rows_per, p.n_max - r0);
    #pragma unroll 1
    for (int q = tid; q < rows; q += kThreads) {
      const int i = r0 + q;
      uint32_t* out = stage + q * W;
      if (i >= n) {
#pragma unroll 1
        for (int w = 0; w < W; ++w) out[w] = 0u;
        continue;
      }
      int cw = i >> 5;
#pragma unroll 1
      for (int w = cw + 1; w < W; ++w) out[w] = 0u;
      uint32_t bits = 0;
#pragma unroll 1
      for (int j = i; j >= 0; j = N.par[j]) {
        const int jw = j >> 5;
        if (jw != cw) {
          out[cw] = bits;
#pragma unroll 1
          for (int w = jw + 1; w < cw; ++w) out[w] = 0u;
          cw = jw;
          bits = 0;
        }
        bits |= 1u << (j & 31);
      }
      out[cw] = bits;  // the root's word (0)
    }
    __syncthreads();
    #pragma unroll 1
    for (int idx = tid; idx < rows * W; idx += kThreads) anc[static_cast<size_t>(r0) * W + idx] = stage[idx];
    __syncthreads();
  }
  if (tid == 0) p.num_nodes[b] = n;
  DDTREE_BUILD_TREE_MARK(99);
}

__global__ void __launch_bounds__(kThreads, 1) build_tree_kernel(Params p) { build_tree_block<false>(p); }
// The launcher runs this one for DDTREE_BUILD_TREE_IMPL=v10 only.
__global__ void __launch_bounds__(kThreads, 1) build_tree_v10_kernel(Params p) { build_tree_block<true>(p); }
// The launcher runs this one for DDTREE_BUILD_TREE_IMPL=v11 only.
__global__ void __launch_bounds__(kThreads, 1) build_tree_v11_kernel(Params p) { build_tree_block<false, true>(p); }

}  // namespace build_tree_k
}  // namespace ddtree
