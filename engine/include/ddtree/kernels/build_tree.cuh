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
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

// Test hook (the CPU emulation counts how often each path runs); compiled out on the GPU.
#ifndef DDTREE_BUILD_TREE_EVENT
#define DDTREE_BUILD_TREE_EVENT(name) ((void)0)
#endif
// Helper layout. v6 compiled the helpers with several call sites out of line (`__noinline__`) on the
// hypothesis that instruction fetch of a 300 KB kernel set its pace; the H200 A/B of 2026-11-30 (one
// call, same bench and phase profile) measured the inlined layout ~10% faster at every shape (M=256 K=64
// B=1: 22.4 vs 25.5 us at sharpness 4, 36.2 vs 41.3 at 8; M=64: 11.6 vs 12.7), and ncu put only ~9% of
// the warp-stall samples on instruction fetch. Inlined is therefore the default;
// -DDDTREE_BUILD_TREE_OUTLINE keeps the out-of-line layout for comparison.
#ifdef DDTREE_BUILD_TREE_OUTLINE
#define DDTREE_BT_OUTLINE __noinline__
#else
#define DDTREE_BT_OUTLINE
#endif
// L1 prefetch (a hint; nothing on the CPU emulation).
#ifndef DDTREE_PREFETCH_L1
#ifdef __CUDA_ARCH__
#define DDTREE_PREFETCH_L1(ptr) asm volatile("prefetch.global.L1 [%0];" ::"l"(ptr))
#else
#define DDTREE_PREFETCH_L1(ptr) ((void)(ptr))
#endif
#endif
// Profiling hook (bench/profile/build_tree_profile.cu records clock64 at these points); no-op here.
#ifndef DDTREE_BUILD_TREE_MARK
#define DDTREE_BUILD_TREE_MARK(tag) ((void)0)
#endif

