/* kv_commit: after acceptance, move each accepted node's K/V to its committed cache slot in every layer,
 * then ctx_len += accept_len (semantics: engine/python/ddtree_engine/reference/kv_commit.py).
 *
 *   k_caches, v_caches  HOST arrays of num_layers device pointers, each cache [num_pages, page_size, row]
 *                       with `row_bytes` bytes per slot (Hkv * D * element size); v_caches may be null
 *   block_table         [batch, max_pages] int32 page ids; slot s of request b is in page
 *                       block_table[b][s / page_size] at offset s % page_size
 *   accept_nodes        [batch, width] int32 (tree_accept's output; accept_nodes[b][i] >= i)
 *   accept_len          [batch] int32; ctx_len [batch] int32, updated in place
 *   counters            [batch] int32 device workspace, zero before the first call; left zero
 *
 * One kernel launch for up to 128 layers (more layers take ceil(num_layers / 128) launches), no
 * synchronization, no allocation; CUDA-graph capturable (the pointer arrays are copied into the launch).
 * Out-of-range slots/pages or accept_nodes[i] < i are skipped and set DDTREE_FLAG_BAD_INDEX. */
#ifndef DDTREE_KV_COMMIT_H_
#define DDTREE_KV_COMMIT_H_

#include <cuda_runtime.h>

#include "ddtree/status.h"

#ifdef __cplusplus
extern "C" {
#endif

DDTREE_API ddtree_status_t ddtree_kv_commit(void* const* k_caches, void* const* v_caches, int32_t num_layers,
                                            int32_t num_pages, int32_t page_size, int64_t row_bytes,
                                            const int32_t* block_table, int32_t batch, int32_t max_pages,
                                            const int32_t* accept_nodes, int32_t width, const int32_t* accept_len,
                                            int32_t* ctx_len, int32_t* counters, int32_t* error_flags,
                                            cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DDTREE_KV_COMMIT_H_ */
