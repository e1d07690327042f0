// Tree attention, third back end (sm_90a only): an FA3-style warp-specialized schedule of the same
// math as tree_attention_kernel<WgmmaConfig128> (128 rows x 128-key tiles, D = 128, same row layout,
// masking, plan, partials and merge kernel; see tree_attention.cuh).
//
// Why: the plain wgmma kernel runs S -> softmax -> P.V in lockstep in both warpgroups with one
// __syncthreads per tile, so the tensor cores idle during every softmax (~340 TFLOP/s measured of
// ~800). Here:
// * warpgroup 0 is a producer: its 128 threads gather the paged K/V tiles with cp.async into a K ring
//   and a V ring of 3 stages each (one full and one empty mbarrier per stage) and give back registers
//   (setmaxnreg). Each thread looks up ONE block-table entry per tile (a key row), one tile ahead, and
//   the rows reach the other producer threads through shared memory, so no block-table load sits
//   between two copies. Completion is signalled by cp.async.mbarrier.arrive.noinc, so the producer
//   never blocks on its own copies: it issues K of tile j, then V of tile j-1 (the two that the
//   consumers need together), and runs up to two tiles ahead of the consumers;
// * warpgroups 1 and 2 are consumers of 64 rows each (Q resident in shared memory). They ping-pong:
//   a named barrier pair lets only one of them issue its GEMMs at a time, so one's softmax overlaps
//   the other's GEMMs;
// * inside a consumer, tile j's S = Q K^T is issued together with tile j-1's O += P V, and tile j's
//   mask + softmax run while P V is still in flight (FA3's intra-warpgroup overlap). K of tile j is
//   released as soon as S_j is done, V of tile j once P_j V_j is done.
// No __syncthreads in the main loop.
//
// Launch (v9): with programmatic dependent launch (griddepcontrol.wait before the first global read);
// the mbarriers are initialized and published before any global load, so the producer issues the first
// K/V tiles as soon as its block-table entries arrive.
// v10: no __syncthreads after the prologue: the consumers publish the tile mask through an mbarrier that
// is waited for only where the mask is read (the first tree tile, the epilogue's row flags). A split row
// tile is merged by the merge kernel; opt-in alternatives (both measured slower on the H200, see
// engine/bench/NOTES.md): the last of its CTAs to finish (DDTREE_TA_FA3_FUSED_MERGE=1, 2-4 chunks;
// arrival counter in the workspace, fused_merge_epilogue), or the CTAs of one thread-block cluster
// through distributed shared memory (DDTREE_TA_CLUSTER_MERGE=1, cluster_merge_epilogue). All merges
// give the same bits.
//
// v17: a split request's tiles are dealt to its splits strided (split s takes every nact-th tile, rounds aligned
// to the end of the key range: fa3_strided_first), so the masked tree tiles no longer all sit in the last chunk
// (whose CTAs set the kernel's span); the default, measured faster on the H200. v10's contiguous chunks stay
// selectable per launch (DDTREE_TA_FA3_SCHEDULE=chunked; tree_attention_fa3_kernel<false>).
//
// v18 (session 10): the strided instance reads qo_indptr, ctx_len, the block table and the ancestor words
// before its PDL wait (kEarlyInputs; q and the cache after it), and the merge kernel triggers its
// dependents at entry (kEarlyTrigger), so a launch after a launch overlaps its prologue with the previous
// grid's tail. Both default, same bits; DDTREE_TA_FA3_EARLY_INPUTS=0 / DDTREE_TA_MERGE_TRIGGER=0 per launch.
//
// Ordering: the producer's cp.async writes complete on the stage's full mbarrier (asynchronous
// arrive of each producer thread); consumers wait on it (acquire) and issue fence.proxy.async before
// their wgmma (async proxy) reads the stage. A consumer warp arrives on a stage's empty barrier only
// after wgmma.wait_group says the products that read the stage are complete.
//
// Exactness: tile boundaries, the tile sequence (skipped tree tiles come from a CTA-wide mask that
// both roles compute identically), chunk boundaries and merge order depend only on positions and
// the plan; a masked score is -inf (p = 0); a rescale by exactly 1 is the same bits. So a chain
// bitset equals causal mode bit for bit within this back end. Results differ from the wgmma back
// end only through the summation order inside the tensor cores (none: same tiles) and are expected
// to be identical to it in practice, but that is not promised.
#pragma once

// Parts: tree_attention/fa3_config.cuh (layout, synchronization helpers), tree_attention/fa3_producer.cuh
// (the producer's tile copies), tree_attention/fa3_consumer.cuh (a consumer's per-tile steps),
// tree_attention/fa3_epilogue.cuh (visibility words, partial stores, in-cluster and fused merges) and
// tree_attention/fa3_kernel.cuh (the kernel).
#include "ddtree/kernels/tree_attention/fa3_kernel.cuh"