namespace ddtree {
namespace build_tree_k {

// Threads per CTA. 512 is the measured default; the override exists so that one device call can time
// 256 / 128 side by side (bench/profile builds them with -DDDTREE_BUILD_TREE_THREADS=...).
#ifndef DDTREE_BUILD_TREE_THREADS
#define DDTREE_BUILD_TREE_THREADS 512
#endif
constexpr int kThreads = DDTREE_BUILD_TREE_THREADS;
static_assert(kThreads % 32 == 0 && kThreads >= 64 && kThreads <= 1024, "whole warps, at least two");
constexpr int kWarps = kThreads / 32;
constexpr int kCap = 2560;  // candidate pool capacity (root included)
constexpr int kPerThread = (kCap + kThreads - 1) / kThreads;
constexpr int kSort = 4096;  // power of two >= kCap
constexpr int kSelBins = 512;  // fast_select: bins per round
constexpr int kSelRounds = 3;
constexpr int kLps = 4096;     // shared copy of the rows: L = 15 keeps ranks < 273 (all of M <= 256)  // nested rounds: 512^3 score buckets at most
constexpr int kMaxNodes = 1025;
constexpr int kMaxDepth = 63;
constexpr int kMaxK = 32768;

static_assert(kSort >= kCap && (kSort & (kSort - 1)) == 0, "sort buffer must be a power of two >= pool");
static_assert(kCap <= 4096, "pool index must fit the 12-bit parent field");

struct Params {
  const float* lp;
  const int32_t* ids;
  const int32_t* root_token;
  const int32_t* ctx_len;
  const int32_t* budget;
  int depth, k, n_max, words;
  int32_t* node_token;
  int32_t* node_parent;
  int32_t* node_depth;
  int32_t* num_nodes;
  uint32_t* anc;
  int32_t* positions;
  int32_t* first_child;
  int32_t* next_sibling;
};

// Level state carried between the block-wide and the warp-only level loops.
struct LevelState {
  int d, size, pa, pb, live;
};

// Per-node arrays of the finished tree (alias the pool's `lex` array once sorting is done).
struct Nodes {
  int32_t tok[kMaxNodes];   // token of each node (the parallel path gathers it with the node arrays)
  int16_t par[kMaxNodes];
  uint16_t rank[kMaxNodes];
  int16_t prev[kMaxNodes];  // previous sibling (node index) or -1
  int16_t fc[kMaxNodes];    // first child; the serial heap uses it as "last child so far"
  int16_t ns[kMaxNodes];
  uint8_t dep[kMaxNodes];
};

struct Smem {
  uint64_t lex[kCap];       // order-preserving tuple code, left-aligned; later: Nodes
  double score[kCap];       // kappa; the serial heap's entry scores (then, with the union, the output stage)
  union {
    struct {  // after the sort's node arrays, score + these words hold the output stage
      uint32_t info0[kCap];  // parent pool index (12 bits) | rank << 12; the serial heap's entry meta
      uint32_t info1[kCap];  // pi = prod(r_i+1) (11 bits) | code length << 11 (7 bits) | depth << 18
      uint32_t scr[kCap];    // per-parent child offsets / compaction prefix / pool index -> node index
    };
  };
  uint16_t sidx[kSort];     // sort permutation
  uint32_t fhist[kSelBins];  // fast_select's bins: zero outside fast_select (its scan clears them)
  float lps[kLps];           // lp[d][r] for r < rs (rs = min(K, M + 1, kLps / L)), row stride rs
  int rs;
  int nvalid[kMaxDepth + 1];  // candidate ranks per depth (first -inf rank, capped at min(K, M))
  double chain[kMaxDepth + 1];  // kappa of the greedy chain 0^d (chain[0] = 0, the root)
  uint32_t warp_sum[kWarps];
  // block-uniform scalars
  LevelState lvl;
  int bad;
  int leff;
  int count;
  int cut_k;
  unsigned cut_before;
  unsigned long long cut_lo, cut_hi;
  // fast_select state (written by warp 0 between barriers)
  int sel_digit[kSelRounds];
  int sel_above, sel_cnt, sel_small;
  unsigned long long sel_min, pool_min;
  int fam;                  // size of the chain-bound family
  double fam_lo, fam_hi;    // its smallest and largest score
  int tie;                  // the packed sort found two equal keys
};
static_assert(sizeof(Nodes) <= sizeof(uint64_t) * kCap, "node arrays must fit in the lex array");

constexpr size_t kSmemBytes = sizeof(Smem);
static_assert(kSmemBytes <= 99 * 1024, "must fit sm_120's 99 KB per block");

constexpr double kNegInf = -__builtin_huge_val();

__device__ __forceinline__ int popc32(unsigned v) {
#ifdef __CUDA_ARCH__
  return __popc(v);
#else
  return __builtin_popcount(v);  // the CPU emulation
#endif
}

__device__ __forceinline__ unsigned long long ord_asc(double x) {
  // Unsigned order == numeric order; -0.0 is folded into +0.0 (the heap compares them equal).
  unsigned long long u = static_cast<unsigned long long>(__double_as_longlong(__dadd_rn(x, 0.0)));
  return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}
__device__ __forceinline__ double from_ord(unsigned long long k) {
  unsigned long long u = (k >> 63) ? (k & 0x7FFFFFFFFFFFFFFFull) : ~k;
  return __longlong_as_double(static_cast<long long>(u));
}

// One depth's log-prob row: ranks < rs from the shared-memory copy made while validating the rows
// (a dependent global load costs ~200+ cycles on the H200 even when L1/L2 hold the line; shared
// memory ~30), the rest from global memory.
struct Row {
  const float* g;
  const float* s;
  int rs;
  __device__ __forceinline__ float at(int r) const { return r < rs ? s[r] : __ldg(g + r); }
};
__device__ __forceinline__ Row row_of(const Smem& S, const float* lp, int K, int d) {
  return Row{lp + static_cast<size_t>(d) * K, S.lps + d * S.rs, S.rs};
}

__device__ __forceinline__ double child_score(double parent, const Row& row, int r) {
  return __dadd_rn(parent, static_cast<double>(row.at(r)));
}

// Exclusive block scan of one value per thread; returns the prefix, *total gets the sum. One barrier:
// every thread adds up the warp totals before its own (at most kWarps - 1 broadcast reads). The caller
// must pass a block barrier before the next scan (S.warp_sum is reused).
__device__ __forceinline__ unsigned block_exclusive_scan(Smem& S, unsigned v, unsigned* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    unsigned y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  if (lane == 31) S.warp_sum[warp] = inc;
  __syncthreads();
  unsigned before = 0, all = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const unsigned x = S.warp_sum[w];
    before += w < warp ? x : 0u;
    all += x;
  }
  *total = all;
  return before + inc - v;
}

// Number of children p.r of pool entry e with kappa >= t (a prefix of ranks: the row is sorted).
__device__ __forceinline__ unsigned count_one(const Smem& S, const Row& row, int nv, int M, int e, double t) {
  const double sp = S.score[e];
  const int pi = static_cast<int>(S.info1[e] & 0x7FFu);
  int hi = min(nv, M / pi);  // prod(r_i + 1) <= M, else M better candidates exist
  if (sp < t) hi = 0;
  if (t != kNegInf && hi > 0) {
    // First rank whose child falls below t. Gallop (ranks 0, 1, 3, 7, ...) then bisect: with a tight
    // t most parents keep a few children, found in ~log2(count) dependent loads instead of log2(K).
    int lo = 0, probe = 0, step = 1;
    while (probe < hi && child_score(sp, row, probe) >= t) {
      lo = probe + 1;
      probe += step;
      step <<= 1;
    }
    int h2 = probe < hi ? probe : hi;  // ranks < lo pass; rank probe (if < hi) fails
    while (lo < h2) {
      const int mid = (lo + h2) >> 1;
      if (child_score(sp, row, mid) >= t) lo = mid + 1; else h2 = mid;
    }
    hi = lo;
  }
  return static_cast<unsigned>(hi);
}

// Children of parents [pa, pa+np) with kappa >= t: S.scr[j] = exclusive offset of parent j; returns
// the total. Up to 32 parents (the common case past the first levels): warp 0 alone, one barrier.
// Otherwise each thread scans a contiguous chunk of parents and a block scan joins them.
__device__ DDTREE_BT_OUTLINE int count_children(Smem& S, const Row& row, int nv, int M, int pa, int np, double t) {
  if (np <= 32) {
    if (threadIdx.x < 32) {
      const int j = threadIdx.x;
      const unsigned c = j < np ? count_one(S, row, nv, M, pa + j, t) : 0u;
      unsigned inc = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        unsigned y = __shfl_up_sync(0xffffffffu, inc, o);
        if (j >= o) inc += y;
      }
      if (j < np) S.scr[j] = inc - c;
      if (j == 31) S.count = static_cast<int>(inc);
    }
    __syncthreads();
    return S.count;
  }
  const int chunk = (np + kThreads - 1) / kThreads;
  const int beg = min(np, static_cast<int>(threadIdx.x) * chunk), end = min(np, beg + chunk);
  unsigned sum = 0;
  for (int j = beg; j < end; ++j) {
    const unsigned c = count_one(S, row, nv, M, pa + j, t);
    S.scr[j] = c;
    sum += c;
  }
  unsigned total;
  unsigned base = block_exclusive_scan(S, sum, &total);
  for (int j = beg; j < end; ++j) {
    const unsigned c = S.scr[j];
    S.scr[j] = base;
    base += c;
  }
  __syncthreads();
  return static_cast<int>(total);
}

