// build_tree kernel, part 1 of 5: configuration, shared-memory layout, row access, and the block scan
// and child counting every phase uses. The algorithm is described in ../build_tree.cuh.
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

// Selections (Params::impl; the launcher picks one per call, see src/build_tree.cu).
constexpr int kImplV6 = 0;    // chain bound + level pool (v6)
constexpr int kImplV6Dp = 1;  // counting bound + level pool
constexpr int kImplV7 = 2;    // counting bound + deviation rounds + counting order (level pool on overflow)
// The default: per request, the counting bound when M > kAutoDpMinM, else v6. H200, 2026-11-30: the
// counting bound costs 9-64k cycles (v6's chain bound ~6k) but spares the pool raises, which pays at
// M = 1024 (K = 64, sharpness 8: 77 vs 109 us) and not at M <= 256 (35.9 vs 38.8 us at sharpness 8).
constexpr int kImplAuto = 3;
constexpr int kAutoDpMinM = 256;
// v8 (build_tree/v8.cuh) for requests with M <= 64 and L <= 16, the auto choice for the others.
constexpr int kImplV8 = 4;
constexpr int kImplV8P8 = 5;  // v8 with 8 probing warps instead of 16 (the A/B of the probe count)
// The library default of session 5, and since session 6 the choice for every launch that the default
// (v9auto, build_tree/warp_heap.cuh) does not send to the warp heap: v8 for requests with M <= kV8AutoMaxM
// (and L <= 16), auto for the others. H200 (bench/NOTES.md "### v8 (session 5)"): v8 is 1.26-1.50x faster
// than auto at M = 16 (K = 16, B = 1 and 8) and 1.14-1.65x at M = 64 with B = 1, but 0.64x at M = 64,
// K = 64, B = 8, sharpness 8 (one request of that batch has an exact fp32 tie v8 hands to auto: "### v9").
constexpr int kImplV8Auto = 6;
constexpr int kV8AutoMaxM = 32;
// v10 (build_tree/v10.cuh; opt-in, slower than auto at most measured shapes): requests with M > 64 and
// L <= 16; the v8auto choice for the others and for whatever v10 cannot decide.
constexpr int kImplV10 = 9;

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
  int impl;  // kImplV6 / kImplV6Dp / kImplV7 / kImplAuto / kImplV8 / kImplV8P8 / kImplV8Auto (0 = v6: what an aggregate-initialized Params gets)
  int order;  // survivors' order: kOrderRank (0, the default), kOrderBitonic, kOrderRankTighten (rank.cuh)
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
  int rank_full;            // rank_buckets: a bin over kRankBinCap, the sort decides
  unsigned long long rank_hi_inv;  // ~ord_asc of the survivors' highest score (rank_buckets' bin range)
  int dp_bin;               // dp_bound: first bin whose count reaches M
  int cb_count[2][32];      // chain_bound_probes: each round's probe counts (double-buffered)
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

}  // namespace build_tree_k
}  // namespace ddtree
