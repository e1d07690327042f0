// build_tree, v9: the reference heap itself, run by one warp, for launches with n_max <= 65 (M <= 64) and
// L <= 16. A kernel of its own (128 threads, ~14 KB of static shared memory, one CTA per request);
// bench/NOTES.md "### v9 (session 6)" has the design, the cycle estimate and the measurements.
//
// Why a heap is fine here. The spec's warning is about one thread at large M. At M <= 64 the frontier
// holds at most M entries (each pop replaces itself by its next sibling and adds at most one child, and
// the child of the last pop is never needed), so it fits one or two registers per lane of one warp, and a
// pop is one warp min-reduction (`__reduce_min_sync`) on a 32-bit key whose low 7 bits name the slot.
// Scores are the reference's own fp64 values, computed in the reference's order (sibling
// fl(fl(s - lp[r]) + lp[r+1]), child fl(s + lp[d][0])), so no row is ever "invalid" here: unsorted,
// positive, inexact or -inf rows all follow the reference's arithmetic.
//
// The fast key. key = q(score) << 7 | slot, q a monotone (non-increasing in the score) 25-bit quantization
// of the score's magnitude bits over 16 binades below 4 |low| (low = an estimate of the M-th score). If
// the popped key's q is strictly smaller than every other frontier entry's q, its score is strictly the
// largest, so the pop equals the reference's. Each lane records whether another of its entries shares the
// winner's q (no warp operation per pop); one vote at the end says whether any pop was not decided by q
// alone (a real score tie, or two scores within ~2^-21 relative), and then the request is built again in
// the exact mode: keys (ord(score), rank-tuple code), reduced by a shuffle butterfly, ties by tuple as
// the reference orders them (a prefix before its extensions). Slow (~5x per pop), only on such rows.
//
// Per pop (fast mode): the reduction gives every lane the winning slot; every lane fetches the winner's
// precomputed child (score, key, meta) with three shuffles from the winner's lane; the winner's slot
// becomes its next sibling (precomputed in place, no communication), the child takes the next free slot.
// Fresh entries then precompute their own successors' scores and keys (shared-memory rows, fp64), off the
// path to the next reduction unless they are popped right away. Lane 0 records the node (parent, depth,
// rank, previous sibling), its sibling-list slot and its ancestor row (parent's row | own bit).
#pragma once

#include "ddtree/kernels/build_tree/common.cuh"

