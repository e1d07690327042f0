// Tree attention kernels (header-only, no PyTorch). Two MMA back ends share everything else:
// * mma.sync m16n8k16 bf16 (FlashAttention-2 style): sm_80+, so sm_90 and sm_120 (<= 99 KB smem);
// * wgmma (sm_90a only): S = Q K^T with both operands in shared memory, O += P V with P in registers.
//
// Layout of the work (see tree_attention.h for the semantics):
// * MMA rows = (tree node, GQA group member): row r of (request b, kv head h) is query head
//   h*G + r%G of node r/G, so one K/V tile read from the paged cache serves all G query heads of its
//   kv head (G = Hq/Hkv). A CTA owns BM = 128 rows (64 at D=256).
// * Keys: [0, ctx + n_b) is cut into fixed chunks by absolute position (flash-decoding split); one
//   CTA per (row tile, chunk). Inside a chunk, BN-key tiles aligned to absolute positions stream
//   through a cp.async double buffer. Context tiles take no mask at all; only tiles that reach past
//   ctx test the ancestor bits (a 64-bit window of the row's bitset per row), and tree tiles in which
//   no row of the CTA has a visible bit are skipped outright.
// * Merge: a CTA whose request needs one chunk writes o/lse itself; otherwise it writes fp32
//   partials (unnormalized O, max, sum) and tree_attention_merge_kernel, launched right after on the
//   same stream, combines them in chunk order, one warp per row.
//
// Exactness: a masked score is -inf, so its p is exactly 0 and adds exactly 0; a tile that is fully
// masked for a row scales that row by exp2(0) = 1 exactly (and the rescale is skipped when every
// factor is 1, which is the same bits). Tile boundaries, chunk boundaries and the merge order depend
// only on positions and the plan, never on the mask, so a chain-shaped bitset gives bit-identical
// results to the causal mode, and changing a key no query sees changes nothing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "ddtree/kernels/common.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DDTREE_TA_HAVE_WGMMA 1
#else
#define DDTREE_TA_HAVE_WGMMA 0
#endif

