// Tree attention fa3 back end, part 2: the tile visibility words, the fused split merge (last CTA of a
// row tile, v10) and the in-cluster split merge.
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

// Fused split merge (v10, opt-in: DDTREE_TA_FA3_FUSED_MERGE=1; fused_merge, 2 <= nact <= MAX_FUSED_SPLITS),
// run by the 256 consumer threads of every CTA of a split row tile. Replaces the merge kernel (its
// launch, and the wait for the whole fa3 grid before it): the last CTA of the row tile to finish merges
// it. Measured slower than the merge kernel on the H200 (one SM reads (nact - 1) x 64 KB), hence opt-in.
// 1. Thread 128 takes a ticket (relaxed atomic add of 1 on the row tile's counter) while every consumer
//    thread stores its partials, whether or not its CTA turns out to merge (the ticket's latency hides
//    behind the stores). Layout, fragment order: float4 i < 16 of consumer thread (cw, lane) holds
//    acc[i][0..3] at part_o4[slot][(cw * 16 + i) * 32 + lane], so a warp stores (and the merging CTA
//    loads) 512 contiguous bytes per instruction; the row pair's (m0, m1, l0, l1) of quad g4 of warp cw
//    sits at part_ml4[slot][cw * 8 + g4].
// 2. The ticket nact - 1 (low 16 bits of the old value) merges; the others publish their partials: CTA
//    barrier, then thread 128 adds 1 << 16 with release semantics (fence.acq_rel.gpu; red.relaxed.gpu).
// 3. The merging CTA's thread 128 spins (ld.acquire.gpu) until the nact - 1 publications are counted,
//    then stores 0: every CTA of the row tile has made its last access to the counter, so the launch
//    leaves it zero for the next one (CUDA-graph replays included). The spin waits only for CTAs that
//    took a ticket, i.e. that are resident and past their main loop, so it cannot deadlock whatever
//    the residency; a watchdog traps after ~2^26 polls, as the mbarrier waits do.
// 4. CTA barrier; every consumer thread merges its own fragment: its own split from registers, the
//    others loaded (ld.global.cg: L2, never a stale L1 line) in two halves of 8 float4 per split.
// The arithmetic is tree_attention_merge_kernel's, operation for operation: mx = max of the splits' m;
// the sum of l_sp * exp2f(m_sp - mx) in that kernel's butterfly order over lanes = splits, which for
// <= 4 splits is (v0 + v2) + (v1 + v3) with v = 0 past nact (x + 0 = x exactly); fmaf(x, exp2f(m_sp -
// mx), sum) in chunk order from 0; the same validity rule, normalization and lse. So both merges give
// the same bits (tests compare them), and a chain still equals causal mode bit for bit.
// Concurrency: two launches that share a workspace must not run at once (as for the partials); a
// workspace must be zero in its counter bytes before its first launch (see tree_attention.h).
__device__ __forceinline__ void fused_merge_epilogue(const Params& p, const float (&acc)[16][4], const float (&m_run)[2],
                                                     const float (&l_run)[2], const unsigned char* s_row_valid,
                                                     volatile int* s_flag, int tid, int cw, int wrow, int g4, int t4,
                                                     int lane, int split, int nact, int64_t slot0, uint32_t* cnt,
                                                     int row0, int rows_b, int t0, int h, int G) {
  using C = Fa3Config;
  constexpr int D = C::D, BM = C::BM, MS = C::MAX_FUSED_SPLITS;
  auto part_o4 = [&](int sp) {
    return reinterpret_cast<float4*>(p.part_o + (slot0 + sp) * BM * D) + cw * 16 * 32 + lane;
  };
  auto part_ml4 = [&](int sp) { return reinterpret_cast<float4*>(p.part_ml + (slot0 + sp) * BM * 2) + cw * 8 + g4; };
  uint32_t ticket = 0;
  if (tid == 128) ticket = atom_add_relaxed_gpu(cnt, 1u);
  {
    float4* po = part_o4(split);
#pragma unroll
    for (int i = 0; i < 16; ++i) __stcg(po + i * 32, make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
    if (t4 == 0) __stcg(part_ml4(split), make_float4(m_run[0], m_run[1], l_run[0], l_run[1]));
  }
  // The ticket is the low half of the old value: the high half counts publications (step 2), and a CTA
  // that finished earlier may already have published when this one takes its ticket.
  if (tid == 128) *s_flag = (ticket & 0xffffu) == static_cast<uint32_t>(nact - 1);
  named_sync(7, 256);  // the flag, and every consumer thread's partial stores before the release below
  if (!*s_flag) {
    if (tid == 128) red_add_release_gpu(cnt, 1u << 16);
    return;
  }
  if (tid == 128) {
    uint32_t n = 0;
    while ((ld_acquire_gpu(cnt) >> 16) != static_cast<uint32_t>(nact - 1))
      if (++n == (1u << 26)) __trap();
    st_relaxed_gpu(cnt, 0u);
  }
  named_sync(7, 256);  // the other CTAs' partials are visible to every consumer thread from here

  float ms[MS][2], ls[MS][2];
#pragma unroll
  for (int sp = 0; sp < MS; ++sp) {
    ms[sp][0] = ms[sp][1] = -INFINITY;
    ls[sp][0] = ls[sp][1] = 0.f;
    if (sp < nact) {
      if (sp == split) {
        ms[sp][0] = m_run[0], ms[sp][1] = m_run[1], ls[sp][0] = l_run[0], ls[sp][1] = l_run[1];
      } else {
        const float4 t = __ldcg(part_ml4(sp));
        ms[sp][0] = t.x, ms[sp][1] = t.y, ls[sp][0] = t.z, ls[sp][1] = t.w;
      }
    }
  }
  float w[MS][2], inv[2], mx[2], lsum[2];
  bool valid[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float m = -INFINITY;
#pragma unroll
    for (int sp = 0; sp < MS; ++sp)
      if (sp < nact) m = fmaxf(m, ms[sp][hf]);
    float v[MS];
#pragma unroll
    for (int sp = 0; sp < MS; ++sp) {
      v[sp] = 0.f;
      if (m != -INFINITY && sp < nact) v[sp] = fmaf(ls[sp][hf], exp2f(ms[sp][hf] - m), 0.f);
      w[sp][hf] = exp2f(ms[sp][hf] - m);  // read only when the row is valid (then m is finite)
    }
    static_assert(MS == 4, "the butterfly order below is the merge kernel's for <= 4 splits");
    const float l = (v[0] + v[2]) + (v[1] + v[3]);
    const int lr = wrow + g4 + 8 * hf;
    valid[hf] = l > 0.f && (s_row_valid[lr] | s_row_valid[BM + lr]);
    inv[hf] = valid[hf] ? 1.f / l : 0.f;
    mx[hf] = m;
    lsum[hf] = l;
  }
  __nv_bfloat16* orow[2];
  bool live[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int gr = row0 + wrow + g4 + 8 * hf;
    live[hf] = gr < rows_b;
    const int64_t qrow =
        live[hf] ? static_cast<int64_t>(t0 + gr / G) * p.hq + static_cast<int64_t>(h) * G + gr % G : 0;
    orow[hf] = p.o + qrow * D + 2 * t4;
    if (live[hf] && p.lse && t4 == 0)
      p.lse[qrow] = valid[hf] ? (mx[hf] + log2f(lsum[hf])) * 0.69314718055994531f : -INFINITY;
  }
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {  // columns 64 * hh .. + 63: 8 float4 per split in flight
    float4 x[MS][8];
#pragma unroll
    for (int sp = 0; sp < MS; ++sp)
      if (sp < nact && sp != split) {
        const float4* src = part_o4(sp) + hh * 8 * 32;
#pragma unroll
        for (int i = 0; i < 8; ++i) x[sp][i] = __ldcg(src + i * 32);
      }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int j = hh * 8 + i;
      float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma unroll
      for (int sp = 0; sp < MS; ++sp) {
        if (sp >= nact) break;
        const float4 xv = sp == split ? make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]) : x[sp][i];
        s0 = fmaf(xv.x, w[sp][0], s0);
        s1 = fmaf(xv.y, w[sp][0], s1);
        s2 = fmaf(xv.z, w[sp][1], s2);
        s3 = fmaf(xv.w, w[sp][1], s3);
      }
      if (live[0])
        *reinterpret_cast<uint32_t*>(orow[0] + j * 8) =
            pack_bf16(valid[0] ? s0 * inv[0] : 0.f, valid[0] ? s1 * inv[0] : 0.f);
      if (live[1])
        *reinterpret_cast<uint32_t*>(orow[1] + j * 8) =
            pack_bf16(valid[1] ? s2 * inv[1] : 0.f, valid[1] ? s3 * inv[1] : 0.f);
    }
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

// The epilogue of one split of a split request (merged by the merge kernel): unnormalized O and (m, l)
// in fp32 into the partial buffers, through L2.
__device__ __forceinline__ void fa3_store_partials(const Params& p, const float (&acc)[16][4], const float (&m_run)[2],
                                                   const float (&l_run)[2], int wrow, int g4, int t4, int b, int h,
                                                   int rt, int split) {
  using C = Fa3Config;
  constexpr int D = C::D, BM = C::BM;
  const int64_t slot = ((static_cast<int64_t>(b) * p.hkv + h) * p.row_tiles + rt) * p.num_splits + split;
  float* po = p.part_o + slot * BM * D;
  float* pml = p.part_ml + slot * BM * 2;
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int lr = wrow + g4 + 8 * hf;
#pragma unroll
    for (int j = 0; j < C::DT8; ++j)
      __stcg(reinterpret_cast<float2*>(po + lr * D + j * 8 + 2 * t4), make_float2(acc[j][2 * hf], acc[j][2 * hf + 1]));
    if (t4 == 0) __stcg(reinterpret_cast<float2*>(pml + lr * 2), make_float2(m_run[hf], l_run[hf]));
  }
}

}  // namespace tree_attn
}  // namespace ddtree
