// build_tree, v9: the reference heap itself, run by one warp, for launches with n_max <= 65 (M <= 64) and
// L <= 16. A kernel of its own (128 threads, ~23 KB of dynamic shared memory, one CTA per request).
// warp_heap_s6.cuh has the why (a frontier of at most M keys in one or two registers per lane, a pop =
// one `__reduce_min_sync` over 32-bit quantized keys, the exact mode for rows whose keys tie); this file
// is session 7's pop: 95 SASS instructions with 160 cycles of stall counts against session 6's 136 / 311,
// 236 cycles per pop on the H200 against 451 (bench/NOTES.md "### v9 session 7" and "... measured"):
//
// * The reduction is off the pop's path: a pop knows its winner w, reduces the rest of the frontier (m2)
//   while it builds w's successors, and takes min(m2, sibling, child) as the next winner (wh_heap7).
// * No branch inside the loop but its back edge. The loop runs exactly M times; a pop after the heap
//   ran empty (w = all ones) installs nothing and stores nothing (every store is predicated), and lane
//   0's stores are predicated st.shared instead of a divergent block (session 6's loop had seven
//   conditional branches, each ~18 cycles of predicate-to-branch stall, and re-read the shared window's
//   base inside the divergent block).
// * Records of 32 bytes, {t = fl(s - lp[d-1][r]), x1 = lp[d-1][r+1], c = fl(s + lp[d][0]), meta}: the
//   pop reads two 16-byte words, does one fp64 add (the sibling's score t + x1; the child's score c is
//   in the record) and lane 0 writes each new record with two 16-byte stores.
// * The log-prob table is padded with -inf (ranks R..65, rows L..17), so the loads that fill the new
//   records need no guards: a missing sibling or child simply gets a -inf score.
// * One __syncwarp per pop. A sibling's record goes to the other half of the record array (index
//   slot ^ 64; the key's low 7 bits name the record, bit 6 the half), never over the record the lanes
//   read in this pop, so there is no write-after-read to order; the __syncwarp orders lane 0's writes
//   before the next pop's reads.
// * Ancestor rows as 64-bit words (node 64, the only one with bit 64, gets it in the epilogue).
#pragma once

#include "ddtree/kernels/build_tree/warp_heap_s6.cuh"

namespace ddtree {
namespace build_tree_k {

// v9 = the warp heap for launches it applies to (n_max <= kWhMaxM + 1, L <= kWhMaxL), the v8auto choice
// (the big kernel) for the others. v9auto (the library default) = the warp heap for launches with
// n_max <= kV9AutoMaxNodes: since session 7 that is v9's whole range, where the H200 measured it faster
// than v8auto at every measured row (M = 16: 2.0-3.0x, M = 64: 1.29-2.88x; session 6's pop was faster
// only up to n_max = 17; bench/NOTES.md "### v9 session 7 measured"). v9s6 = session 6's warp-heap kernel
// (warp_heap_s6.cuh) where v9 applies: the A/B peer.
constexpr int kImplV9 = 7;
constexpr int kImplV9Auto = 8;
constexpr int kImplV9S6 = 21;  // far from the big kernel's numbers (common.cuh), which other selections extend
constexpr int kV9AutoMaxNodes = kWhMaxM + 1;

__host__ __device__ inline bool warp_heap_applies(int impl, int n_max, int depth) {
  const int max_nodes = impl == kImplV9 || impl == kImplV9S6 ? kWhMaxM + 1
                        : impl == kImplV9Auto                ? kV9AutoMaxNodes
                                                             : 0;
  return n_max <= max_nodes && depth <= kWhMaxL;
}

constexpr int kWh7Stride = kWhMaxM + 2;  // lp row stride: ranks 0..65 (a new sibling's x1 is rank r + 2 <= 65)
constexpr int kWh7Rows = kWhMaxL + 2;    // rows 0..17 (a new child's record reads row d + 1 <= L + 1)
constexpr int kWh7Pad = kWh7Rows * kWh7Stride - kWhMaxL * kWhMaxM;  // table cells outside the loaded grid
constexpr uint32_t kWhMetaUnset = 0xFFFFFFFFu;  // no node's meta (depth <= 16, rank < 64)

// One entry's record, read by every lane at its pop (one broadcast address, two 16-byte loads).
struct WhRec {
  double t, x1;   // fl(s - lp[d-1][r]), lp[d-1][r+1] (-inf: no sibling)
  double c;       // the first child's score fl(s + lp[d][0]) (-inf: no child)
  uint32_t mt, pad;
};

struct WhSmem {
  static constexpr int kStride = kWh7Stride;  // wh_heap<S, true> (the exact mode) reads lp with it
  union {
    WhRec rec[2 * kWhMaxM];  // fast mode: record index = slot | half << 6
    WhSlot slot[kWhMaxM];    // exact mode (warp_heap_s6.cuh's records)
  };
  double lp[kWh7Rows * kWh7Stride];  // lp[d * 66 + r] as fp64 (exact); -inf at r >= R or d >= L
  int32_t ids[kWhMaxL * kWhMaxM];    // ids[d * 64 + r], r < R
  uint32_t meta[kWhMaxM + 1];        // node: parent | depth << 8 | rank << 16 | prev << 24
  int32_t fc[kWhMaxM + 1], ns[kWhMaxM + 1];
  alignas(16) uint32_t anc[kWhMaxM + 1][4];  // words 0-1 (the fast mode writes those two only)
  int count;
};

// Predicated shared-memory stores. On the device they are one predicated st.shared each: written in C++
// (`if (p) *a = v;`), ptxas turned lane 0's stores into divergent blocks (BSSY / BRA / BSYNC, ~15-20
// cycles each in a loop that one warp issues in order). The CPU emulator takes the plain C++.
__device__ __forceinline__ void wh_st16(bool p, void* a, uint32_t x, uint32_t y, uint32_t z, uint32_t w) {
#ifdef __CUDA_ARCH__
  asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %0, 0;\n\t@q st.shared.v4.u32 [%1], {%2, %3, %4, %5};\n\t}"
               :: "r"(static_cast<uint32_t>(p)), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(a))), "r"(x),
                  "r"(y), "r"(z), "r"(w) : "memory");
