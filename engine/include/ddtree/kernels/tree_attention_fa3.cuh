// Tree attention, third back end (sm_90a only): an FA3-style warp-specialized schedule of the same
// math as tree_attention_kernel<WgmmaConfig128> (128 rows x 128-key tiles, D = 128, same row layout,
// masking, plan, partials and merge kernel; see tree_attention.cuh).
//
// Why: the plain wgmma kernel runs S -> softmax -> P.V in lockstep in both warpgroups with one
// __syncthreads per tile, so the tensor cores idle during every softmax (~340 TFLOP/s measured of
// ~800). Here:
// * warpgroup 0 is a producer: its 128 threads gather the paged K/V tiles with cp.async into a
//   3-stage ring (one full and one empty mbarrier per stage) and give back registers (setmaxnreg);
// * warpgroups 1 and 2 are consumers of 64 rows each (Q resident in shared memory). They ping-pong:
//   a named barrier pair lets only one of them issue its GEMMs at a time, so one's softmax overlaps
//   the other's GEMMs;
// * inside a consumer, tile j's S = Q K^T is issued together with tile j-1's O += P V, and tile j's
//   mask + softmax run while P V is still in flight (FA3's intra-warpgroup overlap).
// No __syncthreads in the main loop.
//
// Ordering: cp.async writes are made visible to the tensor cores (async proxy) by the WRITING thread:
// cp.async.wait_group, fence.proxy.async, then mbarrier.arrive (release) on the stage's full barrier;
// consumers wait on it (acquire) and fence once more. A consumer arrives on the stage's empty barrier
// only after wgmma.wait_group says the products that read the stage are complete.
//
// Exactness: tile boundaries, the tile sequence (skipped tree tiles come from a CTA-wide mask that
// both roles compute identically), chunk boundaries and merge order depend only on positions and
// the plan; a masked score is -inf (p = 0); a rescale by exactly 1 is the same bits. So a chain
// bitset equals causal mode bit for bit within this back end. Results differ from the wgmma back
// end only through the summation order inside the tensor cores (none: same tiles) and are expected
// to be identical to it in practice, but that is not promised.
#pragma once

#include "ddtree/kernels/tree_attention.cuh"

namespace ddtree {
namespace tree_attn {

struct Fa3Config {
  static constexpr int D = 128, BN = 128, BM = 128, STAGES = 3;
  static constexpr int NT = 384;  // producer warpgroup + 2 consumer warpgroups
  static constexpr int CPR = D / 8;
  static constexpr int Q_BYTES = BM * D * 2;             // 32 KB
  static constexpr int KV_BYTES = BN * D * 2;            // 32 KB (K or V tile)
  static constexpr int STAGE_BYTES = 2 * KV_BYTES;       // K then V
  static constexpr int SMEM = Q_BYTES + STAGES * STAGE_BYTES + 1024;  // 225 KB incl. swizzle alignment
  static constexpr int NT8 = BN / 8, DT8 = D / 8, VW = BN / 64;
  // 40 x 128 + 232 x 256 = 64512 <= 65536 registers.
  static constexpr int PRODUCER_REGS = 40, CONSUMER_REGS = 232;
};
static_assert(Fa3Config::SMEM + 512 <= 227 * 1024, "sm_90 allows 227 KB of shared memory per block");

// ---- sm_90 synchronization helpers ------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
#endif
}
// Non-blocking: true iff the phase of parity `parity` has completed.
__device__ __forceinline__ bool mbar_test(uint32_t bar, uint32_t parity) {
  uint32_t ok = 1;
#if DDTREE_TA_HAVE_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok)
      : "r"(bar), "r"(parity)
      : "memory");
#endif
  return ok != 0;
}
// Blocking wait with a watchdog: a pipeline bug would otherwise hang the GPU (and every test after it)
// forever. try_wait suspends the thread for a while per attempt, so 2^26 failed attempts are far
// beyond any legitimate wait (the longest is one K/V tile load); the kernel then traps, which the
// launch reports as an error.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile(
      "{\n.reg .pred p;\n.reg .u32 n;\nmov.u32 n, 0;\nTA_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@p bra TA_DONE;\n"
      "add.u32 n, n, 1;\nsetp.lt.u32 p, n, 67108864;\n@p bra TA_WAIT;\ntrap;\nTA_DONE:\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void wg_wait1() {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
