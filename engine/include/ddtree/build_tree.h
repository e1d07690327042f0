/* build_tree: DDTree draft-tree construction on the GPU (one CTA per request, no host sync).
 *
 * Semantics = the best-first heap of python/ddtree_engine/reference/build_tree.py, bit for bit, ties
 * included: node i is the i-th pop of a heap keyed on (fp64 score desc, rank tuple asc) that starts
 * at (rank 0 at depth 1, score lp[0][0]), pushes each pop's next sibling (score s - lp[r] + lp[r+1])
 * and first child (score s + lp[d][0]), and stops after M = min(max(budget[b], 0), n_max - 1) pops.
 * Ranks whose log-prob is -inf are not candidates.
 *
 * Inputs (contiguous, row-major, device memory): top_lp [B, L, K] f32 (each row sorted descending,
 * log-probs <= 0 as draft_topk_lse produces them; other rows are still handled exactly, just slower),
 * top_id [B, L, K] i32, root_token [B], ctx_len [B], budget [B] i32.
 * Outputs: node_token, node_parent, node_depth, positions, first_child, next_sibling [B, n_max] i32,
 * num_nodes [B] i32, anc [B, n_max, W] u32 with W = ceil(n_max / 32). Padding nodes: token -1,
 * parent -1, depth 0, position ctx_len, no children/siblings, anc row 0.
 *
 * Limits: 0 <= L <= 63, 1 <= K <= 32768, 1 <= n_max <= 1025 (M <= 1024), B <= 65535.
 * Launches on `stream` (a cudaStream_t), never synchronizes, allocates nothing, capturable in a graph. */
#ifndef DDTREE_BUILD_TREE_H_
#define DDTREE_BUILD_TREE_H_

#include <stdint.h>

#include "ddtree/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDTREE_BUILD_TREE_MAX_DEPTH 63
#define DDTREE_BUILD_TREE_MAX_K 32768
#define DDTREE_BUILD_TREE_MAX_NODES 1025

DDTREE_API ddtree_status_t ddtree_build_tree(
    const float* top_lp, const int32_t* top_id, const int32_t* root_token, const int32_t* ctx_len,
    const int32_t* budget, int batch, int depth, int k, int n_max, int32_t* node_token,
    int32_t* node_parent, int32_t* node_depth, int32_t* num_nodes, uint32_t* anc, int32_t* positions,
    int32_t* first_child, int32_t* next_sibling, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* DDTREE_BUILD_TREE_H_ */
