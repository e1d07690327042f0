/* round_update: the per-slot bookkeeping at the end of a DDTree round (after tree_accept and kv_commit),
 * in one launch. The PyTorch version is about 35 small ops (each one or more kernels inside the
 * round's CUDA graph); replacing it took the small model's round time outside the two forwards from
 * 17-22% to 11.6-13.9% on the H200 (engine/bench/NOTES.md). Semantics:
 * engine/python/ddtree_engine/reference/round_update.py.
 *
 *   accept_len, finished, bonus   [batch] int32 (tree_accept's outputs)
 *   committed_ids                 [batch, committed_width] int32; accept_nodes [batch, accept_width] int32
 *   hid                           [batch, hid_rows, row_bytes] bytes: the target's hidden state per tree node
 *   active, ignore_stop           [batch] uint8 (0/1; torch.bool); active is updated in place
 *   max_new                       [batch] int32; out_len, ctx_len, root [batch] int32, updated in place
 *   hidden                        [batch, row_bytes] bytes, updated in place (copied from hid)
 *   r_tokens [batch, tokens_width], r_count [batch], r_finish [batch] int32: written
 *
 * No synchronization, no allocation; CUDA-graph capturable. A node index outside [0, hid_rows) sets
 * DDTREE_FLAG_BAD_INDEX in error_flags and leaves that slot's hidden state unchanged. */
#ifndef DDTREE_ROUND_UPDATE_H_
#define DDTREE_ROUND_UPDATE_H_

#include <cuda_runtime.h>

#include "ddtree/status.h"

#ifdef __cplusplus
extern "C" {
#endif

DDTREE_API ddtree_status_t ddtree_round_update(int32_t batch, const int32_t* accept_len, const int32_t* finished,
                                               const int32_t* bonus, const int32_t* committed_ids,
                                               int32_t committed_width, const int32_t* accept_nodes,
                                               int32_t accept_width, const void* hid, int32_t hid_rows,
                                               int64_t row_bytes, uint8_t* active, const uint8_t* ignore_stop,
                                               const int32_t* max_new, int32_t* out_len, int32_t* ctx_len,
                                               int32_t* root, void* hidden, int32_t* r_tokens, int32_t tokens_width,
                                               int32_t* r_count, int32_t* r_finish, int32_t* error_flags,
                                               cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DDTREE_ROUND_UPDATE_H_ */