#endif
}
template <int R>
__device__ __forceinline__ void regs_dealloc() {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void regs_alloc() {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
// Pin registers that an in-flight wgmma reads or writes: the compiler may not move their other uses
// across this point (CUTLASS's warpgroup_fence_operand).
__device__ __forceinline__ void pin(float (&x)[16][4]) {
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(x[i][j])::"memory");
}
__device__ __forceinline__ void pin(uint32_t (&x)[8][4]) {
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(x[i][j])::"memory");
}

// ex2.approx.ftz: the bare MUFU.EX2 (exp2f adds a denormal range fix-up per element). exp2(-inf) = +0
// exactly, so masked scores still add exactly 0.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ void pin(float (&a)[2], float (&b)[2], float (&c)[2]) {
  asm volatile("" : "+f"(a[0]), "+f"(a[1]), "+f"(b[0]), "+f"(b[1]), "+f"(c[0]), "+f"(c[1])::"memory");
}

__global__ void __launch_bounds__(Fa3Config::NT, 1) tree_attention_fa3_kernel(const Params p) {
#if defined(__CUDA_ARCH__)
#if !DDTREE_TA_HAVE_WGMMA
  __trap();  // the launcher only picks this kernel when the image has sm_90a code
#else
  using C = Fa3Config;
  constexpr int D = C::D, BN = C::BN, BM = C::BM, CPR = C::CPR, ST = C::STAGES;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ unsigned long long s_tile_mask;
  __shared__ unsigned char s_row_valid[BM];
  __shared__ __align__(8) unsigned long long s_full[ST], s_empty[ST];

  const int tid = threadIdx.x;
  const int b = blockIdx.z, h = blockIdx.y;
  const int rt = blockIdx.x % p.row_tiles, split = blockIdx.x / p.row_tiles;

  const int t0 = p.qo_indptr[b];
  const int n_b = max(0, min(min(p.qo_indptr[b + 1], p.num_tokens) - t0, p.n_max));
  const int G = p.group;
  const int rows_b = n_b * G;
  const int row0 = rt * BM;
  if (row0 >= rows_b) return;  // CTA-uniform: before any barrier
  const int ctx = max(p.ctx_len[b], 0);
  const int kv_len = min(ctx + n_b, p.max_pages * p.page_size);
  const int nact = (kv_len + p.chunk - 1) / p.chunk;
  if (split >= nact) return;
  const int c_begin = split * p.chunk, c_end = min(c_begin + p.chunk, kv_len);
  const int tb0 = (ctx / BN) * BN;
  const int* bt = p.block_table + static_cast<int64_t>(b) * p.max_pages;
  const uint32_t* anc_b = p.anc ? p.anc + static_cast<int64_t>(b) * p.n_max * p.words : nullptr;

  // ---- per-row validity and the tree tiles this CTA visits (as in tree_attention_kernel) ----------
  if (tid == 0) {
    s_tile_mask = 0ull;
#pragma unroll
    for (int s = 0; s < ST; ++s) {
      mbar_init(smem_u32(&s_full[s]), 128);   // every producer thread arrives once per fill
      mbar_init(smem_u32(&s_empty[s]), 256);  // every consumer thread arrives once per use
    }
  }
  __syncthreads();
  if (tid < BM) {
    const int r = row0 + tid;
    bool valid = false;
    unsigned long long tiles = 0ull;
    if (r < rows_b) {
      const int node = r / G;
      if (anc_b == nullptr) {
        valid = true;
        for (int j = 0; j <= node; j += 32) {
          const int lo = (ctx + j - tb0) / BN, hi = (ctx + min(j + 31, node) - tb0) / BN;
          tiles |= range64(lo, hi + 1);
        }
      } else {
        const uint32_t* row = anc_b + static_cast<int64_t>(node) * p.words;
        for (int w = 0; w * 32 < n_b; ++w) {
          uint32_t word = __ldg(row + w);
          const int rem = n_b - w * 32;
          if (rem < 32) word &= (1u << rem) - 1u;
          if (!word) continue;
          valid = true;
          const int ta = (ctx + w * 32 - tb0) / BN;
          const int split_bit = (ta + 1) * BN + tb0 - ctx - w * 32;
          const uint32_t low = split_bit >= 32 ? word : (word & ((1u << split_bit) - 1u));
          if (low) tiles |= 1ull << ta;
          if (word & ~low) tiles |= 1ull << (ta + 1);
        }
      }
    }
    s_row_valid[tid] = valid;
    if (tiles) atomicOr(&s_tile_mask, tiles);
  }
  __syncthreads();
  const unsigned long long tile_mask = s_tile_mask;
  auto next_tile = [&](int k0) {
    while (k0 < c_end && k0 >= ctx && !((tile_mask >> ((k0 - tb0) / BN)) & 1ull)) k0 += BN;
    return k0;
  };

  const uint32_t q_s = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t kv_s = q_s + C::Q_BYTES;  // stage s: K at kv_s + s*STAGE_BYTES, V at + KV_BYTES
  const uint32_t full0 = smem_u32(&s_full[0]), empty0 = smem_u32(&s_empty[0]);
  const int wg = tid >> 7;

  if (wg == 0) {
    // =================================== producer ===================================================
    regs_dealloc<C::PRODUCER_REGS>();
    const int ld_c = tid % CPR, ld_r0 = tid / CPR;  // 16-byte chunk ld_c of rows ld_r0 + 8*i
    const int64_t head_off = static_cast<int64_t>(h) * D + ld_c * 8;
    int it = 0;
    bool pending = false;  // tile it-1 issued but its full barrier not yet signalled
    for (int kt = next_tile(c_begin); kt < c_end; kt = next_tile(kt + BN), ++it) {
      const int s = it % ST;
      if (it >= ST) {
        const uint32_t par = static_cast<uint32_t>((it / ST) - 1) & 1u;
        // About to block on a busy stage: publish the tile already in flight first, so that the
        // consumers never wait on data that has landed.
        if (pending && !mbar_test(empty0 + 8 * s, par)) {
          cp_async_wait<0>();
          fence_proxy_async();
          mbar_arrive(full0 + 8 * ((it - 1) % ST));
          pending = false;
        }
        mbar_wait(empty0 + 8 * s, par);
      }
      const uint32_t ks = kv_s + s * C::STAGE_BYTES, vs = ks + C::KV_BYTES;
#pragma unroll 4
      for (int i = 0; i < BN / 8; ++i) {
        const int r = ld_r0 + i * 8;
        const int slot = kt + r;
        const bool ok = slot < kv_len;
        const int sl = ok ? slot : kv_len - 1;
        int page, off;
        if (p.page_shift >= 0) {
          page = __ldg(bt + (sl >> p.page_shift));
          off = sl & (p.page_size - 1);
        } else {
          page = __ldg(bt + sl / p.page_size);
          off = sl - (sl / p.page_size) * p.page_size;
        }
        const int64_t goff = (static_cast<int64_t>(page) * p.page_size + off) * p.hkv * D + head_off;
        cp_async16(ks + swz<BN>(r, ld_c), p.k + goff, ok);
        cp_async16(vs + swz<BN>(r, ld_c), p.v + goff, ok);
      }
      cp_async_commit();
      if (pending) {  // tile it-1 (the group before this one) has landed: publish it
        cp_async_wait<1>();
        fence_proxy_async();
        mbar_arrive(full0 + 8 * ((it - 1) % ST));
      }
      pending = true;
    }
    if (pending) {
      cp_async_wait<0>();
      fence_proxy_async();
      mbar_arrive(full0 + 8 * ((it - 1) % ST));
    }
  } else {
    // =================================== consumers ==================================================
    regs_alloc<C::CONSUMER_REGS>();
    const int c = wg - 1;  // consumer index: rows c*64 .. c*64+63 of the tile
    const int wtid = tid & 127, lane = tid & 31, warp = wtid >> 5;
    const int g4 = lane >> 2, t4 = lane & 3;
    const int wrow = c * 64 + warp * 16;  // this warp's first row in the CTA tile

    // Q: this warpgroup's 64 rows (rows past rows_b are zero), resident for the whole loop.
    for (int idx = wtid; idx < 64 * CPR; idx += 128) {
      const int r = c * 64 + idx / CPR, cc = idx % CPR;
      const int gr = row0 + r;
      const bool ok = gr < rows_b;
      const int node = ok ? gr / G : 0, g = ok ? gr % G : 0;
      const __nv_bfloat16* src =
          p.q + (static_cast<int64_t>(t0 + node) * p.hq + static_cast<int64_t>(h) * G + g) * D + cc * 8;
      cp_async16(q_s + swz<BM>(r, cc), ok ? src : p.q, ok);
    }
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    named_sync(3 + c, 128);
    const uint32_t q_wg = q_s + c * 64 * 128;

    // Ancestor rows of this thread's two rows (nullptr: causal or padding beyond rows_b).
    const uint32_t* rowp[2];
    int node_of[2];
    bool live[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int gr = row0 + wrow + g4 + 8 * hf;
      live[hf] = gr < rows_b;
      node_of[hf] = live[hf] ? gr / G : 0;
      rowp[hf] = anc_b ? anc_b + static_cast<int64_t>(node_of[hf]) * p.words : nullptr;
    }

    float acc[C::DT8][4];
    float s[C::NT8][4];
    uint32_t pa[BN / 16][4];
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, corr[2] = {1.f, 1.f};
#pragma unroll
    for (int j = 0; j < C::DT8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
    for (int j = 0; j < C::NT8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) pa[j][0] = pa[j][1] = pa[j][2] = pa[j][3] = 0u;

    auto issue_s = [&](uint32_t ks) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t koff = (kk & 3) << 5;
        wg_qk(s, wg_desc(q_wg + (kk >> 2) * BM * 128 + koff, 16), wg_desc(ks + (kk >> 2) * BN * 128 + koff, 16),
              kk > 0);
      }
    };
    auto issue_pv = [&](uint32_t vs) {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) wg_pv(acc, pa[kk], wg_desc(vs + kk * 16 * 128, BN * 128));
    };
    // Mask (tiles reaching past ctx) and online softmax of s in place; sets corr.
    auto softmax = [&](int kt) {
      if (kt + BN > ctx) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          uint64_t vis[C::VW];
#pragma unroll
          for (int w = 0; w < C::VW; ++w)
            vis[w] = live[hf] ? visible_bits(rowp[hf], node_of[hf], kt + 64 * w, ctx, n_b) : 0ull;
#pragma unroll
          for (int j = 0; j < C::NT8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int bit = j * 8 + 2 * t4 + e;
              if (!((vis[bit >> 6] >> (bit & 63)) & 1ull)) s[j][2 * hf + e] = -INFINITY;
            }
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < C::NT8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * hf], s[j][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_old = m_run[hf];
        const float m_new = fmaxf(m_old, mx * p.scale_log2);
        const float cr = m_old == -INFINITY ? 0.f : ex2(m_old - m_new);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        m_run[hf] = m_new;
        corr[hf] = cr;
        float rs = 0.f;
#pragma unroll
        for (int j = 0; j < C::NT8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pe = ex2(fmaf(s[j][2 * hf + e], p.scale_log2, -m_use));
            s[j][2 * hf + e] = pe;
            rs += pe;
          }
        l_run[hf] = l_run[hf] * cr + rs;
      }
    };
    auto pack_p = [&]() {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        pa[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
        pa[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
        pa[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        pa[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
    };
    // Multiplying by exactly 1 changes no bits; skip it when no row of the warp moved (warp-uniform,
    // so the warp stays converged for the wgmma that follows).
    auto rescale = [&]() {
      if (__any_sync(0xffffffffu, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
        for (int j = 0; j < C::DT8; ++j) {
          acc[j][0] *= corr[0];
          acc[j][1] *= corr[0];
          acc[j][2] *= corr[1];
          acc[j][3] *= corr[1];
        }
      }
    };

    // Ping-pong: named barrier 1 = "consumer 0 may issue", 2 = "consumer 1 may issue" (256 threads:
    // one side syncs, the other arrives). Consumer 0 goes first; every issue phase of consumer c is
    // followed by an arrive for the other, except consumer 1's last (nobody waits for it), so each
    // barrier sees exactly as many arrivals as syncs.
    int kt = next_tile(c_begin);
    if (kt < c_end) {
      if (c == 1) named_arrive(1, 256);
      int it = 0;
      int kn = next_tile(kt + BN);
      // ---- tile 0: S only ----
      mbar_wait(full0, 0u);
      fence_proxy_async();
      named_sync(1 + c, 256);
      pin(s);
      wg_fence();
      issue_s(kv_s);
      wg_commit();
      if (!(c == 1 && kn >= c_end)) named_arrive(2 - c, 256);
      wg_wait0();
      pin(s);
      softmax(kt);
      kt = kn;
      ++it;
      // ---- steady state: S of tile it with P.V of tile it-1 ----
      // The wait for P.V of tile it-2 sits at the top of the iteration, behind the (looping) full-
      // barrier wait: ptxas schedules wgmma.wait_group at the top of its basic block, so this keeps
      // tile it-1's softmax (end of the previous iteration) overlapped with that P.V.
      while (kt < c_end) {
        kn = next_tile(kt + BN);
        const int st = it % ST, sp = (it - 1) % ST;
        mbar_wait(full0 + 8 * st, static_cast<uint32_t>(it / ST) & 1u);
        pin(s);
        pin(m_run, l_run, corr);
        wg_wait0();
        pin(acc);
        pin(pa);
        if (it >= 2) mbar_arrive(empty0 + 8 * ((it - 2) % ST));  // tile it-2's K and V are no longer read
        pack_p();  // P of tile it-1
        fence_proxy_async();
        named_sync(1 + c, 256);
        pin(s);
        wg_fence();
        issue_s(kv_s + st * C::STAGE_BYTES);
        wg_commit();
        rescale();  // by tile it-1's correction, before its P.V is added
        pin(acc);
        pin(pa);
        wg_fence();
        issue_pv(kv_s + sp * C::STAGE_BYTES + C::KV_BYTES);
        wg_commit();
        if (!(c == 1 && kn >= c_end)) named_arrive(2 - c, 256);
        wg_wait1();  // S of tile it done; P.V of tile it-1 may still run
        pin(s);
        softmax(kt);
        kt = kn;
        ++it;
      }
      // ---- last P.V ----
      pin(s);
      pin(m_run, l_run, corr);
      wg_wait0();
      pin(acc);
      pin(pa);
      if (it >= 2) mbar_arrive(empty0 + 8 * ((it - 2) % ST));
      pack_p();
      const int sp = (it - 1) % ST;
      rescale();
      pin(acc);
      pin(pa);
      wg_fence();
      issue_pv(kv_s + sp * C::STAGE_BYTES + C::KV_BYTES);
      wg_commit();
      wg_wait0();
      pin(acc);
      pin(pa);
      mbar_arrive(empty0 + 8 * sp);
    }

    // ---- epilogue (as tree_attention_kernel with MT = 1) -------------------------------------------
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float l = l_run[hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      l_run[hf] = l;
    }
    constexpr float kLn2 = 0.69314718055994531f;
    if (nact == 1) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int lr = wrow + g4 + 8 * hf, gr = row0 + lr;
        if (gr >= rows_b) continue;
        const float l = l_run[hf];
        const bool valid = s_row_valid[lr] && l > 0.f;
        const float inv = valid ? 1.f / l : 0.f;
        const int64_t qrow = static_cast<int64_t>(t0 + gr / G) * p.hq + static_cast<int64_t>(h) * G + gr % G;
        __nv_bfloat16* orow = p.o + qrow * D;
#pragma unroll
        for (int j = 0; j < C::DT8; ++j)
          *reinterpret_cast<uint32_t*>(orow + j * 8 + 2 * t4) =
              pack_bf16(valid ? acc[j][2 * hf] * inv : 0.f, valid ? acc[j][2 * hf + 1] * inv : 0.f);
        if (p.lse && t4 == 0) p.lse[qrow] = valid ? (m_run[hf] + log2f(l)) * kLn2 : -INFINITY;
      }
    } else {
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
  }
#endif
#endif
}

}  // namespace tree_attn
}  // namespace ddtree