#else
  if (p) *reinterpret_cast<uint4*>(a) = make_uint4(x, y, z, w);
#endif
}
__device__ __forceinline__ void wh_st8(bool p, void* a, uint32_t x, uint32_t y) {
#ifdef __CUDA_ARCH__
  asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %0, 0;\n\t@q st.shared.v2.u32 [%1], {%2, %3};\n\t}"
               :: "r"(static_cast<uint32_t>(p)), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(a))), "r"(x),
                  "r"(y) : "memory");
#else
  if (p) {
    reinterpret_cast<uint32_t*>(a)[0] = x;
    reinterpret_cast<uint32_t*>(a)[1] = y;
  }
#endif
}
__device__ __forceinline__ void wh_st4(bool p, void* a, uint32_t x) {
#ifdef __CUDA_ARCH__
  asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %0, 0;\n\t@q st.shared.u32 [%1], %2;\n\t}"
               :: "r"(static_cast<uint32_t>(p)), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(a))), "r"(x)
               : "memory");
#else
  if (p) *reinterpret_cast<uint32_t*>(a) = x;
#endif
}
__device__ __forceinline__ uint32_t wh_lo(double v) { return static_cast<uint32_t>(__double2loint(v)); }
__device__ __forceinline__ uint32_t wh_hi(double v) { return static_cast<uint32_t>(__double2hiint(v)); }

// A record's two 16-byte stores (predicated on p).
__device__ __forceinline__ void wh_rec_put(bool p, WhRec& o, double t, double x1, double c, uint32_t mt) {
  wh_st16(p, &o.t, wh_lo(t), wh_hi(t), wh_lo(x1), wh_hi(x1));
  wh_st16(p, &o.c, wh_lo(c), wh_hi(c), mt, 0u);
}

