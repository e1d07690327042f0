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
// bucket) and dead entries are compacted. Finally the survivors are bitonic-sorted by (score desc,
// tuple code asc): sorted position = node index = heap pop number.
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
// this file (part 5) holds the parallel selection that drives them, and the kernel.
#include "ddtree/kernels/build_tree/enumerate.cuh"
#include "ddtree/kernels/build_tree/v8.cuh"
#include "ddtree/kernels/build_tree/v10.cuh"
#include "ddtree/kernels/build_tree/v11.cuh"

namespace ddtree {
namespace build_tree_k {

// ---- the parallel selection ----------------------------------------------------------------------

// Returns the node count with the node arrays filled, or -1 when the serial heap must decide.
__device__ int parallel_select(Smem& S, Nodes& N, const float* lp, const int32_t* ids, int L, int K, int M,
                               int n_max, int impl) {
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
    if (n_live - 1 > pmin) {  // the sort would double: cut the survivors to (about) exactly M first
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
  }
  __syncthreads();
  {
    // One shared atomic per warp and step (a single counter hit by every survivor serializes).
    const int lane = tid & 31;
    unsigned long long mn = ~0ull;
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
      }
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
  if (ns <= kThreads) {
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
      n = parallel_select(S, N, lp, p.ids + static_cast<size_t>(b) * L * K, L, K, M, p.n_max, impl);
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