// Parent (0..np-1) of child slot j: the last parent whose offset is <= j.
__device__ __forceinline__ int slot_parent(const Smem& S, int np, int j) {
  int lo = 0, hi = np;  // first offset > j
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (static_cast<int>(S.scr[mid]) <= j) lo = mid + 1; else hi = mid;
  }
  return lo - 1;
}

// What fast_select ranks, as one value type, so that one out-of-line fast_select serves the chain bound,
// the pool raises and the tighten (one copy of the code instead of one per caller):
// kSelFamily: the chain-bound family {0^d . r : d < leff, r < min(R, nvalid[d])};
// kSelPool: live pool entries (kappa >= t) of [0, size);
// kSelLevel: those plus the virtual children counted by count_children (offsets in S.scr over np
// parents from pa, `total` slots; they already satisfy kappa >= t).
constexpr int kSelFamily = 0, kSelPool = 1, kSelLevel = 2;
struct SelSet {
  int mode;
  const float* lp;
  int K, leff, R;
  int size;
  double t;
  Row row;
  int pa, np, total;
};

template <typename F>
__device__ __forceinline__ void sel_each(const Smem& S, const SelSet& q, F f) {
  if (q.mode == kSelFamily) {
#pragma unroll 1
    for (int idx = threadIdx.x; idx < q.leff * q.R; idx += kThreads) {
      const int d = idx / q.R, r = idx - d * q.R;
      if (r < S.nvalid[d]) f(child_score(S.chain[d], row_of(S, q.lp, q.K, d), r));
    }
    return;
  }
#pragma unroll 1
  for (int e = threadIdx.x; e < q.size; e += kThreads) {
    const double x = S.score[e];
    if (x >= q.t) f(x);
  }
  if (q.mode == kSelLevel) {
#pragma unroll 1
    for (int j = threadIdx.x; j < q.total; j += kThreads) {
      const int p = slot_parent(S, q.np, j);
      f(child_score(S.score[q.pa + p], q.row, j - static_cast<int>(S.scr[p])));
    }
  }
}

