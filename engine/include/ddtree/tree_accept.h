/* tree_accept: one target token per tree node, the walk from the root along the target's choices, the
 * bonus token and stop-id truncation (semantics: engine/python/ddtree_engine/reference/tree_accept.py).
 *
 *   target_logits  fp32 or bf16; node i of request b at target_logits + b * batch_stride + i * row_stride
 *                  (strides in elements; row_stride >= vocab); all n_max rows must be readable memory,
 *                  rows i >= num_nodes[b] are never scored (the fused plan loads them before it knows)
 *   node_token, first_child, next_sibling  [batch, n_max] int32 (-1 = none)
 *   num_nodes, ctx_len [batch] int32; temperature [batch] fp32 (<= 0: greedy); seed [batch] int64
 *   stop_ids [num_stop] int32 (may be null when num_stop = 0)
 *   outputs: accept_nodes, committed_ids [batch, width] int32 (-1 padded; width = max_depth + 1 <= 1024),
 *            accept_len, bonus, finished [batch] int32
 *
 * ddtree_tree_accept: three kernel launches on `stream`, no synchronization, no allocation. The workspace
 * (size from ddtree_tree_accept_workspace_size, no initialization needed) holds parents, depths and
 * per-chunk partial argmaxes. NaN logits are skipped and set DDTREE_FLAG_NAN_INPUT; malformed child
 * lists set DDTREE_FLAG_BAD_INDEX.
 *
 * ddtree_tree_accept_fused: the same results in ONE launch (n_max <= DDTREE_TREE_ACCEPT_FUSED_MAX_NODES):
 * the last CTA of each request to finish its share of the logits does the walk. `counters` is an array of
 * `batch` uint32 that must be zero before the first call; every completed call leaves it zero again (so a
 * captured CUDA graph can replay the call). Calls that share a counter array must not run concurrently
 * (one stream, or ordered streams). Same workspace size query.
 * Above vocab 1024 (DDTREE_ACCEPT_LEAF=1|0 overrides, read per call) the fused entry reads no leaf row (node
 * i > 0 without children) unless the walk ends on it: a second kernel launch on `stream` then reads that one row
 * per request. Same outputs; a NaN in a leaf row that is not read sets no flag. The rows it reads must still
 * all be readable memory (as above). */
#ifndef DDTREE_TREE_ACCEPT_H_
#define DDTREE_TREE_ACCEPT_H_

#include <cuda_runtime.h>

#include "ddtree/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDTREE_TREE_ACCEPT_FUSED_MAX_NODES 1024

DDTREE_API size_t ddtree_tree_accept_workspace_size(int32_t batch, int32_t n_max, int32_t vocab);

DDTREE_API ddtree_status_t ddtree_tree_accept(
    const void* target_logits, ddtree_dtype_t dtype, int32_t batch, int32_t n_max, int32_t vocab,
    int64_t batch_stride, int64_t row_stride, const int32_t* node_token, const int32_t* first_child,
    const int32_t* next_sibling, const int32_t* num_nodes, const int32_t* ctx_len, const float* temperature,
    const int64_t* seed, const int32_t* stop_ids, int32_t num_stop, int32_t max_depth, int32_t* accept_nodes,
    int32_t* accept_len, int32_t* committed_ids, int32_t* bonus, int32_t* finished, void* workspace,
    size_t workspace_bytes, int32_t* error_flags, cudaStream_t stream);

DDTREE_API ddtree_status_t ddtree_tree_accept_fused(
    const void* target_logits, ddtree_dtype_t dtype, int32_t batch, int32_t n_max, int32_t vocab,
    int64_t batch_stride, int64_t row_stride, const int32_t* node_token, const int32_t* first_child,
    const int32_t* next_sibling, const int32_t* num_nodes, const int32_t* ctx_len, const float* temperature,
    const int64_t* seed, const int32_t* stop_ids, int32_t num_stop, int32_t max_depth, int32_t* accept_nodes,
    int32_t* accept_len, int32_t* committed_ids, int32_t* bonus, int32_t* finished, void* workspace,
    size_t workspace_bytes, uint32_t* counters, int32_t* error_flags, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DDTREE_TREE_ACCEPT_H_ */
