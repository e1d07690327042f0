// Tree attention, part 4: the merge kernel that combines the fp32 chunk partials in chunk order.
// Overview in ../tree_attention.cuh.
#pragma once

#include "ddtree/kernels/tree_attention/common.cuh"

// Phase trace of the merge kernel (the trace build of src/tree_attention.cu defines it: per CTA, entry,
// the PDL wait's return and the end; bench/profile/fa3_trace.py). A no-op otherwise.
#ifndef DDTREE_TA_MERGE_TRACE
#define DDTREE_TA_MERGE_TRACE(tag) ((void)0)
#endif

namespace ddtree {
namespace tree_attn {

// One warp per (request, kv head, row): combines the chunk partials in chunk order. Rows whose
// request needed a single chunk were written by the main kernel and are skipped here.
// kEarlyTrigger (v18, session 10): griddepcontrol.launch_dependents at entry, so that a next kernel
// launched with PDL (the next layer's fa3 kernel) may start its CTAs, and its prologue, while this grid
// drains; it still waits for this grid's completion before it reads anything this grid wrote. Without
// it, the next grid launches only once every CTA of this one has exited.
template <int D, int BM, bool kEarlyTrigger = false>
__global__ void __launch_bounds__(128) tree_attention_merge_kernel(const Params p) {
  constexpr int kWarps = 4;
  const int lane = threadIdx.x & 31;
  const int b = blockIdx.z, h = blockIdx.y;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);  // row within (b, h)
  if constexpr (kEarlyTrigger) ddtree::kernels::pdl_launch_dependents();
  DDTREE_TA_MERGE_TRACE(0);
  // Every CTA executes griddepcontrol.wait before it exits, also a CTA with nothing to merge (session 12, s12pdl):
  // a PDL grid whose CTAs all exit without waiting can complete before the fa3 grid it depends on, and then the
  // next kernel's wait (which covers only its own predecessor, this grid) no longer covers fa3's writes. Before
  // this, every CTA exited here whenever no request needed a second chunk (short contexts, a plan sized by capacity).
  const int t0 = p.qo_indptr[b];
  const int n_b = max(0, min(min(p.qo_indptr[b + 1], p.num_tokens) - t0, p.n_max));
  const int G = p.group;
  if (row >= n_b * G) {
    ddtree::kernels::pdl_wait();
    return;
  }
  const int ctx = max(p.ctx_len[b], 0);
  const int kv_len = min(ctx + n_b, p.max_pages * p.page_size);
  const int nact = (kv_len + p.chunk - 1) / p.chunk;
  if (nact <= 1) {
    ddtree::kernels::pdl_wait();
    return;
  }
  const int rt = row / BM, lr = row % BM;
  const int node = row / G;
  // The row's validity does not depend on the partials, so it is decided before the wait for the
  // main kernel (with PDL this overlaps its tail): one ancestor word per lane, any set bit of a node
  // < n_b (the same answer as row_is_valid).
  bool has_bit = p.anc == nullptr;
  if (!has_bit) {
    const uint32_t* arow = p.anc + (static_cast<int64_t>(b) * p.n_max + node) * p.words;
    for (int w0 = 0; w0 * 32 < n_b && !has_bit; w0 += 32) {  // warp-uniform
      const int w = w0 + lane;
      uint32_t word = 0u;
      if (w * 32 < n_b) {
        word = __ldg(arow + w);
        const int rem = n_b - w * 32;
        if (rem < 32) word &= (1u << rem) - 1u;
      }
      has_bit = __any_sync(0xffffffffu, word != 0u);
    }
  }
  // Launched with programmatic dependent launch after the fa3 kernel (a no-op otherwise): the partials
  // are that kernel's output, so wait for its completion and memory before reading them.
  ddtree::kernels::pdl_wait();
  DDTREE_TA_MERGE_TRACE(1);
  const int64_t slot0 = ((static_cast<int64_t>(b) * p.hkv + h) * p.row_tiles + rt) * p.num_splits;
  const float* ml = p.part_ml + slot0 * BM * 2 + lr * 2;
  const float* po = p.part_o + slot0 * BM * D + lr * D;