__device__ __forceinline__ unsigned long long warp_min_u64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) { const unsigned long long y = __shfl_xor_sync(0xffffffffu, v, o); v = y < v ? y : v; }
  return v;
}
__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) { const unsigned long long y = __shfl_xor_sync(0xffffffffu, v, o); v = y > v ? y : v; }
  return v;
}

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

__device__ __forceinline__ bool sorts_before(const Smem& S, int a, int b) {
  const unsigned long long ka = ~ord_asc(S.score[a]), kb = ~ord_asc(S.score[b]);
  if (ka != kb) return ka < kb;
  return S.lex[a] < S.lex[b];
}

// Sorts S.sidx[0, P) (P a power of two). Stages whose compare distance j is <= 32 stay inside one
// warp's 64-element segment (pair q of warp w touches [64 * (q / 32), +64)), so they need only
// __syncwarp; a block barrier is paid only around stages with j >= 64. Ends with a block barrier.
__device__ DDTREE_BT_OUTLINE void bitonic_sort(Smem& S, int P) {
  for (int k = 2; k <= P; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      #pragma unroll 1
      for (int q = threadIdx.x; q < (P >> 1); q += kThreads) {
        const int i = ((q & ~(j - 1)) << 1) | (q & (j - 1));
        const int ixj = i | j;
        const int a = S.sidx[i], c = S.sidx[ixj];
        bool a_after_c;
        if (a == 0xFFFF) a_after_c = c != 0xFFFF;
        else if (c == 0xFFFF) a_after_c = false;
        else a_after_c = sorts_before(S, c, a);
        const bool up = (i & k) == 0;
        const bool c_after_a = !a_after_c && a != c;
        if (up ? a_after_c : c_after_a) { S.sidx[i] = static_cast<uint16_t>(c); S.sidx[ixj] = static_cast<uint16_t>(a); }
      }
      const int next_j = j > 1 ? j >> 1 : k;  // the next k starts with j = k
      if (j >= 64 || next_j >= 64) __syncthreads(); else __syncwarp();
    }
  }
  __syncthreads();
}

