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

// The parts: tree_attention/common.cuh (parameters, configurations, PTX and visibility helpers),
// tree_attention/wgmma.cuh (sm_90a GEMMs), tree_attention/kernel.cuh (the kernel) and
// tree_attention/merge.cuh (the split merge). The fa3 back end is tree_attention_fa3.cuh.
#include "ddtree/kernels/tree_attention/common.cuh"
#include "ddtree/kernels/tree_attention/kernel.cuh"
#include "ddtree/kernels/tree_attention/merge.cuh"