namespace ddtree {
namespace tree_attn {

struct Params {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  const int32_t* qo_indptr;
  const int32_t* block_table;
  const int32_t* ctx_len;
  const uint32_t* anc;  // nullptr: causal mode
  __nv_bfloat16* o;
  float* lse;           // may be nullptr
  float* part_o;        // [B*Hkv*RT*NS, BM, D]
  float* part_ml;       // [B*Hkv*RT*NS, BM, 2]
  int num_tokens, hq, hkv, group, page_size, page_shift, max_pages, n_max, words;
  int row_tiles, num_splits, chunk;
  float scale_log2;     // sm_scale * log2(e)
  // fa3 only: 1 = the CTAs of a row tile's num_splits chunks form one thread-block cluster (grid x =
  // row tile * num_splits + split) and merge their partials through distributed shared memory instead
  // of part_o / part_ml and the merge kernel. 0 = the layout above (grid x = split * row_tiles + rt).
  int cluster_merge;
};

template <int D_, int MT_, int BN_, int NW_, bool WG_>
struct Config {
  static constexpr int D = D_, MT = MT_, BN = BN_, NW = NW_;
  static constexpr bool WGMMA = WG_;
  static constexpr int NT = 32 * NW;
  static constexpr int BM = 16 * MT * NW;
  static constexpr int CPR = D / 8;  // 16-byte chunks per row
  static constexpr int Q_BYTES = BM * D * 2;
  static constexpr int KV_BYTES = BN * D * 2;
  // Q + (K, V) x 2 stages, + 1 KB so the base can be aligned to the 1024-byte swizzle atom.
  static constexpr int SMEM = Q_BYTES + 4 * KV_BYTES + 1024;
  static constexpr int NT8 = BN / 8;  // n8 tiles of S
  static constexpr int DT8 = D / 8;   // n8 tiles of O
  static constexpr int VW = BN > 64 ? BN / 64 : 1;  // 64-bit visibility windows per tile row
  static_assert(BN == 32 || BN == 64 || BN == 128, "BN must be 32, 64 or 128");
  static_assert(D % 64 == 0, "tiles are 64-column panels");
  static_assert(!WG_ || (MT == 1 && NW == 8 && D == 128 && BN == 128), "wgmma path: 2 warpgroups x 64 rows");
};

// mma.sync: D=64/128: 128 rows x 64 keys (97 KB at D=128); D=256: 64 rows x 32 keys (97 KB).
template <int D>
struct SyncConfig;
template <>
struct SyncConfig<64> { using type = Config<64, 2, 64, 4, false>; };
template <>
struct SyncConfig<128> { using type = Config<128, 2, 64, 4, false>; };
template <>
struct SyncConfig<256> { using type = Config<256, 1, 32, 4, false>; };
// wgmma: 128 rows (2 warpgroups x 64) x 128 keys, so S = Q K^T runs as m64n128k16 (n64 would be
// bound by shared-memory reads of Q); 161 KB of shared memory, sm_90 only.
using WgmmaConfig128 = Config<128, 1, 128, 8, true>;

// ---- PTX helpers ----------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool pred) {
  int size = pred ? 16 : 0;  // size 0: zero-fill, source not read
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Shared-memory tiles are stored as 64-column panels ([D/64][rows][64] bf16, 128-byte rows) with the
// 16-byte chunk index XOR-ed by row % 8: the 128-byte swizzle that wgmma descriptors describe, and
// conflict-free for ldmatrix (the 8 rows of an 8x8 matrix hit 8 different bank groups).
template <int ROWS>
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return static_cast<uint32_t>((c >> 3) * ROWS * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

__device__ __forceinline__ uint64_t range64(int lo, int hi) {  // bits [lo, hi), 0 <= lo <= hi <= 64
  uint64_t h = hi >= 64 ? ~0ull : ((1ull << hi) - 1);
  uint64_t l = lo >= 64 ? ~0ull : ((1ull << lo) - 1);
  return h & ~l;
}

// Bit c (c < 64) = key at slot k0 + c visible to node `node`: a committed key, or tree node
// j = k0 + c - ctx < n_b whose bit is set in the node's row (causal: j <= node).
__device__ __forceinline__ uint64_t visible_bits(const uint32_t* anc_row, int node, int k0, int ctx,
                                                 int n_b) {
  const int j0 = k0 - ctx;
  uint64_t bits = j0 < 0 ? range64(0, min(-j0, 64)) : 0ull;
  const int jlo = max(j0, 0);
  int jhi = min(j0 + 64, n_b);
  if (anc_row == nullptr) {  // causal
    jhi = min(jhi, node + 1);
    if (jlo < jhi) bits |= range64(jlo - j0, jhi - j0);
    return bits;
  }
  for (int w = jlo >> 5; jlo < jhi && w <= ((jhi - 1) >> 5); ++w) {
    const int wb = w * 32;
    const int lo = max(jlo - wb, 0), hi = min(jhi - wb, 32);
    const uint64_t word = static_cast<uint64_t>(__ldg(anc_row + w)) & range64(lo, hi);
    const int sh = wb - j0;  // in [-31, 63]
    bits |= sh >= 0 ? (word << sh) : (word >> (-sh));
  }
  return bits;
}

// True iff the node's ancestor row has a bit among j < n_b (false: padding query).
__device__ __forceinline__ bool row_is_valid(const uint32_t* anc_row, int n_b) {
  if (anc_row == nullptr) return true;
  for (int w = 0; w * 32 < n_b; ++w) {
    uint32_t word = __ldg(anc_row + w);
    const int rem = n_b - w * 32;
    if (rem < 32) word &= (1u << rem) - 1u;
    if (word) return true;
  }
  return false;
}

// ---- wgmma (sm_90a) -------------------------------------------------------------------------------
// Shared-memory matrix descriptor: 128-byte swizzle, stride between 8-row groups 1024 B.
__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo_bytes >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wg_fence() {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_wait0() {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void fence_proxy_async() {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// S[64 x 128] (+)= A[64 x 16] B[16 x 128], A (Q) and B (K^T) K-major in shared memory.
__device__ __forceinline__ void wg_qk(float (&d)[16][4], uint64_t da, uint64_t db, int accumulate) {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"
      "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,"
      "%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(da), "l"(db), "r"(accumulate));
#endif
}

// O[64 x 128] += P[64 x 16] (registers, mma.sync A-fragment layout) V[16 x 128] (MN-major smem).
__device__ __forceinline__ void wg_pv(float (&d)[16][4], const uint32_t (&a)[4], uint64_t db) {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,"
      "%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,"
      "%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
        "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
        "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
        "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
#endif
}

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

// One warp per (request, kv head, row): combines the chunk partials in chunk order. Rows whose
// request needed a single chunk were written by the main kernel and are skipped here.
template <int D, int BM>
__global__ void __launch_bounds__(128) tree_attention_merge_kernel(const Params p) {
  constexpr int kWarps = 4;
  const int lane = threadIdx.x & 31;
  const int b = blockIdx.z, h = blockIdx.y;
  const int row = blockIdx.x * kWarps + (threadIdx.x >> 5);  // row within (b, h)
  const int t0 = p.qo_indptr[b];
  const int n_b = max(0, min(min(p.qo_indptr[b + 1], p.num_tokens) - t0, p.n_max));
  const int G = p.group;
  if (row >= n_b * G) return;
  const int ctx = max(p.ctx_len[b], 0);
  const int kv_len = min(ctx + n_b, p.max_pages * p.page_size);
  const int nact = (kv_len + p.chunk - 1) / p.chunk;
  if (nact <= 1) return;
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
}

}  // namespace tree_attn
}  // namespace ddtree
