// draft_topk_lse v4, part 3: the kernel. Overview in ../draft_topk_lse_v4.cuh.
//
// The bodies of the kernel's lambdas live in stages.cuh; the lambdas stay as one-line forwarders, which
// kept the SASS identical on sm_90a and sm_120. Moving inline blocks (CTA 0's merge, tried by value, by
// reference and through a lambda) into functions changed ptxas' register allocation, so the stages without
// a lambda (loads + sums, the k = 1 warp path, the bound, the merge) stay here, one kernel past 500 lines.
// Check per-function SASS before moving more.
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
    uint32_t thr = RB && k > 1 ? thr_rb : 1u;  // key 0 = no logit; 1 admits every valid one
    if (RW) {
      // v11: the last warp waits for every warp value of every other CTA (sent before barrier 2; a NaN/+inf CTA's
      // values are sent too: its row is written as NaN whatever the bound) and forms this CTA's bound: v9's (the
      // largest of the warps' red_t) raised to the row bound R = the smallest over the CTAs of the largest of their
      // warps' values (lane l reads 4 values of CTA l / LPC, LPC lanes per CTA), when R is a finite logit. The others
      // read it after one more block barrier (in every warp, beside v9's 16 loads of red_t, ptxas spilled 8-20 bytes).
      if (warp == WARPS - 1) {
        constexpr int LPC = WARPS / 4;
        static_assert(!RW || (WARPS % 4 == 0 && LPC * kV4MaxCluster <= 32), "the row bound's values in one warp");
        const int ml = v4_lane_again();
        if (ml == 0) v4_mbar_arrive_expect(&sm.mbar2, 4u * unsigned(WARPS * (cluster - 1)));
        v4_mbar_wait0(&sm.mbar2);
        DDTREE_V4_MARK(10);
        const int o = ml / LPC;
        uint32_t mo = 0xFFFFFFFFu;
        if (o < cluster) {
          const uint4 w4 = reinterpret_cast<const uint4*>(&sm.rbw[o][0])[ml - o * LPC];
          mo = max(max(w4.x, w4.y), max(w4.z, w4.w));
        }
#pragma unroll
        for (int d = 1; d < LPC; d <<= 1) mo = max(mo, __shfl_xor_sync(0xffffffffu, mo, d));
        const uint32_t rb = __reduce_min_sync(0xffffffffu, mo);
        uint32_t t = 1u;
        if (kc < n_valid) t = __reduce_max_sync(0xffffffffu, ml < WARPS ? sm.red_t[ml] : 0u);
        if (rb > kV4KeyNegInf) t = max(t, rb);  // a finite logit: the lane append's condition holds
        if (ml == 0) sm.thr_s = t;
        if (ml == 0 && rb > kV4KeyNegInf) DDTREE_TOPK_V4_EVENT(row_bound);
      }
      __syncthreads();
      thr = sm.thr_s;
    } else if (!(RB && k > 1) && kc < n_valid) {
#pragma unroll
      for (int w = 0; w < WARPS; ++w) thr = max(thr, sm.red_t[w]);
    }
    // Candidates: keys > thr, and keys == thr except that when thr is -inf's key only the -inf logits of
    // the first kc ids qualify (the slice's best items are its finite logits, then its lowest -inf ids).
    const int id_lim = thr == kV4KeyNegInf ? id0 + kc : 0x7fffffff;
    // v7 (FF): the same test on floats. thr is 1 (admit all) or the key of a logit of this slice (no NaN or
    // +inf: bad slices skip this); key order is float order with -0 == +0, which float compares give too,
    // and thr = 1 becomes -inf with id_lim = INT_MAX (every non-NaN logit passes). v6 converted every
    // logit to its key first (~4 instructions each).
    const float thr_f = key_to_float(max(thr, kV4KeyNegInf));
    auto item_of = [&](float f, int id) -> uint64_t { return v4_item_of(f, id, thr, id_lim); };
    // K = 1, lane-local (v5): only a lane whose maximum reaches thr looks at its vectors again, only at
    // those whose maximum reaches it, and keeps its best admitted item (one atomicMax per such lane).
    // K > 1, warp-uniform (v5): a warp looks at vector j only when one of its lanes' vector j reaches thr;
    // each lane builds the bit mask of its admitted logits without branches, eight independent ballots
    // give every admitted logit its slot, and ONE atomicAdd per (warp, vector) reserves them. v4.1 ran a
    // ballot -> branch -> atomic -> shuffle chain per logit (the hottest stall was the barrier after it);
    // a lane-local append (a scan-aggregated atomic per lane and vector, first v5 try) was slower still.
    if (k == 1) {
      if (tkey >= thr) {
        unsigned long long best = 0ull;
        auto visit = [&](const uint4& v, int lv) { v4_visit_k1<T>(v, lv, v0, nv_cta, vocab, thr, item_of, best); };
        if (rounds == 1) {  // still in registers
#pragma unroll
          for (int j = 0; j < kV4Vecs; ++j) visit(raw[j], j * THREADS + tid);
        } else {
          for (int lv = tid; lv < nv_cta; lv += THREADS) visit(load(lv), lv);
        }
        if (best != 0ull) atomicMax(&sm.best, best);
      }
    } else if (__any_sync(0xffffffffu, tkey >= thr)) {
      // The pass over the vectors with a visit (warp-uniform calls); instantiated once per visit below, so
      // the two visits' live ranges stay apart (one pass with a per-visit branch spilled 4 bytes, sm_90a).
      auto pass = [&](auto visit) {
        if (RV && rounds == 1) {  // one copy of visit (v6): the registers rotate as in the sums
#pragma unroll 1
          for (int j = 0; j < kV4Vecs; ++j) {
            const uint4 v = raw[0];
#pragma unroll
            for (int i = 0; i + 1 < kV4Vecs; ++i) raw[i] = raw[i + 1];
            raw[kV4Vecs - 1] = v;
            visit(v, j * THREADS + tid);
          }
        } else if (RV) {
#pragma unroll 1
          for (int lj = 0; lj < rounds * kV4Vecs; ++lj) {
            const int lv = lj * THREADS + tid;
            visit(lv < nv_cta && tkey >= thr ? load(lv) : v4_neg_inf_vec<T>(), lv);
          }
        } else if (rounds == 1) {
#pragma unroll
          for (int j = 0; j < kV4Vecs; ++j) visit(raw[j], j * THREADS + tid);
        } else if (BR) {
          // v7: a round's vectors are loaded together, then visited (v6 issued each L2 load right before its
          // visit, behind the previous visit's shared atomic: one L2 latency per vector, 6.4 µs at 8x15 K = 16).
          const bool want = tkey >= thr;
          for (int r = 0; r < rounds; ++r) {
            // v9 (A2A): reloaded into raw (dead here: a k > 1 pass over two or more rounds): a separate array
            // spilled 8 bytes beside the all-to-all merge (sm_90a).
            uint4 vloc[kV4Vecs];
            uint4(&v)[kV4Vecs] = (OPT & kV4OptA2AMerge) != 0u ? raw : vloc;
#pragma unroll
            for (int j = 0; j < kV4Vecs; ++j) {
              const int lv = (r * kV4Vecs + j) * THREADS + tid;
              v[j] = v4_neg_inf_vec<T>();
              if (want && lv < nv_cta) v[j] = fast ? __ldg(reinterpret_cast<const uint4*>(x) + (v0 + lv)) : load(lv);
            }
#pragma unroll
            for (int j = 0; j < kV4Vecs; ++j) visit(v[j], (r * kV4Vecs + j) * THREADS + tid);
          }
        } else {
          for (int r = 0; r < rounds; ++r) {
#pragma unroll
            for (int j = 0; j < kV4Vecs; ++j) {
              const int lv = (r * kV4Vecs + j) * THREADS + tid;
              visit(lv < nv_cta && tkey >= thr ? load(lv) : v4_neg_inf_vec<T>(), lv);
            }
          }
        }
      };
      // v8 (LA): a bound above -inf's key is a finite logit (thr_f > -inf): no id limit, -inf never passes.
      if (WA && (rounds == 1 || fast) && thr > kV4KeyNegInf) {
        // v9: a round at a time (v4_append_round); later rounds are reloaded into raw (a separate array
        // spilled, sm_90a), a round's loads issued together; with two or more rounds only where every vector
        // lies inside the row (16-byte loads; the element-wise fallback spilled).
        auto append = [&](int lv0) {
          if (CP) v4_append_round_compact<T, THREADS>(sm, raw, lv0, v0, thr_f);
          else v4_append_round<T, THREADS>(sm, raw, lv0, v0, thr_f);
        };
        if (rounds == 1) {
          append(tid);
        } else {
          const bool want = tkey >= thr;
          for (int r = 0; r < rounds; ++r) {
#pragma unroll
            for (int j = 0; j < kV4Vecs; ++j) {
              const int lv = (r * kV4Vecs + j) * THREADS + tid;
              raw[j] = v4_neg_inf_vec<T>();
              if (want && lv < nv_cta) raw[j] = __ldg(reinterpret_cast<const uint4*>(x) + (v0 + lv));
            }
            append(r * kV4Vecs * THREADS + tid);
          }
        }
      } else if (CC) {  // v13b: the rare passes as a called function
        v4_elementwise_pass<T, VEC, FF, THREADS>(sm, x, v0, nv_cta, vocab, rounds, tkey, thr, thr_f, id_lim);
      } else if (LA && !CP && thr > kV4KeyNegInf) {  // v13: the element-wise pass takes these (rare) cases
        pass([&](const uint4& v, int lv) { v4_append_lane<T, THREADS>(sm, v, lv, v0, thr_f); });
      } else {
        const unsigned lt = (1u << lane) - 1u;
        pass([&](const uint4& v, int lv) {
          v4_append_candidates<T, FF, THREADS>(sm, v, lv, v0, nv_cta, vocab, thr, thr_f, id_lim, lane, lt);
        });
      }
    }
    __syncthreads();
    DDTREE_V4_MARK(5);
    if (STOP == 4) {
      if (tid == 0) sink(float(sm.cnt) + float(sm.best & 1u));
      return;
    }
    uint64_t* slot = v4_map_rank(&sm.slot[c][0], 0u);  // CTA 0's slot for this CTA's items
    auto put = [&](int r, uint64_t it) {
      if (a2a) {
        // v9: into every CTA's slot for this CTA, swizzled (item r at r ^ c); its own by a plain store.
        const int at = r ^ c;
        for (int o = 0; o < cluster; ++o) {
          if (o == c) sm.slot[c][at] = it;
          else v4_st_async(&sm.slot[c][at], unsigned(o), it, &sm.mbar);
        }
      } else if (ASYNC && c != 0) {
        v4_st_async(&sm.slot[c][r], 0u, it, &sm.mbar);
      } else {
        slot[r] = it;
      }
    };
    if (k == 1) {  // one exact candidate whatever the ties: never overflows
      if (tid == 0) put(0, sm.best);
    } else {
      int n = sm.cnt;
      if (n > kV4Cap) {
        if (tid == 0) DDTREE_TOPK_V4_EVENT(cta_radix);
        if (CC) {  // v13b: a called function
          v4_radix_fallback<T, VEC, THREADS>(sm, x, v0, nv_cta, vocab, kc, thr, id_lim);
          n = kc;
        }
        // Tie-heavy slice: exact top-kc by radix select over the (re-read) admitted items.
        auto for_each = [&](auto f) {
          for (int lv = tid; lv < nv_cta; lv += THREADS) {
            const uint4 v = load(lv);
            const int base = (v0 + lv) * VN;
            if (CP) {  // v13: one copy of the element's code (the radix fallback runs on tie-heavy slices only)
#pragma unroll 1
              for (int q = 0; q < VN; ++q) f(base + q < vocab ? item_of(v4_elem<T>(v, q), base + q) : 0ull);
            } else {
#pragma unroll
              for (int q = 0; q < VN; ++q) f(base + q < vocab ? item_of(v4_elem<T>(v, q), base + q) : 0ull);
            }
          }
        };
        uint64_t prefix, mask;
        if (!CC) {
        block_select_top<THREADS>(for_each, kc, sm.sel, prefix, mask);
        if (tid == 0) sm.cnt = 0;  // every thread read n before block_select_top's barriers
        __syncthreads();
        for_each([&](uint64_t it) {
          if (it != 0ull && (it & mask) >= prefix) sm.cbuf[atomicAdd(&sm.cnt, 1)] = it;  // exactly kc
        });
        __syncthreads();
        n = kc;
        }
      }
      // Ranks by counting (distinct items; the candidates hold the slice's top kc), into CTA 0's slot.
      if (SP) {
        // v10: pair t = 8 p + s (candidate p, lane s of its group; the groups are lane-aligned, the loop bound
        // warp-uniform for the shuffles). Lane s counts candidates s, s + 8, ...: the 8 lanes of a group read 8
        // consecutive items (16 banks) and every group of the warp the same ones (broadcast); session 6's lane
        // ranks read contiguous slices, 64 bytes apart, and measured slower. Lane s then sends to CTA s.
        for (int t = tid; (t & ~31) < n * 8; t += THREADS) {
          const int p = t >> 3, s = t & 7;
          const bool valid = p < n;
          const uint64_t it = valid ? sm.cbuf[p] : 0ull;
          int r0 = 0, r1 = 0;
          if (valid) {
            int q = s;
            for (; q + 8 < n; q += 16) {
              r0 += int(sm.cbuf[q] > it);
              r1 += int(sm.cbuf[q + 8] > it);
            }
            if (q < n) r0 += int(sm.cbuf[q] > it);
          }
          int rank = r0 + r1;
          rank += __shfl_xor_sync(0xffffffffu, rank, 1);
          rank += __shfl_xor_sync(0xffffffffu, rank, 2);
          rank += __shfl_xor_sync(0xffffffffu, rank, 4);
          if (valid && rank < kc && s < cluster) {
            const int at = rank ^ c;
            if (s == c) sm.slot[c][at] = it;
            else v4_st_async(&sm.slot[c][at], unsigned(s), it, &sm.mbar);
          }
        }
      } else {
        for (int p = tid; p < n; p += THREADS) {
          const uint64_t it = sm.cbuf[p];
          const int rank = v4_count_greater(sm.cbuf, n, it);
          if (rank < kc) put(rank, it);
        }
        if (RW) {
          // v11: fewer than kc candidates above the row bound: slots [n, kc) of this CTA's list get 0 (below every
          // item) in every CTA, one (slot, CTA) pair per thread; the receivers count 8 bytes per slot.
          if (tid == 0 && n < kc) DDTREE_TOPK_V4_EVENT(row_short);
          for (int t = tid; t < (kc - n) * kV4MaxCluster; t += THREADS) {
            const int r = n + (t >> 3), o = t & (kV4MaxCluster - 1);
            if (o == c) sm.slot[c][r ^ c] = 0ull;
            else if (o < cluster) v4_st_async(&sm.slot[c][r ^ c], unsigned(o), 0ull, &sm.mbar);
          }
        }
      }
    }
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

  // ---- CTA 0: merge (v5). No gather, no second bound, no barrier: every warp computes the row's lse from
  // the partials itself (fp32 terms, two fp64 operations), and every item of every CTA's sorted slot gets
  // its row rank as its index in its own slot plus, for each other CTA, how many of that CTA's items beat
  // it (a branch-free binary search of <= 64 sorted items). v4.1's warp 1 gathered the items above the
  // best CTA's ksel-th one (about 5k of them, not k..2k: the CTAs' ksel-th items are close; 85 at K = 16,
  // 420 at K = 64 on the bench's rows) in a serial loop with an integer division per step, then every
  // thread counted over all of them.
  float* lp_out = top_lp + int64_t(row) * k;
  int32_t* id_out = top_id + int64_t(row) * k;
  const int ksel = min(k, vocab);
  const int ml = v4_lane_again();
  const float2 p = ml < cluster ? sm.part[ml] : make_float2(0.f, 0.f);
  if (__any_sync(0xffffffffu, p.y != p.y)) {  // NaN or +inf in the row
    if (c != 0) return;  // a2a: CTA 0 writes the NaN row
    const float qnan = __int_as_float(0x7fc00000);
    for (int r = tid; r < k; r += THREADS) {
      lp_out[r] = qnan;
      id_out[r] = -1;
    }
    if (tid == 0) {
      lse[row] = qnan;
      raise_flag(flags, 0x1);
    }
    return;
  }
  // lse = (R + log2(sum_c S_c 2^(ref_c - R))) / fl(log2 e): sum_x 2^(x fl(log2 e) - ref) is what the CTAs
  // summed (x fl(log2 e) is exact inside the FMA). The terms in fp32 (MUFU.EX2, 2^-22 relative, as each CTA
  // combines its warps), their sum in fp32 (<= 8 terms), log2 in fp32 (result in [0, 27): <= 2^-20
  // absolute), the last add and scale in fp64.
  const uint32_t kb = __reduce_max_sync(0xffffffffu, p.y != 0.f ? ordered_key(p.x) : 0u);
  const float big = kb == 0u ? -INFINITY : key_to_float(kb);
  const float sf = warp_sum(p.y != 0.f ? p.y * v4_ex2(p.x - big) : 0.f);  // every lane needs it
  const double lse_d =
      big == -INFINITY ? -double(INFINITY) : (double(big) + double(log2f(sf))) * (1.0 / double(kV4Log2e));
  const int step = pv * VN;
  auto n_of = [&](int cc) { return min(k, min(step, vocab - cc * step)); };  // items CTA cc sent (cc < cluster)
  if (SPLIT) {
    // v6: item i of slot cc is index cc * k + i; P lanes (consecutive, P | 32) rank one item, lane p searching
    // the slots o = p, p + P, ... (not its own), then a shuffle sum. P = the largest power of 2 <= 8 with
    // cluster * k * P <= THREADS (K = 16 at 8 CTAs: 4; K = 64: 1). Warp-uniform loop bounds for the shuffles.
    const int items = cluster * k;
    int P = 1;
    while (P < 8 && items * P * 2 <= THREADS) P *= 2;
    for (int t0 = warp * 32; t0 < items * P; t0 += THREADS) {
      const int t = t0 + lane;
      const int item = t / P, p = t - item * P;
      const int cc = item / k, r = item - cc * k;
      const bool valid = t < items * P && r < n_of(cc);
      const uint64_t it = valid ? sm.slot[cc][r] : 0ull;
      int rank = 0;
      if (valid) {
#pragma unroll 1
        for (int o = p; o < cluster; o += P) {
          if (o != cc) rank += v4_count_greater_sorted(&sm.slot[o][0], n_of(o), it);
        }
      }
      for (int d = 1; d < P; d <<= 1) rank += __shfl_xor_sync(0xffffffffu, rank, d);
      rank += r;
      if (valid && p == 0 && rank < ksel) {
        const float f = key_to_float(item_key(it));
        lp_out[rank] = f == -INFINITY ? -INFINITY : float(double(f) - lse_d);
        id_out[rank] = item_id(it);
      }
    }
  }
  if (a2a) {
    // v9: this CTA's own items only, one lane per (item, list) pair.
    using I4 = std::integral_constant<int, 4>;
    using I8 = std::integral_constant<int, 8>;
    using I16 = std::integral_constant<int, 16>;
    using I32 = std::integral_constant<int, 32>;
    using I64 = std::integral_constant<int, 64>;
    // v11: this CTA's list holds min(candidates, kc) items, then zeros (its candidates are above the row bound).
    const int nown = RW ? min(sm.cnt, n_of(c)) : 0;
    auto rank_own = [&](auto maxn_tag, auto lists_tag) {
      v4_rank_own_items<decltype(maxn_tag)::value, decltype(lists_tag)::value, THREADS, RW>(sm, n_of, c, cluster, ksel,
                                                                                          lse_d, lp_out, id_out, nown);
    };
    if (CP) {
      // v13: one instantiation (eight lists, a rolled search of the depth k needs).
      v4_rank_own_items_compact<THREADS, RW>(sm, n_of, c, cluster, k <= 16 ? 16 : k <= 32 ? 32 : 64, ksel, lse_d, lp_out,
                                             id_out, nown);
    } else if (cluster <= 4) {
      if (k <= 16) rank_own(I16{}, I4{});
      else if (k <= 32) rank_own(I32{}, I4{});
      else rank_own(I64{}, I4{});
    } else {
      if (k <= 16) rank_own(I16{}, I8{});
      else if (k <= 32) rank_own(I32{}, I8{});
      else rank_own(I64{}, I8{});
    }
    if (c != 0) {
      DDTREE_V4_MARK(9);
      return;
    }
  }
  if (FM && !SPLIT && !a2a) {
    // v7: items numbered densely (item t = slot cc = t / k, index r = t % k), so at k = 16 four warps hold
    // all 128 of them; each item's row rank is the sum over ALL lists (its own included: r items of its own
    // list beat it) of a branch-free binary search, the lists searched step by step together (eight
    // independent loads per step, seven steps). v6 ran the seven searches one after another, each behind a
    // branch (ncu: ~400 instructions per warp, one long dependent chain).
    int nl[kV4MaxCluster];
#pragma unroll
    for (int o = 0; o < kV4MaxCluster; ++o) nl[o] = o < cluster ? n_of(o) : 0;
    // MAXN >= every list's length, LISTS >= cluster: the searches' steps and lists (SS, v7b: the smallest
    // that fit; else 64 and 8).
    auto rank_items = [&](auto maxn_tag, auto lists_tag) {
      v4_rank_items<decltype(maxn_tag)::value, decltype(lists_tag)::value, THREADS>(sm, nl, n_of, tid, cluster, k, ksel,
                                                                                   lse_d, lp_out, id_out);
    };
    using I4 = std::integral_constant<int, 4>;
    using I8 = std::integral_constant<int, 8>;
    using I16 = std::integral_constant<int, 16>;
    using I32 = std::integral_constant<int, 32>;
    using I64 = std::integral_constant<int, 64>;
    static_assert(kV4MaxK == 64 && kV4MaxCluster == 8, "the short-search cases below");
    if (SS && cluster <= 4) {
      if (k <= 16) rank_items(I16{}, I4{});
      else if (k <= 32) rank_items(I32{}, I4{});
      else rank_items(I64{}, I4{});
    } else if (SS && k <= 16) {
      rank_items(I16{}, I8{});
    } else if (SS && k <= 32) {
      rank_items(I32{}, I8{});
    } else {
      rank_items(I64{}, I8{});
    }
  }
  // (v13: not built beside the all-to-all merge, which never enters it.)
  for (int t = SPLIT || FM || a2a ? cluster * kV4MaxK : tid; !(CP && a2a) && t < cluster * kV4MaxK; t += THREADS) {
    const int cc = t / kV4MaxK, r = t - cc * kV4MaxK;
    if (r >= n_of(cc)) continue;
    const uint64_t it = sm.slot[cc][r];
    int rank = r;
#pragma unroll
    for (int o = 0; o < kV4MaxCluster; ++o) {
      if (o < cluster && o != cc) rank += v4_count_greater_sorted(&sm.slot[o][0], n_of(o), it);
    }
    if (rank < ksel) {
      const float f = key_to_float(item_key(it));
      lp_out[rank] = f == -INFINITY ? -INFINITY : float(double(f) - lse_d);
      id_out[rank] = item_id(it);
    }
  }
  for (int r = ksel + tid; r < k; r += THREADS) {
    lp_out[r] = -INFINITY;
    id_out[r] = -1;
  }
  if (tid == 0) lse[row] = float(lse_d);
  DDTREE_V4_MARK(9);
#endif
}

}  // namespace kernels
}  // namespace ddtree
