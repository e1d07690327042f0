// Tree attention, part 3: the mma.sync / wgmma kernel (one CTA per row tile and context chunk).
// Overview in ../tree_attention.cuh.
#pragma once

#include "ddtree/kernels/tree_attention/wgmma.cuh"

namespace ddtree {
namespace tree_attn {

template <class C>
__global__ void __launch_bounds__(C::NT, C::WGMMA ? 1 : 2) tree_attention_kernel(const Params p) {
  constexpr int D = C::D, MT = C::MT, BN = C::BN, BM = C::BM, NT = C::NT, CPR = C::CPR;
#if defined(__CUDA_ARCH__)
  if constexpr (C::WGMMA && !DDTREE_TA_HAVE_WGMMA) {
    __trap();  // the launcher only picks the wgmma kernel when the image has sm_90a code
  } else {
#endif
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __shared__ unsigned long long s_tile_mask;
  __shared__ unsigned char s_row_valid[BM];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b = blockIdx.z, h = blockIdx.y;
  const int rt = blockIdx.x % p.row_tiles, split = blockIdx.x / p.row_tiles;

  const int t0 = p.qo_indptr[b];
  const int n_b = max(0, min(min(p.qo_indptr[b + 1], p.num_tokens) - t0, p.n_max));
  const int G = p.group;
  const int rows_b = n_b * G;
  const int row0 = rt * BM;
  if (row0 >= rows_b) return;
  const int ctx = max(p.ctx_len[b], 0);
  const int kv_len = min(ctx + n_b, p.max_pages * p.page_size);
  const int nact = (kv_len + p.chunk - 1) / p.chunk;
  if (split >= nact) return;
  const int c_begin = split * p.chunk, c_end = min(c_begin + p.chunk, kv_len);
  const int tb0 = (ctx / BN) * BN;  // first tile that can hold tree keys
  const int* bt = p.block_table + static_cast<int64_t>(b) * p.max_pages;
  const uint32_t* anc_b = p.anc ? p.anc + static_cast<int64_t>(b) * p.n_max * p.words : nullptr;

  // ---- per-row validity and the tree tiles this CTA must visit -----------------------------------
  if (tid == 0) s_tile_mask = 0ull;
  __syncthreads();
  if (tid < BM) {
    const int r = row0 + tid;
    bool valid = false;
    unsigned long long tiles = 0ull;
    if (r < rows_b) {
      const int node = r / G;
      if (anc_b == nullptr) {
        valid = true;
        for (int j = 0; j <= node; j += 32) {  // tiles of nodes 0..node
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
          // A word's 32 bits span at most two BN-tiles (BN >= 32).
          const int ta = (ctx + w * 32 - tb0) / BN;
          const int split_bit = (ta + 1) * BN + tb0 - ctx - w * 32;  // first bit in tile ta + 1
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
  auto next_tile = [&](int k0) {  // first active tile at or after k0 (k0 aligned to BN)
    while (k0 < c_end && k0 >= ctx && !((tile_mask >> ((k0 - tb0) / BN)) & 1ull)) k0 += BN;
    return k0;
  };

  // ---- shared memory (base aligned to the 1024-byte swizzle atom) ---------------------------------
  const uint32_t q_s = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const uint32_t kv_s = q_s + C::Q_BYTES;  // stage st: K at kv_s + st*2*KV_BYTES, V after it

  for (int idx = tid; idx < BM * CPR; idx += NT) {  // Q tile (rows past rows_b are zero)
    const int r = idx / CPR, c = idx % CPR;
    const int gr = row0 + r;
    const bool ok = gr < rows_b;
    const int node = ok ? gr / G : 0, g = ok ? gr % G : 0;
    const __nv_bfloat16* src =
        p.q + (static_cast<int64_t>(t0 + node) * p.hq + static_cast<int64_t>(h) * G + g) * D + c * 8;
    cp_async16(q_s + swz<BM>(r, c), ok ? src : p.q, ok);
  }
  // Each thread copies chunk `ld_c` of rows ld_r0 + it * (NT / CPR) of every K/V tile.
  const int ld_c = tid % CPR, ld_r0 = tid / CPR;
  const int64_t head_off = static_cast<int64_t>(h) * D + ld_c * 8;
  auto load_kv = [&](int k0, int st) {
    const uint32_t ks = kv_s + st * 2 * C::KV_BYTES, vs = ks + C::KV_BYTES;
#pragma unroll
    for (int it = 0; it < BN * CPR / NT; ++it) {
      const int r = ld_r0 + it * (NT / CPR);
      const int slot = k0 + r;
      const bool ok = slot < kv_len;
      const int s = ok ? slot : kv_len - 1;  // a valid address either way; size 0 zero-fills
      int page, off;
      if (p.page_shift >= 0) {
        page = __ldg(bt + (s >> p.page_shift));
        off = s & (p.page_size - 1);
      } else {
        page = __ldg(bt + s / p.page_size);
        off = s - (s / p.page_size) * p.page_size;
      }
      const int64_t goff = (static_cast<int64_t>(page) * p.page_size + off) * p.hkv * D + head_off;
      cp_async16(ks + swz<BN>(r, ld_c), p.k + goff, ok);
      cp_async16(vs + swz<BN>(r, ld_c), p.v + goff, ok);
    }
  };

  // ---- per-thread state: rows (mt, half) = warp*16*MT + mt*16 + lane/4 + 8*half -------------------
  float acc[MT][C::DT8][4];
  float m_run[MT][2], l_run[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int j = 0; j < C::DT8; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
    m_run[mt][0] = m_run[mt][1] = -INFINITY;
    l_run[mt][0] = l_run[mt][1] = 0.f;
  }
  const int g4 = lane >> 2, t4 = lane & 3;
  const int wrow = warp * 16 * MT;

  int kt = next_tile(c_begin);
  if (kt < c_end) load_kv(kt, 0);
  cp_async_commit();
  int st = 0;
  while (kt < c_end) {
    const int kn = next_tile(kt + BN);
    if (kn < c_end) load_kv(kn, st ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    if constexpr (C::WGMMA) fence_proxy_async();  // cp.async wrote what the tensor cores read
    __syncthreads();

    const uint32_t ks = kv_s + st * 2 * C::KV_BYTES, vs = ks + C::KV_BYTES;
    // S = Q K^T
    float s[MT][C::NT8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < C::NT8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
    if constexpr (C::WGMMA) {
      const uint32_t q_wg = q_s + (warp >> 2) * 64 * 128;  // this warpgroup's 64 rows
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t koff = (kk & 3) << 5;  // 16 columns = 32 bytes inside the 128-byte row
        wg_qk(s[0], wg_desc(q_wg + (kk >> 2) * BM * 128 + koff, 16),
              wg_desc(ks + (kk >> 2) * BN * 128 + koff, 16), kk > 0);
      }
      wg_commit();
      wg_wait0();
    } else {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
          ldsm_x4(a[mt], q_s + swz<BM>(wrow + mt * 16 + (lane & 15), kk * 2 + (lane >> 4)));
#pragma unroll
        for (int np = 0; np < C::NT8 / 2; ++np) {
          uint32_t bf[4];
          ldsm_x4(bf, ks + swz<BN>(np * 16 + (lane & 7) + ((lane >> 4) << 3), kk * 2 + ((lane >> 3) & 1)));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(s[mt][2 * np], a[mt], bf[0], bf[1]);
            mma_bf16(s[mt][2 * np + 1], a[mt], bf[2], bf[3]);
          }
        }
      }
    }
    // Mask: only tiles that reach past the committed prefix.
    if (kt + BN > ctx) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int gr = row0 + wrow + mt * 16 + g4 + 8 * hf;
          uint64_t vis[C::VW];
#pragma unroll
          for (int w = 0; w < C::VW; ++w) vis[w] = 0ull;
          if (gr < rows_b) {
            const int node = gr / G;
            const uint32_t* row = anc_b ? anc_b + static_cast<int64_t>(node) * p.words : nullptr;
#pragma unroll
            for (int w = 0; w < C::VW; ++w) vis[w] = visible_bits(row, node, kt + 64 * w, ctx, n_b);
          }
#pragma unroll
          for (int j = 0; j < C::NT8; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int bit = j * 8 + 2 * t4 + e;
              if (!((vis[bit >> 6] >> (bit & 63)) & 1ull)) s[mt][j][2 * hf + e] = -INFINITY;
            }
        }
    }
    // Online softmax (scores kept raw; exponent = s*scale_log2 - m, m in the scaled log2 domain).
    float corr[MT][2];
    bool rescale = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < C::NT8; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * hf], s[mt][j][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_old = m_run[mt][hf];
        const float m_new = fmaxf(m_old, mx * p.scale_log2);
        const float cr = m_old == -INFINITY ? 0.f : exp2f(m_old - m_new);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        m_run[mt][hf] = m_new;
        corr[mt][hf] = cr;
        rescale |= cr != 1.f;
        float rs = 0.f;
#pragma unroll
        for (int j = 0; j < C::NT8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float pe = exp2f(fmaf(s[mt][j][2 * hf + e], p.scale_log2, -m_use));
            s[mt][j][2 * hf + e] = pe;
            rs += pe;
          }
        l_run[mt][hf] = l_run[mt][hf] * cr + rs;
      }
    // Scaling by exactly 1 changes no bits, so the rescale is skipped when no row of the warp moved.
    if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < C::DT8; ++j) {
          acc[mt][j][0] *= corr[mt][0];
          acc[mt][j][1] *= corr[mt][0];
          acc[mt][j][2] *= corr[mt][1];
          acc[mt][j][3] *= corr[mt][1];
        }
    }
    // O += P V (P re-used from the S accumulators as the A operand).
    if constexpr (C::WGMMA) {
      uint32_t a[BN / 16][4];  // all P fragments first: no register writes between the wgmmas
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        a[kk][0] = pack_bf16(s[0][2 * kk][0], s[0][2 * kk][1]);
        a[kk][1] = pack_bf16(s[0][2 * kk][2], s[0][2 * kk][3]);
        a[kk][2] = pack_bf16(s[0][2 * kk + 1][0], s[0][2 * kk + 1][1]);
        a[kk][3] = pack_bf16(s[0][2 * kk + 1][2], s[0][2 * kk + 1][3]);
      }
      wg_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        // V is [key][d]: MN-major for this product. 8-key groups 1024 B apart (SBO), 64-column
        // panels BN*128 B apart (LBO).
        wg_pv(acc[0], a[kk], wg_desc(vs + kk * 16 * 128, BN * 128));
      wg_commit();
      wg_wait0();
    } else {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          a[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          a[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          a[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          a[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < C::DT8 / 2; ++dp) {
          uint32_t bf[4];
          ldsm_x4_t(bf, vs + swz<BN>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(acc[mt][2 * dp], a[mt], bf[0], bf[1]);
            mma_bf16(acc[mt][2 * dp + 1], a[mt], bf[2], bf[3]);
          }
        }
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's loads
    kt = kn;
    st ^= 1;
  }
  cp_async_wait<0>();

  // Row sums over the quad.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float l = l_run[mt][hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      l_run[mt][hf] = l;
    }

  constexpr float kLn2 = 0.69314718055994531f;
  if (nact == 1) {  // whole key range in this CTA: normalize and write
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int lr = wrow + mt * 16 + g4 + 8 * hf, gr = row0 + lr;
        if (gr >= rows_b) continue;
        const float l = l_run[mt][hf];
        const bool valid = s_row_valid[lr] && l > 0.f;
        const float inv = valid ? 1.f / l : 0.f;
        const int64_t qrow = static_cast<int64_t>(t0 + gr / G) * p.hq + static_cast<int64_t>(h) * G + gr % G;
        __nv_bfloat16* orow = p.o + qrow * D;
#pragma unroll
        for (int j = 0; j < C::DT8; ++j)
          *reinterpret_cast<uint32_t*>(orow + j * 8 + 2 * t4) =  // select, so padding rows are +0
              pack_bf16(valid ? acc[mt][j][2 * hf] * inv : 0.f, valid ? acc[mt][j][2 * hf + 1] * inv : 0.f);
        if (p.lse && t4 == 0) p.lse[qrow] = valid ? (m_run[mt][hf] + log2f(l)) * kLn2 : -INFINITY;
      }
    return;
  }

  // ---- split: write this chunk's partial; tree_attention_merge_kernel combines them ---------------
  const int64_t slot = ((static_cast<int64_t>(b) * p.hkv + h) * p.row_tiles + rt) * p.num_splits + split;
  float* po = p.part_o + slot * BM * D;
  float* pml = p.part_ml + slot * BM * 2;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int lr = wrow + mt * 16 + g4 + 8 * hf;
#pragma unroll
      for (int j = 0; j < C::DT8; ++j)
        __stcg(reinterpret_cast<float2*>(po + lr * D + j * 8 + 2 * t4),
               make_float2(acc[mt][j][2 * hf], acc[mt][j][2 * hf + 1]));
      if (t4 == 0) __stcg(reinterpret_cast<float2*>(pml + lr * 2), make_float2(m_run[mt][hf], l_run[mt][hf]));
    }
#if defined(__CUDA_ARCH__)
  }
#endif
}

}  // namespace tree_attn
}  // namespace ddtree
