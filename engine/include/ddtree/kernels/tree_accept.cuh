// tree_accept kernels: each tree node's target token (greedy argmax or Gumbel-max sample), then the
// walk from the root along matching children, the bonus token and stop-id truncation.
//
// Two launch plans with the same results:
//
// fused (the default, n_max <= kAcceptFusedMaxNodes): ONE launch of tree_accept_fused_kernel, grid
//   (chunks, N, B). Each CTA writes the best (score, id) of one vocab chunk of one node's logits, then
//   counts itself in the request's arrival counter; the request's last CTA reads every partial, derives
//   parents from the child lists in shared memory, and walks. Counters: one u32 per request, zero
//   before the first call, returned to zero by the last CTA (so a CUDA graph can replay the launch).
//   Sampling CTAs derive their node's depth (the noise key needs it) from the child lists themselves.
//   Why: the split plan's three launches were latency chains of dependent global reads (parents, then
//   depths, then one partial and one child search per walk step): 10-18 us per round on the H200 for
//   a 17-65-node tree over a 320-token vocab (the fused kernel: 7.4-10.1 us), far more than the logits
//   take to read.
//   One-CTA variant (session 6, tree_accept/one_cta.cuh): where a request's logits fit one 512-thread CTA
//   (small vocabularies: V = 320 up to ~100 nodes), one CTA per request reads them all and walks: no
//   arrival counter, no partials. Taken by the fused entry points (and round_finish) when DDTREE_ACCEPT_ONE_CTA=1
//   (read on every call); off by default: on the H200 it was slower than the chunked kernel (NOTES, sessions 6, 7).
//   Session 7 (NOTES): the scoring loop at T = 0 (DDTREE_ACCEPT_SCORE=compact|unrolled; tree_accept/common.cuh) and
//   the chunked kernel's early mode (DDTREE_ACCEPT_PDL=1|0; fused.cuh). Both default on for the fused plan at
//   V <= 1024, where they measured faster (round_finish 10.9-15.9 -> 8.5-12.5 us on the H200); off elsewhere.
//   The early mode is off everywhere since session 12 (a PDL race behind cuBLAS's GEMM; src/tree_accept.cu).
//   Session 10 (NOTES): above V = 1024 the greedy scoring defaults to `packed` (bf16: bf16x2 max, then one vector
//   scored; fp32: the compact loop), 1.4-1.8x (bf16) and 1.1x (fp32) faster than session 6's unrolled loop at
//   V = 151,936.
//   Session 11 (NOTES, "Session 11 (s11e2e)"): bf16 rows with 16-byte loads take a chunk of 16,384 logits (8 vectors
//   a thread, 32 KB a CTA, as fp32's 8192-logit chunk is; DDTREE_ACCEPT_WIDE=1|0, default on): 51.1 vs 58.8 us at
//   8 x 65 nodes, V = 151,936, equal or faster at every measured shape.
//   Session 13 (NOTES, "Session 13 (s13accept)"): leaf mode (DDTREE_ACCEPT_LEAF=1|0; default on above V = 1024,
//   tree_accept_fused only, not round_finish): the fused kernel skips leaf rows (their target token matters only as
//   the bonus of a walk ending there), and a second launch (tree_accept/leaf.cuh) scores the one leaf row per
//   request a walk ended on. NaN in a leaf row that is never read no longer raises DDTREE_FLAG_NAN_INPUT.
//   DDTREE_ACCEPT_LEAF=2 (opt-in): the first pass as tree_accept/rows.cuh's kernel, no CTA for a leaf row.
// split (n_max > kAcceptFusedMaxNodes, or DDTREE_ACCEPT_IMPL=split):
//   1. tree_accept_tree_kernel   (grid B)          parent and depth of every node from the child lists
//   2. tree_accept_target_kernel (grid chunks,N,B) the same per-chunk partials as the fused kernel
//   3. tree_accept_walk_kernel   (grid B)          per step, reduce the current node's chunk partials,
//                                                  find the child holding that token; outputs
//   2 and 3 use programmatic dependent launch so that their launch overlaps the previous kernel.
//
// Files: tree_accept/common.cuh (sizes, Gumbel noise, stop-id truncation, a CTA's scored chunk: both
// plans), tree_accept/split_plan.cuh (kernels 1-3), tree_accept/fused.cuh (the fused kernel and its walk),
// tree_accept/one_cta.cuh (the one-CTA variant of the fused plan), tree_accept/leaf.cuh (leaf mode's second pass).
#pragma once

#include "ddtree/kernels/tree_accept/common.cuh"
#include "ddtree/kernels/tree_accept/fused.cuh"
#include "ddtree/kernels/tree_accept/leaf.cuh"
#include "ddtree/kernels/tree_accept/one_cta.cuh"
#include "ddtree/kernels/tree_accept/rows.cuh"
#include "ddtree/kernels/tree_accept/split_plan.cuh"