// The fast mode: M pops (the last ones find w = all ones if the heap runs empty). Returns the node count
// (root included), or -1 when some pop was not decided by the quantized key alone (the caller runs
// warp_heap_s6.cuh's exact mode). Writes W.meta and words 0-1 of W.anc for each node.
//
// The reduction is off the pop's path: a pop knows its winner w before it starts (w = the minimum of the
// frontier), masks w's slot and reduces the rest, which gives m2, the best key that stays in the frontier.
// While that reduction is in flight the pop reads w's record and computes its sibling's and child's keys
// sk and ck; the next winner is min(m2, sk, ck), with no second reduction. m2 also decides exactness: a
// pop is decided by q alone unless m2 has w's q (m2 is the smallest other key, so any key sharing w's q
// makes m2 share it).
template <int S>
__device__ int wh_heap7(WhSmem& W, int M, uint32_t hb) {
  static_assert(S == 1 || S == 2, "one or two slots per lane (M <= 64)");
  const uint32_t lane = threadIdx.x & 31u;
  const bool lane0 = lane == 0u;
  const double* lp = W.lp;
  uint32_t key0 = kWhInf, key1 = kWhInf;
  // The first entry (0,), slot 0, scored lp[0][0] (no entry when that is -inf). Its x1 and child
  // log-prob come from the padded table (-inf where R = 1 or L = 1).
  const double first = lp[0];
  wh_rec_put(lane0, W.rec[0], __dsub_rn(first, first), lp[1], __dadd_rn(first, lp[kWh7Stride]),
             wh_meta(0u, 1u, 0u, kWhNone));
  uint32_t w = first != kNegInf ? wh_quant(first, hb) : kWhInf;  // every lane: the frontier is {slot 0}
  if (lane0) key0 = w;
  __syncwarp();
  int nslot = 1;
  uint32_t dupv = ~0u;  // min over pops of (m2 ^ w) - 1: below 127 iff some pop's m2 had w's q
  unsigned long long bit = 1ull;  // node i + 1's own bit after the shift (0 for node 64: the epilogue)
  for (int i = 0; i < M; ++i) {
    // w = all ones (heap empty) reads record 127, which holds a real record or the prologue's harmless
    // one, so every address below stays inside the tables; nothing is installed or stored then.
    const bool valid = w != kWhInf;
    const uint32_t wi = w & 127u, wn = (w ^ 64u) & 127u, wsl = w & 63u, cs = static_cast<uint32_t>(nslot);
    // The rest of the frontier: w's slot masked (its sibling is installed below, after the reduction).
    const bool own0 = lane == wsl, own1 = lane + 32u == wsl;
    key0 = own0 ? kWhInf : key0;
    if (S > 1) key1 = own1 ? kWhInf : key1;
    const uint32_t m2 = __reduce_min_sync(0xffffffffu, S == 1 ? key0 : min(key0, key1));
    // The winner's record, its successors' keys, the installs.
    const WhRec& rw = W.rec[wi];
    const double2 tx = *reinterpret_cast<const double2*>(&rw.t);
    const uint4 cm = *reinterpret_cast<const uint4*>(&rw.c);
    const double c = __hiloint2double(static_cast<int>(cm.y), static_cast<int>(cm.x));
    const uint32_t mt = cm.z;
    const uint32_t d = (mt >> 8) & 0xFFu, r = (mt >> 16) & 0xFFu, par = mt & 0xFFu;
    const double* rowd = lp + d * kWh7Stride;  // row d: the child's depth d + 1
    const double x1n = rowd[static_cast<int>(r) + 2 - kWh7Stride];  // lp[d-1][r+2]
    const double2 y01 = *reinterpret_cast<const double2*>(rowd);  // lp[d][0], lp[d][1]
    const double y2 = rowd[kWh7Stride];  // lp[d+1][0]
    const unsigned long long ap = *reinterpret_cast<const unsigned long long*>(W.anc[par]);
    const double ssc = __dadd_rn(tx.x, tx.y);
    const bool sok = valid && tx.y != kNegInf;
    const bool push = valid && i + 1 < M && c != kNegInf;  // the last pop's child is never needed
    const uint32_t sk = sok ? wh_quant(ssc, hb) | wn : kWhInf;
    const uint32_t ck = push ? wh_quant(c, hb) | cs : kWhInf;
    nslot += push ? 1 : 0;
    // The sibling in w's slot, the child in slot cs (unused so far: writing kWhInf there when nothing is
    // pushed changes nothing; nor does anything written once the heap is empty, every key being kWhInf).
    key0 = own0 ? sk : key0;
    key0 = lane == cs ? ck : key0;
    if (S > 1) {
      key1 = own1 ? sk : key1;
      key1 = lane + 32u == cs ? ck : key1;
    }
    // The node and the two new records (lane 0's predicated stores).
    const uint32_t nn = static_cast<uint32_t>(i) + 1u;
    bit <<= 1;
    const unsigned long long a = ap | bit;
    wh_st4(lane0 && valid, &W.meta[nn], mt);
    wh_st8(lane0 && valid, W.anc[nn], static_cast<uint32_t>(a), static_cast<uint32_t>(a >> 32));
    wh_rec_put(lane0 && sok, W.rec[wn], __dsub_rn(ssc, tx.y), x1n, __dadd_rn(ssc, y01.x),
               (mt & 0xFFFFFFu) + 0x10000u + (nn << 24));  // rank + 1, previous sibling = node nn
    wh_rec_put(lane0 && push, W.rec[cs], __dsub_rn(c, y01.x), y01.y, __dadd_rn(c, y2),
               (mt & 0xFF00u) + (nn + 0x100u + (kWhNone << 24)));  // parent nn, depth + 1, rank 0
    __syncwarp();  // lane 0's records and node rows before the next pop's reads
    // Exactness of this pop, then the next winner.
    dupv = min(dupv, (m2 ^ w) - 1u);
    w = min(m2, min(sk, ck));
  }
  if (dupv < 127u) return -1;  // the same value in every lane
  // The pops were valid up to the first one that found the heap empty, and only valid pops wrote a meta
  // word (the prologue set meta[1..64] to kWhMetaUnset): count them with one or two ballots.
  const uint32_t un0 = __ballot_sync(0xffffffffu, W.meta[1 + lane] == kWhMetaUnset);
  const uint32_t un1 = S > 1 ? __ballot_sync(0xffffffffu, W.meta[33 + lane] == kWhMetaUnset) : 0u;
  const int n = un0 != 0u ? __ffs(static_cast<int>(un0)) - 1
                : un1 != 0u ? 32 + __ffs(static_cast<int>(un1)) - 1
                            : 32 * S;
  return min(n, M) + 1;
}

