// build_tree, v9 as it landed in session 6 (the warp heap, one warp per request, n_max <= 65, L <= 16),
// kept for the A/B against warp_heap.cuh's pop (DDTREE_BUILD_TREE_IMPL=v9s6 selects this kernel) and for
// its exact mode, which the new kernel runs on rows whose quantized keys tie (wh_heap<S, true>).
// bench/NOTES.md "### v9 (session 6)" has its design and measurements, "### v9 session 7" the new pop.
//
// Why a heap is fine here. The spec's warning is about one thread at large M. At M <= 64 the frontier
// holds at most M entries (each pop replaces itself by its next sibling and adds at most one child, and
// the child of the last pop is never needed), so their keys fit one or two registers per lane of one
// warp, and a pop is one warp min-reduction (`__reduce_min_sync`) on a 32-bit key whose low 7 bits name
// the slot. Scores are the reference's own fp64 values, computed in the reference's order (sibling
// fl(fl(s - lp[r]) + lp[r+1]), child fl(s + lp[d][0])), so no row is "invalid" here: unsorted, positive,
// inexact or -inf rows all follow the reference's arithmetic, and nothing falls back to another kernel.
//
// The fast key. key = q(score) << 7 | slot, q a monotone (non-increasing in the score) 25-bit quantization
// of the high word of the double (2^20 buckets per binade, 32 binades below 4 |low|, low = an estimate of
// the M-th score). If the popped key's q is strictly smaller than every other frontier entry's q, its score
// is strictly the largest, so the pop equals the reference's. Each lane records whether another of its
// keys shares the winner's q (no warp operation per pop); one vote at the end says whether any pop was not
// decided by q alone (a real score tie, or two scores within ~2^-20 relative), and then the request is
// built again in the exact mode: keys (ord(score), rank-tuple code) reduced by a shuffle butterfly, ties
// by tuple as the reference orders them (a prefix before its extensions). Slower, only on such rows.
//
// Per pop: the reduction gives every lane the winning slot; every lane reads the slot's record from shared
// memory (one broadcast address): the entry's score, fl(s - lp[d-1][r]) and the two log-probs its
// successors add, so the two successor scores are one fp64 add each and every lane computes the same keys.
// The winner's slot becomes its next sibling (its lane installs the key), the child takes the next free
// slot (its lane installs the key), the next reduction is issued, and then lane 0 writes the node's meta
// and ancestor row and the two new records (their loads issued together, so their latencies overlap).
// bench/NOTES.md "### v9 (session 6)" has the A/B variants measured on the H200 (precomputed records,
// a shuffle-butterfly minimum, one-warp CTAs: all slower) and the step costs behind this layout.
#pragma once

#include "ddtree/kernels/build_tree/common.cuh"

