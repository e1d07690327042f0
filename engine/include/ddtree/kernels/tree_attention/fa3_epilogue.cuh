// Tree attention fa3 back end, part 2: the tile visibility words and the in-cluster split merge.
// Overview in ../tree_attention_fa3.cuh.
#pragma once

#include "ddtree/kernels/tree_attention/fa3_config.cuh"

namespace ddtree {
namespace tree_attn {

// Visibility of the 128 keys kt .. kt+127 to one query row, as 4 words (bit c of word c/32 = key
// kt + c): a committed key (j = kt + c - ctx < 0), or tree node j < n_b whose bit is set in the row
// (causal, anc_row == nullptr: j <= node). The same bits as visible_bits(), but the (at most five)
// words of the row are loaded together, without a loop, so their latencies overlap.
__device__ __forceinline__ void tile_visibility(uint32_t (&win)[4], const uint32_t* anc_row, bool live, int node,
                                                int kt, int ctx, int n_b) {
  const int j0 = kt - ctx;  // > -BN: only tiles that reach past ctx are masked
  if (!live) {
#pragma unroll
    for (int k = 0; k < 4; ++k) win[k] = 0u;
    return;
  }
  if (anc_row == nullptr) {  // causal: keys with j <= node, i.e. columns c < node - j0 + 1
    const int nc = min(max(node - j0 + 1, 0), 128);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int m = min(max(nc - 32 * k, 0), 32);
      win[k] = m >= 32 ? ~0u : ((1u << m) - 1u);
    }
    return;
  }
  const int wlo = (j0 >= 0 ? j0 : j0 - 31) / 32;  // floor(j0 / 32), >= -4
  const int sh = j0 - 32 * wlo;                   // 0..31
  const int nbw = (n_b + 31) / 32;                // words holding nodes < n_b (>= 1)
  uint32_t wv[5];
#pragma unroll
  for (int k = 0; k < 5; ++k) {
    const int w = wlo + k;
    const uint32_t x = __ldg(anc_row + min(max(w, 0), nbw - 1));
    const int rem = n_b - 32 * w;  // nodes of word w that exist
    const uint32_t keep = (w < 0 || rem <= 0) ? 0u : (rem >= 32 ? ~0u : ((1u << rem) - 1u));
    wv[k] = x & keep;
  }
  const int nc = min(max(-j0, 0), 128);  // committed columns c < -j0
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int m = min(max(nc - 32 * k, 0), 32);
    win[k] = __funnelshift_r(wv[k], wv[k + 1], sh) | (m >= 32 ? ~0u : ((1u << m) - 1u));
  }
}

// Split merge inside a cluster (cluster_merge, nact > 1), run by the 256 consumer threads of each CTA:
// 1. both consumer warpgroups are past their last GEMM (named barrier 6), so Q and the K stages at the
//    start of shared memory are dead: each thread stores its unnormalized O and, per row, (m, l);
// 2. cluster barrier: every CTA's partials are visible cluster-wide;
// 3. CTA `rank` merges rows rank, rank + ns, ...: one warp per row, lane = 4 output columns, the
//    partials of splits 0 .. nact-1 read from the CTAs' shared memory;
// 4. cluster barrier: no CTA exits (freeing its shared memory) while another still reads it.
// The arithmetic is tree_attention_merge_kernel's, operation for operation (max and sum butterflies
// over lanes = splits, exp2f weights, fmaf in chunk order, the same validity rule), so a row's bits do
// not depend on which of the two merges ran.
__device__ __forceinline__ void cluster_merge_epilogue(const Params& p, uint32_t q_s, const float (&acc)[16][4],
                                                       const float (&m_run)[2], const float (&l_run)[2],
                                                       const unsigned char* s_row_valid, int wg, int wrow, int g4,
                                                       int t4, int lane, int warp, int rank, int nact, int row0,
                                                       int rows_b, int t0, int h, int G) {
  using C = Fa3Config;
  constexpr int D = C::D, BM = C::BM;
  named_sync(6, 256);
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int lr = wrow + g4 + 8 * hf;
    const uint32_t row_s = q_s + (lr * C::PART_PITCH + 2 * t4) * 4;
#pragma unroll
    for (int j = 0; j < C::DT8; ++j) st_shared_f2(row_s + j * 32, acc[j][2 * hf], acc[j][2 * hf + 1]);
    if (t4 == 0) st_shared_f2(q_s + C::PART_ML_OFF + lr * 8, m_run[hf], l_run[hf]);
  }
  cluster_sync_all();
  const int ns = p.num_splits;
  const int cw = (wg - 1) * 4 + warp;  // consumer warp 0..7
  for (int lr = rank + ns * cw; lr < BM; lr += ns * 8) {
    const int gr = row0 + lr;
    if (gr >= rows_b) break;  // warp-uniform; later rows are larger
    const uint32_t ml_addr = q_s + C::PART_ML_OFF + lr * 8;
    const uint32_t o_addr = q_s + (lr * C::PART_PITCH + lane * 4) * 4;
    float2 ml_lane = make_float2(-INFINITY, 0.f);
    if (lane < nact) ml_lane = ld_cluster_f2(cluster_map(ml_addr, lane));
    float4 x[C::MAX_CLUSTER];
#pragma unroll
    for (int sp = 0; sp < C::MAX_CLUSTER; ++sp)
      x[sp] = sp < nact ? ld_cluster_f4(cluster_map(o_addr, sp)) : make_float4(0.f, 0.f, 0.f, 0.f);
    float mx = -INFINITY;
    if (lane < nact) mx = fmaxf(mx, ml_lane.x);
#pragma unroll
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float lsum = 0.f;
    if (mx != -INFINITY) {
      if (lane < nact) lsum += ml_lane.y * exp2f(ml_lane.x - mx);
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) lsum += __shfl_xor_sync(0xffffffffu, lsum, o);
    const bool valid = lsum > 0.f && (s_row_valid[lr] | s_row_valid[BM + lr]);
    const float inv = valid ? 1.f / lsum : 0.f;
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    if (valid) {
#pragma unroll
      for (int sp = 0; sp < C::MAX_CLUSTER; ++sp) {
        if (sp >= nact) break;
        const float wt = exp2f(__shfl_sync(0xffffffffu, ml_lane.x, sp) - mx);
        sum.x = fmaf(x[sp].x, wt, sum.x);
        sum.y = fmaf(x[sp].y, wt, sum.y);
        sum.z = fmaf(x[sp].z, wt, sum.z);
        sum.w = fmaf(x[sp].w, wt, sum.w);
      }
    }
    const int64_t qrow = static_cast<int64_t>(t0 + gr / G) * p.hq + static_cast<int64_t>(h) * G + gr % G;
    const uint2 packed = make_uint2(pack_bf16(valid ? sum.x * inv : 0.f, valid ? sum.y * inv : 0.f),
                                    pack_bf16(valid ? sum.z * inv : 0.f, valid ? sum.w * inv : 0.f));
    *reinterpret_cast<uint2*>(p.o + qrow * D + lane * 4) = packed;
    if (p.lse && lane == 0) p.lse[qrow] = valid ? (mx + log2f(lsum)) * 0.69314718055994531f : -INFINITY;
  }
  cluster_sync_relaxed();
}

}  // namespace tree_attn
}  // namespace ddtree