// Register bitonic sort of the survivors for n_live <= kThreads * E: element i lives in thread
// i % kThreads, slot i / kThreads. Compare distances j < 32 exchange through warp shuffles, j >= kThreads
// inside a thread's registers, and only 32 <= j < kThreads through shared memory, where just the pool
// index travels (the keys are re-read from the pool, which the sort never writes). Input: S.sidx[0,
// n_live) pool indices in any order; output: the same slots sorted by (score desc, tuple code asc).
__device__ __forceinline__ bool key_less(unsigned long long ah, unsigned long long al, unsigned long long bh,
                                         unsigned long long bl) {
  return ah < bh || (ah == bh && al < bl);
}

template <int E>
__device__ __noinline__ void sort_survivors(Smem& S, int n_live) {  // own register budget: keys stay in registers
  constexpr int NE = kThreads * E;
  const int tid = threadIdx.x;
  unsigned long long kh[E], kl[E];
  int ix[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = tid + kThreads * e;
    ix[e] = i < n_live ? static_cast<int>(S.sidx[i]) : 0xFFFF;
    kh[e] = ix[e] != 0xFFFF ? ~ord_asc(S.score[ix[e]]) : ~0ull;
    kl[e] = ix[e] != 0xFFFF ? S.lex[ix[e]] : ~0ull;
  }
  __syncthreads();  // S.sidx now serves as the exchange buffer
  for (int k = 2; k <= NE; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      if (j >= kThreads) {
        const int je = j / kThreads;
#pragma unroll
        for (int e = 0; e < E; ++e) {
#pragma unroll
          for (int f = e + 1; f < E; ++f) {
            if (f == (e ^ je)) {
              const bool asc = ((tid + kThreads * e) & k) == 0;  // e is the lower index of the pair
              const bool swap = asc ? key_less(kh[f], kl[f], kh[e], kl[e]) : key_less(kh[e], kl[e], kh[f], kl[f]);
              if (swap) {
                const unsigned long long th = kh[e], tl = kl[e];
                const int ti = ix[e];
                kh[e] = kh[f]; kl[e] = kl[f]; ix[e] = ix[f];
                kh[f] = th; kl[f] = tl; ix[f] = ti;
              }
            }
          }
        }
      } else if (j >= 32) {
#pragma unroll
        for (int e = 0; e < E; ++e) S.sidx[tid + kThreads * e] = static_cast<uint16_t>(ix[e]);
        __syncthreads();
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int i = tid + kThreads * e;
          const int pix = S.sidx[i ^ j];
          const unsigned long long ph = pix != 0xFFFF ? ~ord_asc(S.score[pix]) : ~0ull;
          const unsigned long long pl = pix != 0xFFFF ? S.lex[pix] : ~0ull;
          const bool keep_min = ((i & j) == 0) == ((i & k) == 0);
          const bool take = keep_min ? key_less(ph, pl, kh[e], kl[e]) : key_less(kh[e], kl[e], ph, pl);
          if (take) { kh[e] = ph; kl[e] = pl; ix[e] = pix; }
        }
        __syncthreads();
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int i = tid + kThreads * e;
          const unsigned long long ph = __shfl_xor_sync(0xffffffffu, kh[e], j);
          const unsigned long long pl = __shfl_xor_sync(0xffffffffu, kl[e], j);
          const int pix = __shfl_xor_sync(0xffffffffu, ix[e], j);
          const bool keep_min = ((i & j) == 0) == ((i & k) == 0);
          const bool take = keep_min ? key_less(ph, pl, kh[e], kl[e]) : key_less(kh[e], kl[e], ph, pl);
          if (take) { kh[e] = ph; kl[e] = pl; ix[e] = pix; }
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = tid + kThreads * e;
    if (i < n_live) S.sidx[i] = static_cast<uint16_t>(ix[e]);  // sentinels sorted last
  }
  __syncthreads();
}