  // Every load the row needs from the first splits goes out at once (one L2 round trip instead of
  // three dependent ones): (max, sum) of split `lane`, and this lane's first O columns of splits 0-3.
  // The arithmetic below is unchanged (same values, same order), so the results are the same bits.
  float2 ml_lane = make_float2(-INFINITY, 0.f);
  if (lane < nact) ml_lane = __ldcg(reinterpret_cast<const float2*>(ml + static_cast<int64_t>(lane) * BM * 2));
  float4 x_pre[4];
#pragma unroll
  for (int u = 0; u < 4; ++u)
    x_pre[u] = (u < nact && lane < D / 4)
                   ? __ldcg(reinterpret_cast<const float4*>(po + static_cast<int64_t>(u) * BM * D) + lane)
                   : make_float4(0.f, 0.f, 0.f, 0.f);
  // m of split sp (< nact): from lane sp's load when sp < 32 (warp-uniform sp).
  auto m_of = [&](int sp) {
    return sp < 32 ? __shfl_sync(0xffffffffu, ml_lane.x, sp) : __ldcg(ml + static_cast<int64_t>(sp) * BM * 2);
  };

  float mx = -INFINITY;
  if (lane < nact) mx = fmaxf(mx, ml_lane.x);
  for (int sp = lane + 32; sp < nact; sp += 32) mx = fmaxf(mx, __ldcg(ml + static_cast<int64_t>(sp) * BM * 2));
#pragma unroll
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float lsum = 0.f;
  if (mx != -INFINITY) {
    if (lane < nact) lsum += ml_lane.y * exp2f(ml_lane.x - mx);
    for (int sp = lane + 32; sp < nact; sp += 32) {
      const float2 v = __ldcg(reinterpret_cast<const float2*>(ml + static_cast<int64_t>(sp) * BM * 2));
      lsum += v.y * exp2f(v.x - mx);
    }
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) lsum += __shfl_xor_sync(0xffffffffu, lsum, o);
  const bool valid = lsum > 0.f && has_bit;
  const float inv = valid ? 1.f / lsum : 0.f;
  const int64_t qrow = static_cast<int64_t>(t0 + node) * p.hq + static_cast<int64_t>(h) * G + row % G;
  constexpr int F4 = D / 4 / 32 > 0 ? D / 4 / 32 : 1;  // float4s per lane
  // O columns col4 of split sp: the preloaded ones for f == 0 and sp < 4.
  auto x_of = [&](int f, int col4, int sp) {
    if (f == 0 && sp < 4) return sp == 0 ? x_pre[0] : sp == 1 ? x_pre[1] : sp == 2 ? x_pre[2] : x_pre[3];
    return __ldcg(reinterpret_cast<const float4*>(po + static_cast<int64_t>(sp) * BM * D) + col4);
  };
#pragma unroll
  for (int f = 0; f < F4; ++f) {
    const int col4 = lane + 32 * f;
    if (col4 >= D / 4) break;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    if (valid) {
      int sp = 0;
      for (; sp + 4 <= nact; sp += 4) {  // four splits at a time (loads in flight), summed in chunk order
        float w[4];
        float4 x[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          w[u] = m_of(sp + u);
          x[u] = x_of(f, col4, sp + u);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          const float wt = exp2f(w[u] - mx);
          sum.x = fmaf(x[u].x, wt, sum.x);
          sum.y = fmaf(x[u].y, wt, sum.y);
          sum.z = fmaf(x[u].z, wt, sum.z);
          sum.w = fmaf(x[u].w, wt, sum.w);
        }
      }
      for (; sp < nact; ++sp) {
        const float wt = exp2f(m_of(sp) - mx);
        const float4 x = x_of(f, col4, sp);
        sum.x = fmaf(x.x, wt, sum.x);
        sum.y = fmaf(x.y, wt, sum.y);
        sum.z = fmaf(x.z, wt, sum.z);
        sum.w = fmaf(x.w, wt, sum.w);
      }
    }
    const uint2 packed = make_uint2(pack_bf16(valid ? sum.x * inv : 0.f, valid ? sum.y * inv : 0.f),
                                    pack_bf16(valid ? sum.z * inv : 0.f, valid ? sum.w * inv : 0.f));
    *reinterpret_cast<uint2*>(p.o + qrow * D + col4 * 4) = packed;
  }
  if (p.lse && lane == 0) p.lse[qrow] = valid ? (mx + log2f(lsum)) * 0.69314718055994531f : -INFINITY;
  DDTREE_TA_MERGE_TRACE(2);
}

}  // namespace tree_attn
}  // namespace ddtree
