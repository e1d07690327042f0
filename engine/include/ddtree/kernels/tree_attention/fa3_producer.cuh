// Tree attention fa3 back end: the producer warpgroup's K/V tile copies (block-table lookups and cp.async
// of a 128-key tile into a ring stage). Overview in ../tree_attention_fa3.cuh.
#pragma once

#include "ddtree/kernels/tree_attention/fa3_config.cuh"

namespace ddtree {
namespace tree_attn {

// Producer helpers (v7 copy mapping). Thread tid copies 16-byte chunks cp_s and cp_s + 8 (one per
// 64-column panel) of key rows cp_g + 16*i (i < 8) of every K and V tile, cp_g = tid / 8,
// cp_s = tid % 8. So:
// * a warp instruction covers 4 rows x 128 contiguous bytes (4 whole lines, as the v6 mapping did);
// * row cp_g + 16*i has row % 8 == cp_g % 8, so its swizzled chunks sit at swz(cp_g, cp_s) + i * 2048
//   and 16 KB further: every destination is an immediate offset off one per-tile register;
// * every source is one IMAD.WIDE.U32 per row (cache row x row pitch + the thread's 64-bit base as
//   the addend; see mul_wide), its second chunk 128 bytes further (an immediate as well). No branch,
//   select or 64-bit multiply per copy.
// Each thread also looks up the cache row of key tid of every tile (one block-table load, issued a
// tile ahead); s_rows[buf] holds a tile's rows as [cp_g][i], so a thread reads its 8 as 2 x 16 bytes.
// Rows past the length are stored as row 0 (a valid address) and their copies zero-fill through
// cp.async's ignore-src predicate: the source is not read.

// Issues the 16 copies of one tile (K or V, ring stage at `dst`) of key rows kt .. kt+127 from the
// rows in s_rows[buf]. lim = kv_len - kt - cp_g: row cp_g + 16*i exists iff 16*i < lim, so all 8
// exist iff lim > 112. Only a request's last tile can miss rows; every other tile (and a last tile
// that ends exactly at the length) takes the branch without predicates.
__device__ __forceinline__ void fa3_issue_tile(uint32_t dst, const char* src0, const int* s_rows, int buf, int lim,
                                               int cp_g, uint32_t cp_dst0, uint32_t row_pitch) {
  constexpr int BN = Fa3Config::BN;
  const int4* rows4 = reinterpret_cast<const int4*>(s_rows + buf * BN + cp_g * 8);
  const int4 ra = rows4[0], rb = rows4[1];
  const uint32_t rr[8] = {static_cast<uint32_t>(ra.x), static_cast<uint32_t>(ra.y), static_cast<uint32_t>(ra.z),
                          static_cast<uint32_t>(ra.w), static_cast<uint32_t>(rb.x), static_cast<uint32_t>(rb.y),
                          static_cast<uint32_t>(rb.z), static_cast<uint32_t>(rb.w)};
  dst += cp_dst0;
  if (lim > BN - 16) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const char* src = src0 + mul_wide(rr[i], row_pitch);
      cp_async16_full(dst + i * 2048, src);
      cp_async16_full(dst + i * 2048 + 16384, src + 128);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const char* src = src0 + mul_wide(rr[i], row_pitch);
      const bool zero = 16 * i >= lim;
      cp_async16_zfill(dst + i * 2048, src, zero);
      cp_async16_zfill(dst + i * 2048 + 16384, src + 128, zero);
    }
  }
}

}  // namespace tree_attn
}  // namespace ddtree
