// draft_topk_lse v4, part 2: the kernel's per-stage device functions (a vector's load, a CTA's partial, the
// candidate passes over one vector, the merge's ranking), each called from a lambda of the kernel. Overview
// in ../draft_topk_lse_v4.cuh.
//
// The kernel's scalars come by const reference, as the lambdas captured them: passed by value (the load
// and the k > 1 pass), ptxas allocated registers differently and the SASS changed.
#pragma once

#include "ddtree/kernels/draft_topk_lse_v4/helpers.cuh"

namespace ddtree {
namespace kernels {

// This CTA's (reference, sum) from its warps' (after the first barrier; the last warp computes it), in
// fp32: the largest reference by one redux on ordered keys (key 0 = no warp with a nonzero sum; NaN sums
// keep their reference), every lane gets it.
template <int THREADS>
__device__ __forceinline__ float2 v4_cta_partial(const V4Smem<THREADS>& sm) {
  constexpr int WARPS = THREADS / 32;
  const int l = v4_lane_again();  // not the kernel's lane: no address from it kept alive (a v8 spill)
  const float wr = l < WARPS ? sm.wref[l] : 0.f;
  const float ws = l < WARPS ? sm.wsum[l] : 0.f;
  const uint32_t kb = __reduce_max_sync(0xffffffffu, ws != 0.f ? ordered_key(wr) : 0u);
  const float cref = kb == 0u ? 0.f : key_to_float(kb);
  float term = ws != 0.f ? ws * v4_ex2(wr - cref) : 0.f;
#pragma unroll
  for (int o = WARPS / 2; o > 0; o >>= 1) term += __shfl_xor_sync(0xffffffffu, term, o);  // lanes < WARPS
  return make_float2(cref, term);
}

// The largest of 32 lanes' items (0 = none), in every lane: two 32-bit reduxes.
__device__ __forceinline__ uint64_t v4_warp_best_item(uint64_t it) {
  const uint32_t kmax = __reduce_max_sync(0xffffffffu, uint32_t(it >> 32));
  const uint32_t lo = __reduce_max_sync(0xffffffffu, uint32_t(it >> 32) == kmax ? uint32_t(it) : 0u);
  return (uint64_t(kmax) << 32) | lo;
}

// v7 merge (FM): the row rank of every item of every CTA's sorted slot, as the sum over the lists (its own
// included) of a branch-free binary search, all lists step by step together; ranks < ksel are written.
// MAXN >= every list's length, LISTS >= cluster.
template <int MAXN, int LISTS, int THREADS, typename NOf>
__device__ __forceinline__ void v4_rank_items(const V4Smem<THREADS>& sm, const int (&nl)[kV4MaxCluster], const NOf& n_of,
                                              int tid, int cluster, int k, int ksel, double lse_d, float* lp_out,
                                              int32_t* id_out) {
  for (int t = tid; t < cluster * k; t += THREADS) {
    const int cc = t / k, r = t - cc * k;
    if (r >= n_of(cc)) continue;
    const uint64_t it = sm.slot[cc][r];
    int pos[LISTS];
#pragma unroll
    for (int o = 0; o < LISTS; ++o) pos[o] = 0;
#pragma unroll
    for (int st = MAXN; st > 0; st >>= 1) {
#pragma unroll
      for (int o = 0; o < LISTS; ++o) {
        const uint64_t v = pos[o] + st <= nl[o] ? sm.slot[o][pos[o] + st - 1] : 0ull;
        pos[o] += v > it ? st : 0;
      }
    }
    int rank = 0;
#pragma unroll
    for (int o = 0; o < LISTS; ++o) rank += pos[o];
    if (rank < ksel) {
      const float f = key_to_float(item_key(it));
      lp_out[rank] = f == -INFINITY ? -INFINITY : float(double(f) - lse_d);
      id_out[rank] = item_id(it);
    }
  }
}

// Local vector lv of this CTA (its vectors start at row vector v0): -inf past the CTA's nv_cta vectors and
// past the row's end.
template <typename T, bool VEC>
__device__ __forceinline__ uint4 v4_load_vec(const T* const& x, const int& v0, const int& nv_cta, const int& vocab, int lv) {
  constexpr int VN = 16 / int(sizeof(T));
  uint4 out = v4_neg_inf_vec<T>();
  if (lv < nv_cta) {
    const int base = (v0 + lv) * VN;
    if (VEC && base + VN <= vocab) {
      out = __ldg(reinterpret_cast<const uint4*>(x + base));
    } else {
#pragma unroll
      for (int q = 0; q < VN; ++q)
        if (base + q < vocab) v4_set_elem<T>(out, q, v4_bits(x[base + q]));
    }
  }
  return out;
}

// k>1 visit
template <typename T, bool FF, int THREADS>
__device__ __forceinline__ void v4_append_candidates(V4Smem<THREADS>& sm, const uint4& v, int lv, const int& v0, const int& nv_cta,
                                                     const int& vocab, const uint32_t& thr, const float& thr_f, const int& id_lim, const int& lane,
                                                     const unsigned& lt) {
  constexpr int VN = 16 / int(sizeof(T));
  const float vm = v4_vec_max<T>(v);
  const bool hit = lv < nv_cta && (FF ? vm >= thr_f : v4_key(vm) >= thr);
  if (!__any_sync(0xffffffffu, hit)) return;
  const int base = (v0 + lv) * VN;
  unsigned m = 0u;
#pragma unroll
  for (int q = 0; q < VN; ++q) {
    bool pass;
    if (FF) {
      const float e = v4_elem<T>(v, q);
      pass = (e > thr_f) | ((e == thr_f) & (base + q < id_lim));
    } else {
      const uint32_t key = v4_key(v4_elem<T>(v, q));
      pass = (key > thr) | ((key == thr) & (base + q < id_lim));
    }
    const bool in = hit & (base + q < vocab) & pass;
    m |= unsigned(in) << q;
  }
  int off[VN];
  int total = 0;
#pragma unroll
  for (int q = 0; q < VN; ++q) {  // slots in (element, lane) order
    const unsigned bq = __ballot_sync(0xffffffffu, (m >> q) & 1u);
    off[q] = total + __popc(bq & lt);
    total += __popc(bq);
  }
  int pos0 = 0;
  if (lane == 0) pos0 = v4_atomic_add_shared(&sm.cnt, total);
  pos0 = __shfl_sync(0xffffffffu, pos0, 0);
#pragma unroll
  for (int q = 0; q < VN; ++q) {
    const int pos = pos0 + off[q];
    if (((m >> q) & 1u) && pos < kV4Cap) sm.cbuf[pos] = pack_item(v4_key(v4_elem<T>(v, q)), base + q);
  }
}

// v8 (kV4OptLaneAppend) k > 1 visit, for a bound that is a finite logit's float (thr_f > -inf): then a logit
// is a candidate iff it is >= thr_f (no id limit applies, and the -inf of invalid elements and of vectors
// past the CTA never pass). No warp-level operation (and no vector maximum or vote first: 8 compares per
// vector); each lane appends its own admitted logits (usually none or one): one shared atomic for its count,
// then one store per set bit. The order of the candidates in cbuf is free (ranks are counted).
template <typename T, int THREADS>
__device__ __forceinline__ void v4_append_lane(V4Smem<THREADS>& sm, const uint4& v, int lv, const int& v0,
                                               const float& thr_f) {
  constexpr int VN = 16 / int(sizeof(T));
  unsigned m = 0u;
#pragma unroll
  for (int q = 0; q < VN; ++q) m |= unsigned(v4_elem<T>(v, q) >= thr_f) << q;
  if (m != 0u) {
    const int pos = v4_atomic_add_shared(&sm.cnt, __popc(m));
    const int base = (v0 + lv) * VN;
#pragma unroll
    for (int q = 0; q < VN; ++q) {  // predicated stores (a loop over the set bits spilled, sm_90a)
      const int at = pos + __popc(m & ((1u << q) - 1u));
      if (((m >> q) & 1u) && at < kV4Cap) sm.cbuf[at] = pack_item(v4_key(v4_elem<T>(v, q)), base + q);
    }
  }
}

// v9 (kV4OptWarpAppend) k > 1 pass over one round of this thread's vectors (v[j] = local vector lv0 + j *
// THREADS), for a bound that is a finite logit's float (thr_f > -inf; the lane append's condition): each
// vector's maximum is tested first (a divergent branch per vector); a vector whose maximum reaches the bound
// gets its 32-bit element mask, one shared atomic for its count and the stores in a loop over the set bits
// (usually one). v8 built every vector's mask and ran eight guarded store blocks per vector with a hit; the
// first v9 build (one 64-bit mask per round and one atomic per lane and round) compiled the mask to an
// IMAD.WIDE per element (NOTES "v9").
template <typename T, int THREADS>
__device__ __forceinline__ void v4_append_round(V4Smem<THREADS>& sm, const uint4 (&v)[kV4Vecs], int lv0,
                                                const int& v0, const float& thr_f) {
  constexpr int VN = 16 / int(sizeof(T));
#pragma unroll
  for (int j = 0; j < kV4Vecs; ++j) {
    if (v4_vec_max<T>(v[j]) >= thr_f) {
      unsigned mj = 0u;
#pragma unroll
      for (int q = 0; q < VN; ++q) mj |= v4_elem<T>(v[j], q) >= thr_f ? (1u << q) : 0u;
      int pos = v4_atomic_add_shared(&sm.cnt, __popc(mj));
      const int id_base = (v0 + lv0 + j * THREADS) * VN;
      while (mj != 0u) {
        const int q = __ffs(int(mj)) - 1;
        mj &= mj - 1u;
        if (pos < kV4Cap) sm.cbuf[pos] = pack_item(v4_key(v4_elem<T>(v[j], q)), id_base + q);
        ++pos;
      }
    }
  }
}

// v13 (kV4OptCompact): v4_append_round's work with one copy of the hit body. The five vectors' maxima are tested
// first (straight-line, into a 5-bit mask), then a rolled loop over the vectors that reach the bound picks the vector by
// selects (compile-time indices: raw stays in registers), builds its element mask, reserves its slots with one shared
// atomic and stores them in a rolled loop over the set bits. v4_append_round inlines the hit body five times (~200
// instructions each, sm_90a), so a warp with no hit jumps over ~3 KB of code per vector.
template <typename T, int THREADS>
__device__ __forceinline__ void v4_append_round_compact(V4Smem<THREADS>& sm, const uint4 (&v)[kV4Vecs], int lv0,
                                                        const int& v0, const float& thr_f) {
  constexpr int VN = 16 / int(sizeof(T));
  unsigned hm = 0u;
#pragma unroll
  for (int j = 0; j < kV4Vecs; ++j) hm |= v4_vec_max<T>(v[j]) >= thr_f ? (1u << j) : 0u;
#pragma unroll 1
  while (hm != 0u) {
    const int j = __ffs(int(hm)) - 1;
    hm &= hm - 1u;
    uint4 w = v[0];
#pragma unroll
    for (int i = 1; i < kV4Vecs; ++i) w = j == i ? v[i] : w;
    unsigned mj = 0u;
#pragma unroll
    for (int q = 0; q < VN; ++q) mj |= v4_elem<T>(w, q) >= thr_f ? (1u << q) : 0u;
    int pos = v4_atomic_add_shared(&sm.cnt, __popc(mj));
    const int id_base = (v0 + lv0 + j * THREADS) * VN;
#pragma unroll 1
    while (mj != 0u) {
      const int q = __ffs(int(mj)) - 1;
      mj &= mj - 1u;
      if (pos < kV4Cap) sm.cbuf[pos] = pack_item(v4_key(v4_elem<T>(w, q)), id_base + q);
      ++pos;
    }
  }
}

// v9 (kV4OptA2AMerge): CTA c's own items (its sorted list, n_of(c) of them) ranked in the row: one lane per
// (item, list) pair, LISTS consecutive lanes per item (LISTS >= cluster, a power of 2 <= 8), each a
// branch-free binary search of MAXN >= every list's length steps in its list (the item's own list gives its
// index), then a shuffle sum; ranks < ksel are written. Lists are stored swizzled: item r of list o at
// index r ^ o (the lanes of one item search different lists at the same positions: distinct banks).
// OWN_N (v11, the row bound): this CTA's list holds `nown` items (then zeros), not n_of(c).
template <int MAXN, int LISTS, int THREADS, bool OWN_N = false, typename NOf>
__device__ __forceinline__ void v4_rank_own_items(const V4Smem<THREADS>& sm, const NOf& n_of, int c, int cluster,
                                                  int ksel, double lse_d, float* lp_out, int32_t* id_out,
                                                  int nown = 0) {
  const int tid = int(threadIdx.x), lane = v4_lane_again();
  const int pairs = (OWN_N ? nown : n_of(c)) * LISTS;
  for (int t0 = tid - lane; t0 < pairs; t0 += THREADS) {  // warp-uniform bounds (the shuffles)
    const int t = t0 + lane;
    const int item = t / LISTS, o = t - item * LISTS;
    const bool valid = t < pairs;
    const uint64_t it = valid ? sm.slot[c][item ^ c] : ~0ull;
    const int n = valid && o < cluster ? n_of(o) : 0;
    int pos = 0;
#pragma unroll
    for (int st = MAXN; st > 0; st >>= 1) {
      const uint64_t x = pos + st <= n ? sm.slot[o][(pos + st - 1) ^ o] : 0ull;
      pos += x > it ? st : 0;
    }
#pragma unroll
    for (int d = 1; d < LISTS; d <<= 1) pos += __shfl_xor_sync(0xffffffffu, pos, d);
    if (valid && o == 0 && pos < ksel) {
      const float f = key_to_float(item_key(it));
      lp_out[pos] = f == -INFINITY ? -INFINITY : float(double(f) - lse_d);
      id_out[pos] = item_id(it);
    }
  }
}

// v13 (kV4OptCompact): v4_rank_own_items as one instantiation for every k and cluster: eight lanes per item (lists
// past the cluster are empty: their searches find 0), and a rolled search of log2(maxn) + 1 steps (maxn = 16, 32 or 64,
// the smallest >= k; each step is a dependent shared load either way). v9 instantiates six copies (MAXN x LISTS).
template <int THREADS, bool OWN_N = false, typename NOf>
__device__ __forceinline__ void v4_rank_own_items_compact(const V4Smem<THREADS>& sm, const NOf& n_of, int c, int cluster,
                                                          int maxn, int ksel, double lse_d, float* lp_out,
                                                          int32_t* id_out, int nown = 0) {
  constexpr int LISTS = kV4MaxCluster;
  const int tid = int(threadIdx.x), lane = v4_lane_again();
  const int pairs = (OWN_N ? nown : n_of(c)) * LISTS;
#pragma unroll 1
  for (int t0 = tid - lane; t0 < pairs; t0 += THREADS) {  // warp-uniform bounds (the shuffles)
    const int t = t0 + lane;
    const int item = t / LISTS, o = t - item * LISTS;
    const bool valid = t < pairs;
    const uint64_t it = valid ? sm.slot[c][item ^ c] : ~0ull;
    const int n = valid && o < cluster ? n_of(o) : 0;
    int pos = 0;
#pragma unroll 1
    for (int st = maxn; st > 0; st >>= 1) {
      const uint64_t x = pos + st <= n ? sm.slot[o][(pos + st - 1) ^ o] : 0ull;
      pos += x > it ? st : 0;
    }
#pragma unroll
    for (int d = 1; d < LISTS; d <<= 1) pos += __shfl_xor_sync(0xffffffffu, pos, d);
    if (valid && o == 0 && pos < ksel) {
      const float f = key_to_float(item_key(it));
      lp_out[pos] = f == -INFINITY ? -INFINITY : float(double(f) - lse_d);
      id_out[pos] = item_id(it);
    }
  }
}

// The selection item of logit f (id) when it is a candidate against the bound (thr, id_lim), else 0.
__device__ __forceinline__ uint64_t v4_item_of(float f, int id, const uint32_t& thr, const int& id_lim) {
  const uint32_t key = v4_key(f);
  return (key > thr || (key == thr && id < id_lim)) ? pack_item(key, id) : 0ull;
}

// v13b (kV4OptColdCall, with kV4OptCompact): the radix fallback of a tie-heavy slice (more than kV4Cap candidates) as a
// called function: its code leaves the kernel's executed path (the block barriers inside are reached by every thread
// of the CTA: n is CTA-uniform). Exact top-kc of the slice's admitted items into cbuf; cnt = kc.
template <typename T, bool VEC, int THREADS>
__device__ __noinline__ void v4_radix_fallback(V4Smem<THREADS>& sm, const T* x, int v0, int nv_cta, int vocab, int kc,
                                               uint32_t thr, int id_lim) {
  constexpr int VN = 16 / int(sizeof(T));
  const int tid = int(threadIdx.x);
  auto for_each = [&](auto f) {
    for (int lv = tid; lv < nv_cta; lv += THREADS) {
      const uint4 v = v4_load_vec<T, VEC>(x, v0, nv_cta, vocab, lv);
      const int base = (v0 + lv) * VN;
#pragma unroll 1
      for (int q = 0; q < VN; ++q) f(base + q < vocab ? v4_item_of(v4_elem<T>(v, q), base + q, thr, id_lim) : 0ull);
    }
  };
  uint64_t prefix, mask;
  block_select_top<THREADS>(for_each, kc, sm.sel, prefix, mask);
  if (tid == 0) sm.cnt = 0;  // every thread read n before block_select_top's barriers
  __syncthreads();
  for_each([&](uint64_t it) {
    if (it != 0ull && (it & mask) >= prefix) sm.cbuf[atomicAdd(&sm.cnt, 1)] = it;  // exactly kc
  });
  __syncthreads();
}

// v13b (kV4OptColdCall): the element-wise candidate pass (a -inf bound, unaligned rows, two or more rounds not all in
// the row) as a called function, every vector re-read (from L2): one rolled copy of v4_append_candidates. Called by
// whole warps (its ballots), as the kernel's pass.
template <typename T, bool VEC, bool FF, int THREADS>
__device__ __noinline__ void v4_elementwise_pass(V4Smem<THREADS>& sm, const T* x, int v0, int nv_cta, int vocab,
                                                 int rounds, uint32_t tkey, uint32_t thr, float thr_f, int id_lim) {
  const int tid = int(threadIdx.x), lane = v4_lane_again();
  const unsigned lt = (1u << lane) - 1u;
#pragma unroll 1
  for (int lj = 0; lj < rounds * kV4Vecs; ++lj) {
    const int lv = lj * THREADS + tid;
    const uint4 v = lv < nv_cta && tkey >= thr ? v4_load_vec<T, VEC>(x, v0, nv_cta, vocab, lv) : v4_neg_inf_vec<T>();
    v4_append_candidates<T, FF, THREADS>(sm, v, lv, v0, nv_cta, vocab, thr, thr_f, id_lim, lane, lt);
  }
}

// The k = 1 candidate pass over one vector (lane-local, v5): a lane whose vector reaches the bound keeps
// its best admitted item in best.
template <typename T, typename ItemOf>
__device__ __forceinline__ void v4_visit_k1(const uint4& v, int lv, const int& v0, const int& nv_cta, const int& vocab,
                                            const uint32_t& thr, const ItemOf& item_of, unsigned long long& best) {
  constexpr int VN = 16 / int(sizeof(T));
  const float vm = v4_vec_max<T>(v);
  if (lv < nv_cta && v4_key(vm) >= thr) {
    const int base = (v0 + lv) * VN;
#pragma unroll
    for (int q = 0; q < VN; ++q) {
      const uint64_t it = base + q < vocab ? item_of(v4_elem<T>(v, q), base + q) : 0ull;
      best = it > best ? it : best;
    }
  }
}

}  // namespace kernels
}  // namespace ddtree