// Dynamic shared memory (sizeof(WhSmem), under the 48 KB default): the CPU emulator maps `smem_raw` to
// one static buffer, as for the big kernel.
__global__ void __launch_bounds__(kWhThreads) build_tree_warp_heap_kernel(Params p) {
  constexpr int T = kWhThreads;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  WhSmem& W = *reinterpret_cast<WhSmem*>(smem_raw);
  const int b = blockIdx.x, tid = threadIdx.x;
  const int L = p.depth, K = p.k;
  const float* lp = p.lp + static_cast<size_t>(b) * L * K;
  const int32_t* ids = p.ids + static_cast<size_t>(b) * L * K;
  DDTREE_BUILD_TREE_MARK(0);
  // Rows: thread t takes the cells t, t + T, ... of the [16][64] grid. The loads depend on the launch's
  // L and K only, not on the budget, so they are in flight together with the budget's load.
  constexpr int kSteps = kWhMaxL * kWhMaxM / T;
  const int Kc = min(K, kWhMaxM);
  float x[kSteps];
  int32_t id[kSteps];
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {
    const int d = (tid + u * T) / kWhMaxM, r = (tid + u * T) % kWhMaxM;
    const bool in = d < L && r < Kc;
    x[u] = in ? __ldg(lp + static_cast<size_t>(d) * K + r) : 0.f;
    id[u] = in ? __ldg(ids + static_cast<size_t>(d) * K + r) : 0;
  }
  const int M = min(max(__ldg(p.budget + b), 0), p.n_max - 1);
  const int R = min(K, M);  // ranks that can pop (rank r needs r earlier siblings popped)
  const int ctx = __ldg(p.ctx_len + b), root = __ldg(p.root_token + b);
#pragma unroll
  for (int u = 0; u < kSteps; ++u) {
    const int d = (tid + u * T) / kWhMaxM, r = (tid + u * T) % kWhMaxM;
    const bool in = d < L && r < R;
    W.lp[d * kWh7Stride + r] = in ? static_cast<double>(x[u]) : kNegInf;
    if (in) W.ids[d * kWhMaxM + r] = id[u];
  }
  // The padding: ranks 64 and 65 of rows 0..15, then rows 16 and 17.
  for (int j = tid; j < kWh7Pad; j += T) {
    const int c = j < 2 * kWhMaxL ? (j >> 1) * kWh7Stride + kWhMaxM + (j & 1)
                                  : kWhMaxL * kWh7Stride + (j - 2 * kWhMaxL);
    W.lp[c] = kNegInf;
  }
  for (int i = tid; i < p.n_max; i += T) {
    W.fc[i] = -1;
    W.ns[i] = -1;
  }
  if (tid < kWhMaxM) W.meta[1 + tid] = kWhMetaUnset;  // the fast pass counts its nodes by these
  if (tid == 0) {
    W.meta[0] = 0u;
    W.anc[0][0] = 1u; W.anc[0][1] = 0u; W.anc[0][2] = 0u;
    W.count = 1;
  }
  // Record 127 is what a pop reads once the heap is empty: a harmless record until slot 63's sibling
  // (if any) overwrites it with a real one.
  wh_rec_put(tid == 32, W.rec[127], 0.0, kNegInf, kNegInf, wh_meta(0u, 1u, 0u, kWhNone));
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(110);
  if (tid < 32 && M > 0 && L > 0) {
    // The quantization window (warp_heap_s6.cuh): 16 binades below 4 |low|, low ~ the M-th score.
    double low;
    if (K >= M) {
      low = W.lp[M - 1];
    } else {
      double v = tid < L ? W.lp[tid * kWh7Stride + R - 1] : 0.0;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      low = v;
    }
    if (!(low < 0.0) || low == kNegInf) low = -64.0;
    const uint32_t hb = 0x80000000u + static_cast<uint32_t>(max(__double2hiint(-low) + (2 << 20) - (1 << 25), 0));
    int n = M <= 32 ? wh_heap7<1>(W, M, hb) : wh_heap7<2>(W, M, hb);
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
      tok = i == 0 ? root : W.ids[(dep - 1) * kWhMaxM + static_cast<int>((m >> 16) & 0xFFu)];
      a0 = W.anc[i][0]; a1 = W.anc[i][1];
      a2 = i == 64 ? 1u : 0u;  // bit 64 belongs to node 64 alone (the last pop at M = 64: no children)
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