// After a packed sort: S.sidx[1, 1 + ns) in key order, S.scr[pool index] = key32. Equal keys are
// contiguous. Each run of equal keys (two scores within 2^-32 of the key range, or a real tie) is
// re-sorted by one thread with the full (score, tuple code) order. Runs are listed first (start and
// length in S.fhist, which no fast_select uses any more at this point; it is cleared again at the next
// launch's entry), then sorted after a barrier, so no thread reads a slot another one is rewriting. A run
// longer than 32 or more than kSelBins / 2 runs (massive ties) set S.tie: the caller runs the full sort.
// Loops are left rolled on purpose (small code). Starts after a barrier that follows the sort.
__device__ DDTREE_BT_OUTLINE bool fix_tie_runs(Smem& S, int ns) {
  const int tid = threadIdx.x;
  if (tid == 0) S.count = 0;
  __syncthreads();
#pragma unroll 1
  for (int i = tid; i + 1 < ns; i += kThreads) {
    const uint32_t my = S.scr[S.sidx[1 + i]];
    if ((i == 0 || S.scr[S.sidx[i]] != my) && S.scr[S.sidx[2 + i]] == my) {
      int j = i + 2;
      while (j < ns && j - i <= 32 && S.scr[S.sidx[1 + j]] == my) ++j;
      const int slot = atomicAdd(&S.count, 1);
      if (j - i > 32 || slot >= kSelBins / 2) {
        S.tie = 1;
      } else {
        S.fhist[2 * slot] = static_cast<uint32_t>(i);
        S.fhist[2 * slot + 1] = static_cast<uint32_t>(j - i);
      }
    }
  }
  __syncthreads();
  const int runs = min(S.count, kSelBins / 2);
  if (S.tie == 0) {
#pragma unroll 1
    for (int q = tid; q < runs; q += kThreads) {
      uint16_t* r = S.sidx + 1 + S.fhist[2 * q];
      const int len = static_cast<int>(S.fhist[2 * q + 1]);
#pragma unroll 1
      for (int x = 1; x < len; ++x) {  // insertion sort of the run
        const uint16_t cur = r[x];
        int y = x - 1;
        while (y >= 0 && sorts_before(S, cur, r[y])) {
          r[y + 1] = r[y];
          --y;
        }
        r[y + 1] = cur;
      }
    }
  }
  __syncthreads();
  return S.tie != 0;
}

// key32 of a survivor: floor((0 - x) * scale), monotone (a smaller key means a score at least as large).
__device__ __forceinline__ unsigned key32_of(double x, double scale) {
  double q = __dmul_rn(__dsub_rn(0.0, x), scale);
  q = q < 4294967295.0 ? q : 4294967295.0;
  return static_cast<unsigned>(q);
}