namespace ddtree {
namespace build_tree_k {

constexpr int kWhMaxM = 64;
constexpr int kWhMaxL = 16;
constexpr int kWhThreads = 128;
constexpr int kWhStride = kWhMaxM;  // row stride of the shared rows (ranks < R = min(K, M) <= 64)
constexpr uint32_t kWhInf = 0xFFFFFFFFu;
constexpr uint32_t kWhQMax = (1u << 25) - 2u;  // real keys stay below 0xFFFFFF80: never "equal" to kWhInf
constexpr uint32_t kWhNone = 0xFFu;            // "no previous sibling" in a meta word

// One frontier slot's record (64 bytes), read by every lane at its pop (one broadcast address).
struct WhSlot {
  double sc, t;               // the entry's score s and fl(s - lp[d-1][r]) (its sibling's first step)
  double x1, y;               // lp[d-1][r+1] (-inf: no sibling), lp[d][0] (-inf: no child)
  uint32_t mt, pad0, pad1, pad2;  // the entry's meta
  unsigned long long th, tl;  // exact mode: the rank-tuple code
};

struct WhSmemS6 {
  static constexpr int kStride = kWhStride;
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

// Monotone quantization of a score (non-increasing in the score): u = the high word of the double (sign,
// 11 exponent bits, 20 mantissa bits); for s <= -0, u - 0x80000000 is the magnitude, increasing in -s.
// hb = 0x80000000 + base: q = clamp(u - hb, 0, kWhQMax), then << 7 for the slot. Scores >= +0 (positive
// rows) and scores above the window land in bucket 0; a shared bucket is caught as a dup.
__device__ __forceinline__ uint32_t wh_quant(double s, uint32_t hb) {
  const uint32_t u = static_cast<uint32_t>(__double2hiint(s));
  return min(max(u, hb) - hb, kWhQMax) << 7;
}

// Order key of the exact mode: smaller = larger score (-0.0 folded into +0.0, as the heap compares them).
__device__ __forceinline__ unsigned long long wh_ord(double s) { return ~ord_asc(s); }

// Rank digit of depth d (1-based) in the two-word tuple code: depths 1..9 in the high word (7 bits each
// from bit 56 down), 10..16 in the low word. Digit = rank + 1 (<= 64), so a prefix (zeros after it) sorts
// before its extensions.
__device__ __forceinline__ void wh_digit(int d, unsigned long long* hi, unsigned long long* lo) {
  *hi = d <= 9 ? 1ull << (63 - 7 * d) : 0ull;
  *lo = d <= 9 ? 0ull : 1ull << (63 - 7 * (d - 9));
}

// Record of a new entry (lane 0 only; the caller's __syncwarp publishes it): score s, x0 = lp[d-1][r],
// x1 = lp[d-1][r+1] (-inf: no sibling), y = lp[d][0] (-inf: no child), meta m, tuple code (exact mode).
template <bool EXACT>
__device__ __forceinline__ void wh_put(WhSlot& o, double s, double x0, double x1, double y, uint32_t m,
                                       unsigned long long th, unsigned long long tl) {
  *reinterpret_cast<double2*>(&o.sc) = make_double2(s, __dsub_rn(s, x0));
  *reinterpret_cast<double2*>(&o.x1) = make_double2(x1, y);
  o.mt = m;
  if (EXACT) {
    o.th = th;
    o.tl = tl;
  }
}

// One warp runs the heap for M pops at most. Returns the node count (root included), or -1 (fast mode
// only) when some pop was not decided by the quantized key alone: the caller runs the exact mode.
// Writes W.meta and W.anc of each node; the sibling lists are left to the caller. Registers hold only
// the keys (slots lane and lane + 32); the records are in W.slot, written by lane 0.
//
// Per pop, the path from one reduction to the next: the winning slot's record (one broadcast load), the
// two successor scores (one fp64 add each: the record keeps fl(s - lp[d-1][r])), their keys, the two
// installs, the lane minimum. Everything else (the node's meta and ancestor row, the two new records)
// comes after the next reduction is issued, with all its loads first so that their latencies overlap:
// on the H200 a dependent step costs ~40-50 cycles (redux 52, shfl 37, shared load 38: bench/NOTES.md),
// and one warp issues in order, so the first build, which did that work as three dependent blocks, spent
// ~480 cycles per pop.
// Sm: the kernel's shared-memory layout (WhSmemS6 here; warp_heap.cuh's for its exact mode), with the
// fields slot, lp (row stride Sm::kStride), meta and anc.
template <int S, bool EXACT, class Sm>
__device__ int wh_heap(Sm& W, int L, int R, int M, uint32_t hb) {
  static_assert(S == 1 || S == 2, "one or two slots per lane (M <= 64)");
  const int lane = threadIdx.x & 31;
  const double* lp = W.lp;
  uint32_t key0 = kWhInf, key1 = kWhInf;
  // The first entry (0,), slot 0, scored lp[0][0] (no entry at all when that is -inf).
  const double first = lp[0];
  if (first != kNegInf) {
    unsigned long long h, l;
    wh_digit(1, &h, &l);
    if (lane == 0) {
      wh_put<EXACT>(W.slot[0], first, first, R > 1 ? lp[1] : kNegInf, L > 1 ? lp[Sm::kStride] : kNegInf,
                    wh_meta(0u, 1u, 0u, kWhNone), h, l);
      key0 = EXACT ? 0u : wh_quant(first, hb);
    }
  }
  __syncwarp();
  int n = 0, nslot = 1;
  bool dup = false;
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
    // The winner's record and its successors' scores and keys.
    const WhSlot& w = W.slot[ws];
    const double2 st = *reinterpret_cast<const double2*>(&w.sc), xy = *reinterpret_cast<const double2*>(&w.x1);
    const uint32_t mtw = w.mt;
    const unsigned long long wth = EXACT ? w.th : 0ull, wtl = EXACT ? w.tl : 0ull;
    const double ssc = __dadd_rn(st.y, xy.x), csc = __dadd_rn(st.x, xy.y);
    const uint32_t skw = xy.x != kNegInf ? (EXACT ? 0u : wh_quant(ssc, hb)) : kWhInf;
    const uint32_t ckw = xy.y != kNegInf ? (EXACT ? 0u : wh_quant(csc, hb)) : kWhInf;
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
    // Every lane has read the winner's record before lane 0 rewrites it; the writes below also cannot be
    // hoisted above the reduction.
    __syncwarp();
    // Loads first (broadcast addresses): the parent's ancestor row and the new records' log-probs.
    const uint32_t pw = mtw & 0xFFu, dw = (mtw >> 8) & 0xFFu, rw = (mtw >> 16) & 0xFFu;
    const int d = static_cast<int>(dw), r = static_cast<int>(rw);
    const double* row = lp + (d - 1) * Sm::kStride;  // depth d's row (index d - 1)
    const bool sib = n < M && skw != kWhInf;
    uint4 a = *reinterpret_cast<const uint4*>(W.anc[pw]);
    const double sx1 = sib && r + 2 < R ? row[r + 2] : kNegInf;       // lp[d-1][r+2]
    const double cx1 = push_child && R > 1 ? row[Sm::kStride + 1] : kNegInf;  // lp[d][1]
    const double cy = push_child && d + 1 < L ? row[2 * Sm::kStride] : kNegInf;  // lp[d+1][0]
    unsigned long long sh = 0, sl = 0, ch = 0, cl = 0;
    if (EXACT) {
      wh_digit(d, &sh, &sl);
      wh_digit(d + 1, &ch, &cl);
    }
    if (lane == 0) {
      // Node n: meta and ancestor row (the parent's | its own bit).
      W.meta[n] = mtw;
      const uint32_t bit = 1u << (n & 31), wd = static_cast<uint32_t>(n) >> 5;
      a.x |= wd == 0 ? bit : 0u;
      a.y |= wd == 1 ? bit : 0u;
      a.z |= wd == 2 ? bit : 0u;
      *reinterpret_cast<uint4*>(W.anc[n]) = a;
      // The next sibling (d, r + 1) in the winner's slot, the first child (d + 1, 0) in slot cs.
      if (sib)
        wh_put<EXACT>(W.slot[ws], ssc, xy.x, sx1, xy.y,
                      (mtw & 0xFFFFu) | ((rw + 1u) << 16) | (static_cast<uint32_t>(n) << 24), wth + sh, wtl + sl);
      if (push_child)
        wh_put<EXACT>(W.slot[cs], csc, xy.y, cx1, cy, wh_meta(static_cast<uint32_t>(n), dw + 1u, 0u, kWhNone),
                      wth | ch, wtl | cl);
    }
    if (n >= M) break;  // the last pop's successors are never needed
    __syncwarp();  // lane 0's records are visible to every lane at the next pop
  }
  if (!EXACT && __any_sync(0xffffffffu, dup)) return -1;
  return n + 1;
}

// Dynamic shared memory (sizeof(WhSmemS6), under the 48 KB default): the CPU emulator maps `smem_raw` to
// one static buffer, as for the big kernel.
__global__ void __launch_bounds__(kWhThreads) build_tree_warp_heap_s6_kernel(Params p) {
  constexpr int T = kWhThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  WhSmemS6& W = *reinterpret_cast<WhSmemS6*>(smem_raw);
  const int b = blockIdx.x, tid = threadIdx.x;
  const int L = p.depth, K = p.k;
  const int M = min(max(__ldg(p.budget + b), 0), p.n_max - 1);
  const int R = min(K, M);  // ranks that can pop (rank r needs r earlier siblings popped)
  const int ctx = __ldg(p.ctx_len + b), root = __ldg(p.root_token + b);
  const float* lp = p.lp + static_cast<size_t>(b) * L * K;
  const int32_t* ids = p.ids + static_cast<size_t>(b) * L * K;
  DDTREE_BUILD_TREE_MARK(0);
  // Rows: thread t takes the elements t, t + T, ... of the [16][64] grid: all loads issued at once.
  {
    constexpr int kSteps = kWhMaxL * kWhStride / T;
    float x[kSteps];
    int32_t id[kSteps];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int d = (tid + u * T) / kWhStride, r = (tid + u * T) % kWhStride;
      const bool in = d < L && r < R;
      x[u] = in ? __ldg(lp + static_cast<size_t>(d) * K + r) : 0.f;
      id[u] = in ? __ldg(ids + static_cast<size_t>(d) * K + r) : 0;
    }
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int d = (tid + u * T) / kWhStride, r = (tid + u * T) % kWhStride;
      if (d < L && r < R) {
        W.lp[d * kWhStride + r] = static_cast<double>(x[u]);
        W.ids[d * kWhStride + r] = id[u];
      }
    }
  }
  for (int i = tid; i < p.n_max; i += T) {
    W.fc[i] = -1;
    W.ns[i] = -1;
  }
  if (tid == 0) {
    W.meta[0] = 0u;
    W.anc[0][0] = 1u; W.anc[0][1] = 0u; W.anc[0][2] = 0u;
    W.count = 1;
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(110);
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
    const uint32_t hb = 0x80000000u + static_cast<uint32_t>(max(__double2hiint(-low) + (2 << 20) - (1 << 25), 0));
    int n = M <= 32 ? wh_heap<1, false>(W, L, R, M, hb) : wh_heap<2, false>(W, L, R, M, hb);
    DDTREE_BUILD_TREE_MARK(112);  // the fast pass done
    if (n < 0) {  // the exact run rewrites every node it pops
      if (tid == 0) DDTREE_BUILD_TREE_EVENT(v9_exact);
      __syncwarp();
      n = M <= 32 ? wh_heap<1, true>(W, L, R, M, hb) : wh_heap<2, true>(W, L, R, M, hb);
      DDTREE_BUILD_TREE_MARK(113);  // the exact pass done
    }
    if (tid == 0) {
      W.count = n;
      DDTREE_BUILD_TREE_EVENT(v9);
    }
    DDTREE_BUILD_TREE_MARK(111);
  }
  __syncthreads();
  const int n = W.count;
  // Sibling lists from the node metas: children of a node pop in rank order, and each node after its
  // previous sibling (prev field), so each node writes one slot of its own.
  for (int i = 1 + tid; i < n; i += T) {
    const uint32_t m = W.meta[i];
    if (((m >> 16) & 0xFFu) == 0u) W.fc[m & 0xFFu] = i; else W.ns[m >> 24] = i;
  }
  __syncthreads();
  const size_t row0 = static_cast<size_t>(b) * p.n_max;
  const int Wd = p.words;
  for (int i = tid; i < p.n_max; i += T) {
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
  DDTREE_BUILD_TREE_MARK(99);
}

}  // namespace build_tree_k
}  // namespace ddtree
