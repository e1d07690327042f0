// Tree attention, part 1: parameters, tile configurations, PTX helpers (cp.async, ldmatrix, mma.sync)
// and the ancestor-bit visibility helpers shared by every back end. Overview in ../tree_attention.cuh.
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
  // fa3 only (v10, opt-in): 1 = a split row tile (2..Fa3Config::MAX_FUSED_SPLITS chunks) is merged by the last of
  // its CTAs to finish (arrival counter merge_cnt[(b * hkv + h) * row_tiles + rt], zero before the launch
  // and left zero by it); its partials then use fa3's fragment layout (fused_merge_epilogue). 0 = the
  // row-major partials above and the merge kernel.
  int fused_merge;
  uint32_t* merge_cnt;
  // fa3 only (v10): 1 = the tile mask is waited for lazily (only before the first tree tile and the
  // epilogue); 0 = every thread waits for it right after the prologue (the v9b schedule, for A/B runs).
  int lazy_mask;
  // fa3 only (v10, opt-in): > 0 = chunk boundaries of a split request are weighted by tile cost, a tile
  // that reaches past ctx (masked) counting balance_w / 4 of a context tile (fa3_balanced_chunk); 0 =
  // uniform chunks of `chunk` keys. The number of chunks per request is the same either way.
  int balance_w;
  // fa3 only (v21, session 12): 1 = the grid is launched as (hkv, row_tiles * num_splits, batch) and CTA
  // (x, y) works on head x and row-tile index gridDim.y - 1 - y, so the hardware, which hands out CTAs in
  // index order, starts the longest row tiles (the last ones, which see the most tree tiles) first and ends
  // with the shortest (longest-processing-time-first across the waves of a grid larger than the GPU); 0 = the
  // grid (row_tiles * num_splits, hkv, batch), row-tile index x. The same CTAs compute the same bits either way.
  int lpt_order;
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

}  // namespace tree_attn
}  // namespace ddtree