// Small sort (ns <= 16 * 32E non-root survivors in S.sidx[1, 1 + ns)), same contract as sort_packed.
// Each warp sorts a chunk of C = 32E packed keys in registers (shuffles for j < 32, register pairs
// above; no barrier); then every element's final position is its position in its chunk plus, for each
// other chunk, the number of keys below it there (a binary search in shared memory; the searches are
// independent and unrolled, so their loads overlap). Six barriers in all, instead of a bitonic
// network's two per shared-memory stage. The u64 chunk keys live in S.sidx (16 * C * 8 bytes <= 8 KB).
template <int E>
__device__ __noinline__ bool sort_merge(Smem& S, int ns, double lo) {
  constexpr int C = 32 * E;
  static_assert(kWarps * C * 8 <= kSort * 2, "chunk keys must fit S.sidx");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const double scale = lo < 0.0 ? __ddiv_rn(4294967295.0, __dsub_rn(0.0, lo)) : 0.0;
  const int nch = (ns + C - 1) / C;
  unsigned long long v[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = warp * C + lane + 32 * e;
    v[e] = ~0ull;
    if (i < ns) {
      const int pe = S.sidx[1 + i];
      const unsigned key = key32_of(S.score[pe], scale);
      S.scr[pe] = key;
      v[e] = (static_cast<unsigned long long>(key) << 16) | static_cast<unsigned long long>(pe);
    }
  }
  if (tid == 0) S.tie = 0;
  DDTREE_BUILD_TREE_MARK(60);
  if (warp < nch) {
#pragma unroll 1
    for (int k = 2; k <= C; k <<= 1) {
#pragma unroll 1
      for (int j = k >> 1; j > 0; j >>= 1) {
        if (j >= 32) {  // only E == 2, j == 32: the lane's own pair (slot 0 and slot 1)
          static_assert(E <= 2, "register stages below assume at most two slots");
          if constexpr (E == 2) {
            const bool asc = (lane & k) == 0;
            const unsigned long long x = v[0], y = v[1];
            const bool sw = asc ? y < x : x < y;
            v[0] = sw ? y : x;
            v[1] = sw ? x : y;
          }
        } else {
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const int q = lane + 32 * e;
            const unsigned long long pv = __shfl_xor_sync(0xffffffffu, v[e], j);
            const bool keep_min = ((q & j) == 0) == ((q & k) == 0);
            v[e] = keep_min ? (pv < v[e] ? pv : v[e]) : (pv > v[e] ? pv : v[e]);
          }
        }
      }
    }
  }
  DDTREE_BUILD_TREE_MARK(61);
  __syncthreads();  // S.sidx was read above; from here it holds the sorted chunks as u64 keys
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(S.sidx);
  if (warp < nch) {
#pragma unroll
    for (int e = 0; e < E; ++e) keys[warp * C + lane + 32 * e] = v[e];
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(62);
  int rank[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    rank[e] = lane + 32 * e;
    if (warp * C + lane + 32 * e >= ns) continue;
#pragma unroll 1
    for (int c = 0; c < nch; ++c) {  // rolled: small code (the instruction cache is cold each launch)
      const unsigned long long* ch = keys + C * c;
      int pos = 0;
#pragma unroll
      for (int step = C / 2; step > 0; step >>= 1)
        if (ch[pos + step - 1] < v[e]) pos += step;
      rank[e] += c == warp ? 0 : pos + (ch[pos] < v[e] ? 1 : 0);
    }
  }
  __syncthreads();  // every search is done before S.sidx takes the result
  DDTREE_BUILD_TREE_MARK(63);
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (warp * C + lane + 32 * e < ns) S.sidx[1 + rank[e]] = static_cast<uint16_t>(v[e] & 0xFFFFu);
  if (tid == 0) S.sidx[0] = 0;
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(64);
  return fix_tie_runs(S, ns);
}

