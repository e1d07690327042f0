// draft_topk_lse v4, part 3: the kernel. Overview in ../draft_topk_lse_v4.cuh.
//
// The bodies of the kernel's lambdas live in stages.cuh; the lambdas stay as one-line forwarders, which
// kept the SASS identical on sm_90a and sm_120. Moving inline blocks (CTA 0's merge, tried by value, by
// reference and through a lambda) into functions changed ptxas' register allocation, so the stages without
// a lambda (loads + sums, the k = 1 warp path, the bound, the merge) stay in the kernel. Check per-function
// SASS before moving more. Two of its stages sit in files of their own, #included where they stand so that
// no file passes 500 lines (the SASS is unchanged: the kernel's tokens are): the candidate stage
// (kernel_candidates.inc) and CTA 0's merge (kernel_merge.inc).
#pragma once

#include "ddtree/kernels/draft_topk_lse_v4/helpers.cuh"
#include "ddtree/kernels/draft_topk_lse_v4/stages.cuh"

namespace ddtree {
namespace kernels {

// grid = (cluster, rows), cluster dims (cluster, 1, 1), block = THREADS. pv = vectors per CTA
// (v4_split). Outputs as draft_topk_lse.h; flags gets DDTREE_FLAG_NAN_INPUT (bit 0) for NaN/+inf rows.
// <= 64 registers at any CTA size (1024 threads: 1 CTA/SM, 512: 2, 256: 4).
// ASYNC (the default at 512 threads since v5; DDTREE_TOPK_V4_CONFIG="512,0,0" turns it off): the other
// CTAs st.async their partial and items into CTA 0 against an mbarrier and exit; no closing cluster barrier.
//
// OPT (kV4Opt*, helpers.cuh): v6 options, kV4OptDefault in the library. STOP (profiler only, 0 = the whole
// kernel): exit after a stage (1 loads + maxima, 2 sums + first barrier, 3 bound/partial, 4 candidates,
// 5 everything but CTA 0's merge), keeping that stage's results alive through a store that never happens.
template <typename T, bool VEC, int THREADS, bool ASYNC = false, unsigned OPT = kV4OptDefault, int STOP = 0>
__global__ void __launch_bounds__(THREADS, 1024 / THREADS)
    draft_topk_lse_v4_kernel(const T* __restrict__ logits, int positions, int vocab, int64_t batch_stride,
                             int64_t row_stride, int k, int cluster, int pv, float* __restrict__ top_lp,
                             int32_t* __restrict__ top_id, float* __restrict__ lse, int32_t* __restrict__ flags) {
  static_assert(THREADS % kV4Groups == 0 && THREADS <= 1024, "kV4Groups lane groups of THREADS / kV4Groups lanes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // the launcher never runs v4 below sm_90 (no clusters)
#else
  pdl_launch_dependents();
  DDTREE_V4_SHARED(V4Smem<THREADS>, sm);
  constexpr int VN = 16 / int(sizeof(T));
  // v9 (kV4OptA2AMerge, k > 1; with the k = 1 warp path, so that every k reaching the general path is > 1 and
  // `a2a` is a compile-time constant there: a runtime flag spilled 8 bytes, sm_90a): every CTA receives every
  // other CTA's partial and items and ranks its own.
  constexpr bool a2a = ASYNC && (OPT & kV4OptA2AMerge) != 0u && (OPT & kV4OptK1Warp) != 0u;
  constexpr bool SP = a2a && (OPT & kV4OptSpreadPut) != 0u;  // v10: eight lanes per candidate rank and put
  static_assert(!SP || kV4MaxCluster == 8, "one lane of a candidate's group per destination CTA");
  constexpr bool RW = a2a && (OPT & kV4OptRowBound) != 0u;  // v11: the row bound
  constexpr bool CP = (OPT & kV4OptCompact) != 0u;           // v13: compact code on the executed path
  constexpr bool CC = CP && (OPT & kV4OptColdCall) != 0u;    // v13b: the rare passes as called functions
  if (ASYNC && (blockIdx.x == 0 || (a2a && k > 1)) && threadIdx.x == 0) {
    // Bytes this CTA receives (CTA 0 only, unless a2a): every other CTA's partial (8) and its min(k, n) items
    // (8 each).
    unsigned bytes = 0;
    for (int cc = 0; cc < cluster; ++cc)
      if (cc != int(blockIdx.x)) bytes += 8u + 8u * unsigned(min(k, min(pv * VN, vocab - cc * pv * VN)));
    v4_mbar_init_expect(&sm.mbar, bytes);
  }
  // v11: the mbarrier of the other CTAs' m-th largest group maxima (armed after barrier 2: v4_mbar_init).
  if (RW && threadIdx.x == 32) v4_mbar_init(&sm.mbar2);
  v4_cluster_arrive_relaxed();  // "every CTA of the cluster started": waited for before the first remote store
  constexpr int WARPS = THREADS / 32;
  constexpr int G = THREADS / kV4Groups;  // lanes per group
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  const int c = int(blockIdx.x), row = int(blockIdx.y);
  const int b = row / positions, l = row - b * positions;
  const T* x = logits + int64_t(b) * batch_stride + int64_t(l) * row_stride;
  const int nvec = (vocab + VN - 1) / VN;
  const int v0 = c * pv;                        // first vector of this CTA
  const int nv_cta = min(pv, nvec - v0);        // its vectors (>= 1)
  const int id0 = v0 * VN;                      // its first logit id (its ids are contiguous)
  const int n_valid = min(nv_cta * VN, vocab - id0);
  const int kc = min(k, n_valid);
  const int rounds = (nv_cta + THREADS * kV4Vecs - 1) / (THREADS * kV4Vecs);
  if (tid == 0) {
    sm.cnt = 0;
    sm.best = 0ull;
  }

  // Vector j of round r of this thread: local vector (r * kV4Vecs + j) * THREADS + tid.
  auto load = [&](int lv) -> uint4 { return v4_load_vec<T, VEC>(x, v0, nv_cta, vocab, lv); };

  // Every vector of this CTA lies inside the row (v6 fast loads; CTA-uniform).
  // (Not at 1024 threads, an opt-in shape: there it spilled 4 bytes for fp32.)
  const bool fast = (OPT & kV4OptFastLoad) != 0u && THREADS <= 512 && VEC && (v0 + nv_cta) * VN <= vocab;
  constexpr bool K1W = ASYNC && (OPT & kV4OptK1Warp) != 0u;
  constexpr bool RB = ASYNC && (OPT & kV4OptRadixBound) != 0u;
  constexpr bool RV = (OPT & (kV4OptRolledVisit | kV4OptCompact)) != 0u;  // v13: one visit copy in the rare passes
  constexpr bool SPLIT = (OPT & kV4OptSplitMerge) != 0u;
  // v7 options: st.async instantiations only (the closing-barrier ones, opt-in since v5, stay v6's; with
  // them ptxas spilled 4 bytes at 256 and 512 threads).
  constexpr bool SB = ASYNC && (OPT & kV4OptSpreadBound) != 0u;
  constexpr bool FM = ASYNC && (OPT & kV4OptFlatMerge) != 0u;
  constexpr bool BR = ASYNC && (OPT & kV4OptBatchReload) != 0u;
  constexpr bool FF = ASYNC && (OPT & kV4OptFloatFilter) != 0u;
  constexpr bool SS = FM && (OPT & kV4OptShortSearch) != 0u;
  constexpr bool LA = FF && (OPT & kV4OptLaneAppend) != 0u;  // v8 (with the float filter)
  // v9 (with the lane append's condition); 16-byte-aligned rows only (VEC: with element-wise loads ptxas
  // spilled 8 bytes, sm_90a).
  constexpr bool WA = VEC && LA && (OPT & kV4OptWarpAppend) != 0u;
  // A store that never happens (logits are never this) keeps a truncated stage's work alive (STOP).
  auto sink = [&](float v) {
    if (v == 1.2345e-30f) lse[row] = v;
  };

  DDTREE_V4_MARK(0);
  pdl_wait();  // the previous kernel's writes (logits) are visible; ours start after it ended
  DDTREE_V4_MARK(1);
  uint4 raw[kV4Vecs];
  float tmax = -INFINITY;  // this thread's maximum
  int jbest = 0;           // K1W: local vector index (r * kV4Vecs + j) of this thread's first maximal vector
  // v5: sums per thread, vector by vector as the loads land (v4 waited for all of a round's vectors and a
  // warp maximum before the first exp2, so the MUFU-bound sums, ~0.6 µs per SM at 1x15, ran after the DRAM
  // wait instead of under it). The log2-domain reference is the first finite vector maximum and moves only
  // when a vector's maximum exceeds it by more than 2^64 (then s is rescaled): terms stay below 2^64, s
  // below 2^70, and the vector that set the reference contributes >= 1, so flushed terms are negligible.
  float ref = -INFINITY;  // -inf until a finite (or +inf) maximum was seen; the sums then use 0
  float s0 = 0.f, s1 = 0.f;
  for (int r = 0; r < rounds; ++r) {
    if (fast && (r + 1) * (THREADS * kV4Vecs) <= nv_cta) {
      const uint4* xv = reinterpret_cast<const uint4*>(x) + (v0 + r * kV4Vecs * THREADS + tid);
#pragma unroll
      for (int j = 0; j < kV4Vecs; ++j) raw[j] = __ldg(xv + j * THREADS);
    } else {
#pragma unroll
      for (int j = 0; j < kV4Vecs; ++j) raw[j] = load((r * kV4Vecs + j) * THREADS + tid);
    }
#pragma unroll
    for (int j = 0; j < kV4Vecs; ++j) {
      const float m = v4_vec_max<T>(raw[j]);
      if (K1W) jbest = m > tmax ? r * kV4Vecs + j : jbest;  // the first vector holding the maximum
      tmax = fmaxf(tmax, m);
      const float mr = m * kV4Log2e;
      if (mr > ref + 64.f) {  // the first finite (or +inf) maximum, or far above the reference
        const float f = v4_ex2(ref - mr);  // 0 when ref is -inf
        s0 *= f;
        s1 *= f;
        ref = mr;
      }
      // NaN/+inf make s NaN; a NaN among -inf (vector maximum -inf) too, through the placeholder 0.
      v4_vec_sum<T>(raw[j], ref == -INFINITY ? 0.f : ref, s0, s1);
    }
  }
  DDTREE_V4_MARK(2);
  if (STOP == 1) {
    sink(tmax);
    return;
  }
  // The warp's (reference, sum): the lanes' sums scaled to the warp's largest reference.
  const float warp_ref = key_to_float(__reduce_max_sync(0xffffffffu, ordered_key(ref)));
  float s = s0 + s1;
  s = s != 0.f ? s * v4_ex2(ref - warp_ref) : s;  // NaN stays NaN
  s = warp_sum(s);
  if (lane == 0) {
    sm.wref[warp] = warp_ref;
    sm.wsum[warp] = s;
  }
  // Key of this thread's maximum (selection keys read -0 as +0, so it is exact for zeros of either sign):
  // the group bound's input and the candidate filter's test; 0 when the thread holds no logit.
  const bool has = tid < nv_cta;
  const uint32_t tkey = has ? v4_key(tmax) : 0u;
  // This CTA's (reference, sum) from its warps' (after the first barrier; the last warp computes it).
  auto cta_partial = [&]() -> float2 { return v4_cta_partial<THREADS>(sm); };
  auto warp_best_item = [&](uint64_t it) -> uint64_t { return v4_warp_best_item(it); };

  if (K1W && k == 1) {
    // v6 k = 1: the warp's best item is the lowest id among its lanes' logits with the warp's maximal key.
    // Only lanes holding that key look again, and only at their first vector holding their maximum (an
    // earlier round's vector is loaded again, from L2). Invalid elements are -inf at higher ids than the
    // lane's valid ones, so the first match in id order is valid.
    const uint32_t wkey = __reduce_max_sync(0xffffffffu, tkey);
    uint32_t lo = 0u;  // 0xFFFFFFFF - id (pack_item's low word) of the lane's best logit; 0 = none
    if (tkey == wkey && has) {
      uint4 v = v4_neg_inf_vec<T>();
      if (jbest >= (rounds - 1) * kV4Vecs) {
#pragma unroll
        for (int j = 0; j < kV4Vecs; ++j) v = (rounds - 1) * kV4Vecs + j == jbest ? raw[j] : v;
      } else {
        v = load(jbest * THREADS + tid);
      }
      const int base = (v0 + jbest * THREADS + tid) * VN;
#pragma unroll
      for (int q = VN - 1; q >= 0; --q) {
        const bool hit = base + q < vocab && v4_key(v4_elem<T>(v, q)) == wkey;
        lo = hit ? 0xFFFFFFFFu - uint32_t(base + q) : lo;
      }
    }
    lo = __reduce_max_sync(0xffffffffu, lo);
    if (lane == 0) sm.witem[warp] = lo == 0u ? 0ull : ((uint64_t(wkey) << 32) | lo);
    __syncthreads();
    DDTREE_V4_MARK(3);
    if (STOP == 2) {
      if (tid == 0) sink(sm.wsum[0] + float(sm.witem[1] & 1u));
      return;
    }
    if (warp != WARPS - 1) return;  // the last warp sends this CTA's partial and best item
    DDTREE_V4_MARK(4);
    const float2 part = cta_partial();
    const uint64_t best = warp_best_item(lane < WARPS ? sm.witem[lane] : 0ull);
    if (STOP == 3) {
      if (lane == 0) sink(part.y + float(best & 1u));
      return;
    }
    v4_cluster_wait();  // every CTA of the cluster runs: its shared memory may be written
    DDTREE_V4_MARK(5);
    if (c != 0) {
      if (lane == 0) {
        v4_st_async(&sm.part[c], 0u, part, &sm.mbar);
        v4_st_async(&sm.slot[c][0], 0u, best, &sm.mbar);
      }
      DDTREE_V4_MARK(6);
      return;
    }
    if (lane == 0) {
      sm.part[0] = part;
      sm.slot[0][0] = best;
    }
    __syncwarp();
    v4_mbar_wait0(&sm.mbar);
    DDTREE_V4_MARK(8);
    if (STOP == 5) return;
    // CTA 0's merge, this warp alone: the lse as the k > 1 merge below, the best of the CTAs' items.
    const float2 p = lane < cluster ? sm.part[lane] : make_float2(0.f, 0.f);
    if (__any_sync(0xffffffffu, p.y != p.y)) {  // NaN or +inf in the row
      if (lane == 0) {
        const float qnan = __int_as_float(0x7fc00000);
        top_lp[row] = qnan;
        top_id[row] = -1;
        lse[row] = qnan;
        raise_flag(flags, 0x1);
      }
      return;
    }
    const uint32_t kb = __reduce_max_sync(0xffffffffu, p.y != 0.f ? ordered_key(p.x) : 0u);
    const float big = kb == 0u ? -INFINITY : key_to_float(kb);
    const float sf = warp_sum(p.y != 0.f ? p.y * v4_ex2(p.x - big) : 0.f);
    const double lse_d =
        big == -INFINITY ? -double(INFINITY) : (double(big) + double(log2f(sf))) * (1.0 / double(kV4Log2e));
    const uint64_t it = warp_best_item(lane < cluster ? sm.slot[lane][0] : 0ull);
    if (lane == 0) {
      const float f = key_to_float(item_key(it));
      top_lp[row] = f == -INFINITY ? -INFINITY : float(double(f) - lse_d);
      top_id[row] = item_id(it);
      lse[row] = float(lse_d);
    }
    DDTREE_V4_MARK(9);
    return;
  }

  uint32_t g = tkey;
#pragma unroll
  for (int o = 1; o < G; o <<= 1) g = max(g, __shfl_xor_sync(0xffffffffu, g, o));
  if ((lane & (G - 1)) == 0) sm.gmax[tid / G] = g;
  __syncthreads();
  v4_cluster_wait();  // every CTA of the cluster runs: its shared memory may be written
  DDTREE_V4_MARK(3);
  if (STOP == 2) {
    if (tid == 0) sink(sm.wsum[0] + float(sm.gmax[1]));
    return;
  }

  bool bad = false;      // a NaN/+inf slice
  uint32_t thr_rb = 1u;  // RB: the slice bound (1 admits every valid logit)
  if (RB && k > 1) {
    // v6 radix bound: the k-th largest of the 128 group maxima (the largest x with >= k maxima >= x), found
    // by every warp bit by bit from the top (lane i holds maxima 4i..4i+3); no counting, no second barrier.
    // Fewer than k groups with a logit: 0 (then every valid logit is a candidate).
    static_assert(kV4Groups == 4 * 32, "one 16-byte read of the group maxima per lane");
    const uint4 g4 = reinterpret_cast<const uint4*>(sm.gmax)[lane];
    uint32_t pre = 0u;
#pragma unroll 1
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = pre | (1u << bit);
      const int cnt = __popc(__ballot_sync(0xffffffffu, g4.x >= cand)) + __popc(__ballot_sync(0xffffffffu, g4.y >= cand)) +
                      __popc(__ballot_sync(0xffffffffu, g4.z >= cand)) + __popc(__ballot_sync(0xffffffffu, g4.w >= cand));
      pre = cnt >= k ? cand : pre;
    }
    if (kc < n_valid) thr_rb = max(pre, 1u);
    const float sw = lane < WARPS ? sm.wsum[lane] : 0.f;
    bad = __any_sync(0xffffffffu, sw != sw);
    if (warp == WARPS - 1) {
      const float2 part = cta_partial();
      if (lane == 0) {
        if (STOP == 3 || STOP == 4) sm.part[c] = part;
        else if (c != 0) v4_st_async(&sm.part[c], 0u, part, &sm.mbar);
        else sm.part[0] = part;
      }
    }
    DDTREE_V4_MARK(4);
    if (STOP == 3) {
      if (lane == 0) sink(float(thr_rb) + float(bad));
      return;
    }
  } else if (warp != WARPS - 1 || k == 1) {
    // The k-th largest group maximum: groups whose maximum is >= it hold k distinct logits >= it (k = 1:
    // the largest, no counting). v5: the G lanes of a group each count 128 / G of the maxima (v4.1: 128
    // threads counted all 128, a 4x longer chain). The last warp combines the CTA's partial instead: its
    // groups are left out of the bound for k > 1, which stays a valid lower bound (the maximum over the
    // other groups that have k groups at or above them).
    const uint32_t mine = sm.gmax[tid / G];
    bool enough = true;
    if (k > 1) {
      constexpr int PER = kV4Groups / G;  // maxima counted per lane
      static_assert(PER % 4 == 0, "16-byte reads of the maxima");
      // v7 (SB): lane j of a group reads 16-byte words j, j + G, j + 2G, ...: the G lanes' words are
      // contiguous, so a warp's read is conflict-free. v5/v6 gave lane j words j * PER / 4 + i, 128 bytes
      // apart: every bank held G of the addresses (ncu: 16 wavefronts per LDS.128 instead of 4, the
      // bound's short-scoreboard stalls were 14% of all samples at 1x15 K = 16).
      const uint4* g4 = reinterpret_cast<const uint4*>(sm.gmax) + (SB ? (lane & (G - 1)) : (lane & (G - 1)) * (PER / 4));
      int ge0 = 0, ge1 = 0, ge2 = 0, ge3 = 0;  // four independent chains
#pragma unroll 4
      for (int i = 0; i < PER / 4; ++i) {  // (unrolled fully, ptxas spills at 64 registers)
        const uint4 v = g4[SB ? i * G : i];
        ge0 += int(v.x >= mine);
        ge1 += int(v.y >= mine);
        ge2 += int(v.z >= mine);
        ge3 += int(v.w >= mine);
      }
      int ge = ge0 + ge1 + ge2 + ge3;
#pragma unroll
      for (int o = 1; o < G; o <<= 1) ge += __shfl_xor_sync(0xffffffffu, ge, o);
      enough = ge >= k;
      if (RW) {
        // v11: this warp's largest group maximum with m = ceil(k / cluster) groups at or above it, to every CTA of the
        // cluster (lane o to CTA o; its own by a plain store, read after barrier 2).
        const uint32_t qm = __reduce_max_sync(0xffffffffu, ge >= (k + cluster - 1) / cluster ? mine : 0u);
        const int ml = v4_lane_again();
        if (ml == c) sm.rbw[c][warp] = qm;
        else if (ml < cluster) v4_st_async(&sm.rbw[c][warp], unsigned(ml), qm, &sm.mbar2);
      }
    }
    const uint32_t q = __reduce_max_sync(0xffffffffu, enough ? mine : 0u);
    if (lane == 0) sm.red_t[warp] = q;
  } else if (lane == 0) {
    sm.red_t[warp] = 0u;
  }
  if (RW && warp == WARPS - 1) {  // v11: the last warp (no count) sends 0
    const int ml = v4_lane_again();
    if (ml == c) sm.rbw[c][warp] = 0u;
    else if (ml < cluster) v4_st_async(&sm.rbw[c][warp], unsigned(ml), 0u, &sm.mbar2);
  }
  if (!(RB && k > 1) && warp == WARPS - 1) {
    // This CTA's (reference, sum) into CTA 0's part[c] (truncated profiles keep it here).
    const float2 part = cta_partial();
    if (a2a && STOP != 3 && STOP != 4) {
      // v9: lane o sends the partial to CTA o (its own: a plain store). Lane 0's copy: cta_partial's sum is
      // complete only in lanes < WARPS (4 at the emulator's 128 threads).
      const float2 p0 = make_float2(__shfl_sync(0xffffffffu, part.x, 0), __shfl_sync(0xffffffffu, part.y, 0));
      if (lane == c) sm.part[c] = p0;
      else if (lane < cluster) v4_st_async(&sm.part[c], unsigned(lane), p0, &sm.mbar);
      if (lane == 0) sm.bad = part.y != part.y;
    } else if (lane == 0) {
      if (STOP == 3 || STOP == 4) sm.part[c] = part;
      else if (ASYNC && c != 0) v4_st_async(&sm.part[c], 0u, part, &sm.mbar);
      else *v4_map_rank(&sm.part[c], 0u) = part;
      sm.bad = part.y != part.y;
    }
  }
  if (!(RB && k > 1)) {
    __syncthreads();
    DDTREE_V4_MARK(4);
    bad = sm.bad;
    if (STOP == 3) {
      if (RW) {  // v11: the other CTAs' row-bound values land before this CTA exits
        if (tid == 0) v4_mbar_arrive_expect(&sm.mbar2, 4u * unsigned(WARPS * (cluster - 1)));
        v4_mbar_wait0(&sm.mbar2);
      }
      if (tid == 0) sink(sm.part[c].y + float(sm.red_t[1]));
      return;
    }
  }

  if (!bad) {  // NaN/+inf slice: CTA 0 writes NaN rows; nothing to select
#include "ddtree/kernels/draft_topk_lse_v4/kernel_candidates.inc"
  } else if (ASYNC && (c != 0 || a2a)) {
    // NaN/+inf slice: CTA 0 (a2a: every other CTA, CTA 0's slice included) still counts this CTA's item bytes.
    if (RW) {  // v11: the other CTAs' row-bound values land before this CTA may exit
      if (tid == 0) v4_mbar_arrive_expect(&sm.mbar2, 4u * unsigned(WARPS * (cluster - 1)));
      v4_mbar_wait0(&sm.mbar2);
    }
    for (int r = tid; r < kc; r += THREADS) {
      if (a2a) {
        for (int o = 0; o < cluster; ++o)
          if (o != c) v4_st_async(&sm.slot[c][r ^ c], unsigned(o), 0ull, &sm.mbar);
      } else {
        v4_st_async(&sm.slot[c][r], 0u, 0ull, &sm.mbar);
      }
    }
  }
  if (ASYNC) {
    DDTREE_V4_MARK(6);
    if (c != 0 && !a2a) return;  // st.async needs nothing more from the sender
    __syncthreads();     // this CTA's own partial and items (plain stores) are in
    DDTREE_V4_MARK(7);
    v4_mbar_wait0(&sm.mbar);  // every warp reads the others' bytes
    DDTREE_V4_MARK(8);
    if (STOP == 5) return;
  } else {
    v4_cluster_arrive_release();
    v4_cluster_wait();
    if (c != 0) return;
  }

#include "ddtree/kernels/draft_topk_lse_v4/kernel_merge.inc"
#endif
}

}  // namespace kernels
}  // namespace ddtree