namespace ddtree {
namespace build_tree_k {

// v9 = this kernel for launches it applies to (n_max <= kWhMaxM + 1, L <= kWhMaxL), the v8auto choice
// (the big kernel) for the others.
constexpr int kImplV9 = 7;
constexpr int kWhMaxM = 64;
constexpr int kWhMaxL = 16;
constexpr int kWhThreads = 128;
constexpr int kWhStride = kWhMaxM;  // row stride of the shared rows (ranks < R = min(K, M) <= 64)
constexpr uint32_t kWhInf = 0xFFFFFFFFu;
constexpr uint32_t kWhQMax = (1u << 25) - 2u;  // real keys stay below 0xFFFFFF80: never "equal" to kWhInf
constexpr uint32_t kWhNone = 0xFFu;            // "no previous sibling" in a meta word

__host__ __device__ inline bool warp_heap_applies(int impl, int n_max, int depth) {
  return impl == kImplV9 && n_max <= kWhMaxM + 1 && depth <= kWhMaxL;
}

// One frontier slot (64 bytes): the entry's precomputed successors, read by every lane at its pop.
struct WhSlot {
  uint32_t ck, sk, mt, pad;  // child's / next sibling's key (kWhInf = none), the entry's meta
  double csc, ssc;           // child's / next sibling's score
  double sc;                 // the entry's score (exact mode)
  unsigned long long th, tl;  // its rank-tuple code (exact mode)
  unsigned long long pad2;
};

struct WhSmem {
  WhSlot slot[kWhMaxM];             // frontier slots (at most M are ever used)
  double lp[kWhMaxL * kWhStride];   // lp[d * 64 + r] as fp64 (exact), r < R
  int32_t ids[kWhMaxL * kWhStride];
  uint32_t meta[kWhMaxM + 1];       // node: parent | depth << 8 | rank << 16 | prev << 24
  int32_t fc[kWhMaxM + 1], ns[kWhMaxM + 1];
  alignas(16) uint32_t anc[kWhMaxM + 1][4];  // W <= 3 words per row (16-byte rows)
  int count;                        // nodes, root included
};

// Entry meta word: parent node (8 bits) | depth << 8 | rank << 16 | previous sibling node << 24.
__device__ __forceinline__ uint32_t wh_meta(uint32_t par, uint32_t d, uint32_t r, uint32_t prev) {
  return par | (d << 8) | (r << 16) | (prev << 24);
}

// Monotone quantization of a score (non-increasing in the score): the high word of the double (sign,
// 11 exponent bits, 20 mantissa bits) of -s, minus `base`, clamped to [0, kWhQMax], shifted left by 7 for
// the slot. 2^20 buckets per binade, 32 binades in the window (see the kernel for `base`). Scores >= +0
// (positive rows) land in bucket 0; equal buckets are caught as dups, so nothing here needs to be exact.
__device__ __forceinline__ uint32_t wh_quant(double s, int base) {
  const int mag = max(__double2hiint(s) ^ static_cast<int>(0x80000000u), 0);
  return static_cast<uint32_t>(min(max(mag - base, 0), static_cast<int>(kWhQMax))) << 7;
}

// Order key of the exact mode: smaller = larger score (-0.0 folded into +0.0, as the heap compares them).
__device__ __forceinline__ unsigned long long wh_ord(double s) { return ~ord_asc(s); }

// Bit position of the rank digit of depth d (1-based) in the two-word tuple code: depths 1..9 in the
// high word (7 bits each from bit 56 down), 10..16 in the low word. Digit = rank + 1 (<= 64), so a
// prefix (zeros after it) sorts before its extensions.
__device__ __forceinline__ void wh_digit(int d, unsigned long long* hi, unsigned long long* lo) {
  *hi = d <= 9 ? 1ull << (63 - 7 * d) : 0ull;
  *lo = d <= 9 ? 0ull : 1ull << (63 - 7 * (d - 9));
}

// A new entry (score s, meta m, depth d, rank r): its successors' scores and keys into slot `sl`. Every
// lane computes the same values and writes them (one store of equal values per warp); every lane later
// reads back only what it wrote itself, so no lane depends on another's store (no __syncwarp needed).
template <bool EXACT>
__device__ __forceinline__ void wh_new_entry(WhSmem& W, int sl, double s, uint32_t m, unsigned long long th,
                                             unsigned long long tl, int L, int R, int base) {
  const int d = static_cast<int>((m >> 8) & 0xFFu), r = static_cast<int>((m >> 16) & 0xFFu);
  const double* row = W.lp + (d - 1) * kWhStride + r;
  // Next sibling: rank r + 1 (ranks >= M never pop: M earlier siblings would have to pop first).
  const bool sib = r + 1 < R, kid = d < L;
  const double x0 = row[0], x1 = sib ? row[1] : kNegInf, y = kid ? row[kWhStride - r] : kNegInf;
  const double ssc = __dadd_rn(__dsub_rn(s, x0), x1), csc = __dadd_rn(s, y);
  WhSlot& o = W.slot[sl];
  *reinterpret_cast<uint4*>(&o.ck) = make_uint4(y != kNegInf ? (EXACT ? 0u : wh_quant(csc, base)) : kWhInf,
                                                x1 != kNegInf ? (EXACT ? 0u : wh_quant(ssc, base)) : kWhInf, m, 0u);
  *reinterpret_cast<double2*>(&o.csc) = make_double2(csc, ssc);
  if (EXACT) {
    o.sc = s;
    o.th = th;
    o.tl = tl;
  }
}

// One warp runs the heap for M pops at most. Returns the node count (root included), or -1 (fast mode
// only) when some pop was not decided by the quantized key alone: the caller runs the exact mode.
// Writes W.meta and W.anc of each node; the sibling lists are left to the caller. Registers hold only
// the keys (S per lane: slots lane and lane + 32); everything else is in W.slot.
template <int S, bool EXACT>
__device__ int wh_heap(WhSmem& W, int L, int R, int M, int base) {
  static_assert(S == 1 || S == 2, "one or two slots per lane (M <= 64)");
  const int lane = threadIdx.x & 31;
  uint32_t key0 = kWhInf, key1 = kWhInf;
  // The first entry (0,), slot 0, scored lp[0][0] (no entry at all when that is -inf).
  const double first = W.lp[0];
  if (first != kNegInf) {
    unsigned long long h, l;
    wh_digit(1, &h, &l);
    wh_new_entry<EXACT>(W, 0, first, wh_meta(0u, 1u, 0u, kWhNone), h, l, L, R, base);
    if (lane == 0) key0 = EXACT ? 0u : wh_quant(first, base);
  }
  int n = 0, nslot = 1;
  bool dup = false;
  // The reduction of the next pop is issued before the new entries' successors are computed (they
  // change no key), so its latency overlaps that work.
  uint32_t k = 0;
  if (!EXACT) k = __reduce_min_sync(0xffffffffu, S == 1 ? key0 : min(key0, key1));
  while (true) {
    int ws;  // winning slot
    if (!EXACT) {
      if (k == kWhInf) break;
      dup |= ((key0 ^ k) < 128u) && key0 != k;
      if (S > 1) dup |= ((key1 ^ k) < 128u) && key1 != k;
      ws = static_cast<int>(k & 127u);
    } else {
      unsigned long long bo = ~0ull, bh = ~0ull, bl = ~0ull;
      int bs = 127;
#pragma unroll
      for (int j = 0; j < S; ++j) {
        const int sl = lane + 32 * j;
        const bool live = (j == 0 ? key0 : key1) != kWhInf;
        const unsigned long long o = live ? wh_ord(W.slot[sl].sc) : ~0ull, h = live ? W.slot[sl].th : ~0ull,
                                 l = live ? W.slot[sl].tl : ~0ull;
        if (o < bo || (o == bo && (h < bh || (h == bh && l < bl)))) { bo = o; bh = h; bl = l; bs = sl; }
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const unsigned long long o = __shfl_xor_sync(0xffffffffu, bo, off), h = __shfl_xor_sync(0xffffffffu, bh, off),
                                 l = __shfl_xor_sync(0xffffffffu, bl, off);
        const int s2 = __shfl_xor_sync(0xffffffffu, bs, off);
        // Equal (o, h, l) only for two empty slots: the lower slot number keeps every lane in agreement.
        if (o < bo || (o == bo && (h < bh || (h == bh && (l < bl || (l == bl && s2 < bs)))))) {
          bo = o; bh = h; bl = l; bs = s2;
        }
      }
      if (bh == ~0ull) break;  // every slot empty (a live entry's code has its top bit clear)
      ws = bs;
    }
    const WhSlot& w = W.slot[ws];
    const uint4 hd = *reinterpret_cast<const uint4*>(&w.ck);
    const double2 sc2 = *reinterpret_cast<const double2*>(&w.csc);
    const uint32_t ckw = hd.x, skw = hd.y, mtw = hd.z;
    const unsigned long long wth = EXACT ? w.th : 0ull, wtl = EXACT ? w.tl : 0ull;
    ++n;
    const bool push_child = n < M && ckw != kWhInf;
    const int cs = nslot;
    nslot += push_child ? 1 : 0;
    // The winner's slot becomes its next sibling; the child takes slot cs.
    if (lane == (ws & 31)) {
      const uint32_t v = skw == kWhInf ? kWhInf : (skw | static_cast<uint32_t>(ws));
      if (S == 1 || ws < 32) key0 = v; else key1 = v;
    }
    if (push_child && lane == (cs & 31)) {
      const uint32_t v = ckw | static_cast<uint32_t>(cs);
      if (S == 1 || cs < 32) key0 = v; else key1 = v;
    }
    if (!EXACT && n < M) k = __reduce_min_sync(0xffffffffu, S == 1 ? key0 : min(key0, key1));
    // Node n: meta and ancestor row (the parent's | its own bit); equal values from every lane.
    const uint32_t pw = mtw & 0xFFu, dw = (mtw >> 8) & 0xFFu, rw = (mtw >> 16) & 0xFFu;
    W.meta[n] = mtw;
    {
      uint4 a = *reinterpret_cast<const uint4*>(W.anc[pw]);
      const uint32_t bit = 1u << (n & 31), wd = static_cast<uint32_t>(n) >> 5;
      a.x |= wd == 0 ? bit : 0u;
      a.y |= wd == 1 ? bit : 0u;
      a.z |= wd == 2 ? bit : 0u;
      *reinterpret_cast<uint4*>(W.anc[n]) = a;
    }
    if (n >= M) break;  // the last pop's successors are never needed
    // Every lane has read the winner's slot before any lane rewrites it (the exact mode has no reduction
    // between the two; in the fast mode this also makes the ordering explicit to the memory model).
    __syncwarp();
    unsigned long long h = 0, l = 0;
    if (skw != kWhInf) {
      if (EXACT) wh_digit(static_cast<int>(dw), &h, &l);
      wh_new_entry<EXACT>(W, ws, sc2.y, (mtw & 0xFFFFu) | ((rw + 1u) << 16) | (static_cast<uint32_t>(n) << 24),
                          wth + h, wtl + l, L, R, base);
    }
    if (push_child) {
      if (EXACT) wh_digit(static_cast<int>(dw) + 1, &h, &l);
      wh_new_entry<EXACT>(W, cs, sc2.x, wh_meta(static_cast<uint32_t>(n), dw + 1u, 0u, kWhNone), wth | h, wtl | l,
                          L, R, base);
    }
  }
  if (!EXACT && __any_sync(0xffffffffu, dup)) return -1;
  return n + 1;
}

// Dynamic shared memory (sizeof(WhSmem), under the 48 KB default): the CPU emulator maps `smem_raw` to
// one static buffer, as for the big kernel.
__global__ void __launch_bounds__(kWhThreads) build_tree_warp_heap_kernel(Params p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  WhSmem& W = *reinterpret_cast<WhSmem*>(smem_raw);
  const int b = blockIdx.x, tid = threadIdx.x;
  const int L = p.depth, K = p.k;
  const int M = min(max(__ldg(p.budget + b), 0), p.n_max - 1);
  const int R = min(K, M);  // ranks that can pop (rank r needs r earlier siblings popped)
  const int ctx = __ldg(p.ctx_len + b), root = __ldg(p.root_token + b);
  const float* lp = p.lp + static_cast<size_t>(b) * L * K;
  const int32_t* ids = p.ids + static_cast<size_t>(b) * L * K;
  // Rows: thread t takes rank t % 64 of depths t / 64, t / 64 + 2, ...: all loads issued at once.
  {
    const int r = tid & (kWhStride - 1), d0 = tid / kWhStride;
    constexpr int kSteps = kWhMaxL * kWhStride / kWhThreads;
    float x[kSteps];
    int32_t id[kSteps];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int d = d0 + u * (kWhThreads / kWhStride);
      const bool in = d < L && r < R;
      x[u] = in ? __ldg(lp + static_cast<size_t>(d) * K + r) : 0.f;
      id[u] = in ? __ldg(ids + static_cast<size_t>(d) * K + r) : 0;
    }
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int d = d0 + u * (kWhThreads / kWhStride);
      if (d < L && r < R) {
        W.lp[d * kWhStride + r] = static_cast<double>(x[u]);
        W.ids[d * kWhStride + r] = id[u];
      }
    }
  }
  for (int i = tid; i < p.n_max; i += kWhThreads) {
    W.fc[i] = -1;
    W.ns[i] = -1;
  }
  if (tid == 0) {
    W.meta[0] = 0u;
    W.anc[0][0] = 1u; W.anc[0][1] = 0u; W.anc[0][2] = 0u;
    W.count = 1;
  }
  __syncthreads();
  if (tid < 32 && M > 0 && L > 0) {
    // The quantization window: 16 binades below 4 |low|, low ~ the M-th score (with K >= M the M depth-1
    // ranks bound it; otherwise the sum of the last ranks, a loose bound, which only widens the window).
    double low;
    if (K >= M) {
      low = W.lp[M - 1];
    } else {
      double v = tid < L ? W.lp[tid * kWhStride + R - 1] : 0.0;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      low = v;
    }
    if (!(low < 0.0) || low == kNegInf) low = -64.0;
    // Window top = 4 |low| (two binades above it in the high word's units of 2^20 per binade).
    const int base = max(__double2hiint(-low) + (2 << 20) - (1 << 25), 0);
    int n = M <= 32 ? wh_heap<1, false>(W, L, R, M, base) : wh_heap<2, false>(W, L, R, M, base);
    if (n < 0) {  // the exact run rewrites every node it pops
      if (tid == 0) DDTREE_BUILD_TREE_EVENT(v9_exact);
      n = M <= 32 ? wh_heap<1, true>(W, L, R, M, base) : wh_heap<2, true>(W, L, R, M, base);
    }
    if (tid == 0) {
      W.count = n;
      DDTREE_BUILD_TREE_EVENT(v9);
    }
  }
  __syncthreads();
  const int n = W.count;
  // Sibling lists from the node metas: children of a node pop in rank order, and each node after its
  // previous sibling (prev field), so each node writes one slot of its own.
  for (int i = 1 + tid; i < n; i += kWhThreads) {
    const uint32_t m = W.meta[i];
    if (((m >> 16) & 0xFFu) == 0u) W.fc[m & 0xFFu] = i; else W.ns[m >> 24] = i;
  }
  __syncthreads();
  const size_t row0 = static_cast<size_t>(b) * p.n_max;
  const int Wd = p.words;
  for (int i = tid; i < p.n_max; i += kWhThreads) {
    int tok = -1, par = -1, dep = 0;
    uint32_t a0 = 0u, a1 = 0u, a2 = 0u;
    if (i < n) {
      const uint32_t m = W.meta[i];
      dep = static_cast<int>((m >> 8) & 0xFFu);
      par = i == 0 ? -1 : static_cast<int>(m & 0xFFu);
      tok = i == 0 ? root : W.ids[(dep - 1) * kWhStride + static_cast<int>((m >> 16) & 0xFFu)];
      a0 = W.anc[i][0]; a1 = W.anc[i][1]; a2 = W.anc[i][2];
    }
    p.node_token[row0 + i] = tok;
    p.node_parent[row0 + i] = par;
    p.node_depth[row0 + i] = dep;
    p.positions[row0 + i] = ctx + dep;
    p.first_child[row0 + i] = i < n ? W.fc[i] : -1;
    p.next_sibling[row0 + i] = i < n ? W.ns[i] : -1;
    uint32_t* out = p.anc + (row0 + i) * Wd;
    out[0] = a0;
    if (Wd > 1) out[1] = a1;
    if (Wd > 2) out[2] = a2;
  }
  if (tid == 0) p.num_nodes[b] = n;
}

}  // namespace build_tree_k
}  // namespace ddtree