// Packed sort of the non-root survivors S.sidx[1, 1 + ns) (pool indices, any order), ns <= kThreads * E,
// into S.sidx[1, 1 + ns) by score desc; S.sidx[0] = 0 (the root). Key: a 32-bit order-preserving image
// of the score, key32(x) = floor((0 - x) * scale) (monotone: a smaller key means a score at least as
// large), packed with the pool index into one u64, so a compare-exchange moves one register pair and
// never re-reads the pool. Only distinct keys prove the order: returns true (S.tie) when two
// neighbours share a key, and the caller re-sorts with the full (score, tuple code) keys. Element i
// lives in thread i % kThreads, slot i / kThreads; stages with j < 32 use shuffles, j >= kThreads
// registers, the rest an exchange of pool indices through S.sidx with the keys cached in S.scr.
template <int E>
__device__ __noinline__ bool sort_packed(Smem& S, int ns, double lo) {
  const int tid = threadIdx.x;
  const double scale = lo < 0.0 ? __ddiv_rn(4294967295.0, __dsub_rn(0.0, lo)) : 0.0;
  int P = 1;
  while (P < ns) P <<= 1;
  unsigned long long v[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = tid + kThreads * e;
    v[e] = ~0ull;
    if (i < ns) {
      const int pe = S.sidx[1 + i];
      double q = __dmul_rn(__dsub_rn(0.0, S.score[pe]), scale);
      q = q < 4294967295.0 ? q : 4294967295.0;
      const unsigned key = static_cast<unsigned>(q);
      S.scr[pe] = key;
      v[e] = (static_cast<unsigned long long>(key) << 16) | static_cast<unsigned long long>(pe);
    }
  }
  if (tid == 0) S.tie = 0;
  __syncthreads();  // S.sidx is the exchange buffer from here on; S.scr holds the keys
  // Warps whose elements all lie at or past P hold sentinels only and never meet a real element
  // (partners i ^ j stay inside [0, P)): they skip the work and only keep the barriers.
  const bool active = (tid & ~31) < P;
  for (int k = 2; k <= P; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      if (j >= kThreads) {
        const int je = j / kThreads;
#pragma unroll
        for (int e = 0; e < E; ++e) {
#pragma unroll
          for (int f = e + 1; f < E; ++f) {
            if (f == (e ^ je)) {
              const bool asc = ((tid + kThreads * e) & k) == 0;
              const unsigned long long a = v[e], b = v[f];
              const bool sw = asc ? b < a : a < b;
              v[e] = sw ? b : a;
              v[f] = sw ? a : b;
            }
          }
        }
      } else if (j >= 32) {
        if (active) {
#pragma unroll
          for (int e = 0; e < E; ++e) S.sidx[tid + kThreads * e] = static_cast<uint16_t>(v[e] & 0xFFFFu);
        }
        __syncthreads();
        if (active) {
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const int i = tid + kThreads * e;
            const int pe = S.sidx[i ^ j];
            const unsigned long long pv = pe == 0xFFFF ? ~0ull
                                                       : (static_cast<unsigned long long>(S.scr[pe]) << 16) |
                                                             static_cast<unsigned long long>(pe);
            const bool keep_min = ((i & j) == 0) == ((i & k) == 0);
            v[e] = keep_min ? (pv < v[e] ? pv : v[e]) : (pv > v[e] ? pv : v[e]);
          }
        }
        __syncthreads();
      } else if (active) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int i = tid + kThreads * e;
          const unsigned long long pv = __shfl_xor_sync(0xffffffffu, v[e], j);
          const bool keep_min = ((i & j) == 0) == ((i & k) == 0);
          v[e] = keep_min ? (pv < v[e] ? pv : v[e]) : (pv > v[e] ? pv : v[e]);
        }
      }
    }
  }
  __syncthreads();  // the last exchange reads are done before S.sidx takes the result
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = tid + kThreads * e;
    if (i < ns) S.sidx[1 + i] = static_cast<uint16_t>(v[e] & 0xFFFFu);
  }
  if (tid == 0) S.sidx[0] = 0;
  __syncthreads();
  return fix_tie_runs(S, ns);
}

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

// ---- the parallel selection ----------------------------------------------------------------------

// Returns the node count with the node arrays filled, or -1 when the serial heap must decide.
__device__ int parallel_select(Smem& S, Nodes& N, const float* lp, const int32_t* ids, int L, int K, int M,
                               int n_max) {
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
  if (S.fam > M) {  // enough distinct candidates to bound the M-th best score
    int cnt = 0;
    t = chain_bound(S, lp, K, leff, M, M, &cnt);
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(chain_bound);
  }
  DDTREE_BUILD_TREE_MARK(2);
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

// ---- the kernel ------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads, 1) build_tree_kernel(Params p) {
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
    n = parallel_select(S, N, lp, p.ids + static_cast<size_t>(b) * L * K, L, K, M, p.n_max);
    lists = n >= 0;
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

}  // namespace build_tree_k
}  // namespace ddtree
