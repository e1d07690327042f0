// Tree attention fa3 back end: a consumer warpgroup's per-tile steps (the GEMM issues, the mask and
// online softmax of S, P as bf16, the rescale of O), each called from a lambda of the kernel.
// Overview in ../tree_attention_fa3.cuh.
#pragma once

#include "ddtree/kernels/tree_attention/fa3_epilogue.cuh"

namespace ddtree {
namespace tree_attn {

// S = Q K^T of one tile into s (K stage at ks; dq0: this consumer's Q descriptor).
__device__ __forceinline__ void fa3_issue_s(float (&s)[Fa3Config::NT8][4], uint64_t dq0, uint32_t ks) {
  constexpr int D = Fa3Config::D, BN = Fa3Config::BN, BM = Fa3Config::BM;
  const uint64_t dk0 = wg_desc(ks, 16);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t koff = (kk & 3) << 5;
    wg_qk(s, dq0 + (((kk >> 2) * BM * 128 + koff) >> 4), dk0 + (((kk >> 2) * BN * 128 + koff) >> 4), kk > 0);
  }
}

// O += P V of one tile (V stage at vs; P in registers as bf16 pairs).
__device__ __forceinline__ void fa3_issue_pv(float (&acc)[Fa3Config::DT8][4], uint32_t (&pa)[Fa3Config::BN / 16][4],
                                             uint32_t vs) {
  constexpr int BN = Fa3Config::BN;
  const uint64_t dv0 = wg_desc(vs, BN * 128);
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) wg_pv(acc, pa[kk], dv0 + ((kk * 16 * 128) >> 4));
}

// P (the softmax's s) as the bf16 A operand of P V.
__device__ __forceinline__ void fa3_pack_p(uint32_t (&pa)[Fa3Config::BN / 16][4], const float (&s)[Fa3Config::NT8][4]) {
  constexpr int BN = Fa3Config::BN;
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk) {
    pa[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// The visibility words of this thread's two rows for tile kt (only tiles reaching past ctx are masked).
__device__ __forceinline__ void fa3_load_vis(uint32_t (&vis)[2][4], const uint32_t* const (&rowp)[2],
                                             const bool (&live)[2], const int (&node_of)[2], int kt, int ctx, int n_b) {
  if (kt + Fa3Config::BN > ctx) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) tile_visibility(vis[hf], rowp[hf], live[hf], node_of[hf], kt, ctx, n_b);
  }
}

// One tile's mask (tiles reaching past ctx: the visibility words vis, loaded before the wait for S) and
// online softmax of s in place: updates m_run and l_run, sets corr (the rows' rescale of O).
__device__ __forceinline__ void fa3_softmax(const Params& p, float (&s)[Fa3Config::NT8][4], const uint32_t (&vis)[2][4],
                                            float (&m_run)[2], float (&l_run)[2], float (&corr)[2], int kt, int ctx,
                                            int t4) {
  using C = Fa3Config;
  constexpr int BN = C::BN;
#if DDTREE_TA_FA3_PROBE & 1
  corr[0] = corr[1] = 1.f;  // diagnostic: no softmax at all (see fa3_config.cuh)
  return;
#endif
  if (kt + BN > ctx) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      uint32_t wt[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) wt[k] = vis[hf][k] >> (2 * t4);  // column 8*jj + 2*t4 + e -> bit 8*jj + e
#pragma unroll
      for (int jj = 0; jj < C::NT8; ++jj)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (!((wt[jj >> 2] >> (8 * (jj & 3) + e)) & 1u)) s[jj][2 * hf + e] = -INFINITY;
    }
  }
  // Row max and row sum in four independent partials per row (a single accumulator makes each a
  // 32-deep chain of dependent instructions; the max is exact in any order, the sum's order is
  // fixed, so results still depend only on the data).
  float mx[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float m4[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) m4[q] = fmaxf(s[q][2 * hf], s[q][2 * hf + 1]);
#pragma unroll
    for (int j = 4; j < C::NT8; ++j) m4[j & 3] = fmaxf(m4[j & 3], fmaxf(s[j][2 * hf], s[j][2 * hf + 1]));
    mx[hf] = fmaxf(fmaxf(m4[0], m4[1]), fmaxf(m4[2], m4[3]));
  }
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 2));
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const float m_old = m_run[hf];
#if DDTREE_TA_FA3_RESCALE_TH > 0
    // s11 (opt-in build): the running max moves only when the tile's max exceeds it by more than
    // 2^TH (FA4's lazy rescale). The softmax is exact for any reference value m as long as O, l and lse
    // use the same m; p = 2^(x - m) <= 2^TH stays far from bf16 / fp32 limits. So corr == 1 on almost
    // every tile after the first and fa3_rescale's warp vote skips the 64 FMULs. Other bits than the
    // default (P is rounded to bf16 at another scale). A row still at -inf takes any finite max
    // (inf > TH); an all-masked tile gives NaN > TH == false and keeps -inf.
    const float m_cand = fmaxf(m_old, mx[hf] * p.scale_log2);
    const float m_new = m_cand - m_old > static_cast<float>(DDTREE_TA_FA3_RESCALE_TH) ? m_cand : m_old;
#else
    const float m_new = fmaxf(m_old, mx[hf] * p.scale_log2);
#endif
    const float cr = m_old == -INFINITY ? 0.f : ex2(m_old - m_new);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    m_run[hf] = m_new;
    corr[hf] = cr;
    float r4[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < C::NT8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float pe = ex2(fmaf(s[j][2 * hf + e], p.scale_log2, -m_use));
        s[j][2 * hf + e] = pe;
        r4[j & 3] += pe;
      }
    l_run[hf] = l_run[hf] * cr + ((r4[0] + r4[1]) + (r4[2] + r4[3]));
  }
}

// O *= corr per row. Multiplying by exactly 1 changes no bits; skipped when no row of the warp moved
// (warp-uniform, so the warp stays converged for the wgmma that follows).
__device__ __forceinline__ void fa3_rescale(float (&acc)[Fa3Config::DT8][4], const float (&corr)[2]) {
  if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
    for (int j = 0; j < Fa3Config::DT8; ++j) {
      acc[j][0] *= corr[0];
      acc[j][1] *= corr[0];
      acc[j][2] *= corr[1];
      acc[j][3] *= corr[1];
    }
  }
}

}  // namespace tree_attn
}  // namespace ddtree
