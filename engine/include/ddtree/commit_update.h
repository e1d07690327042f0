/* commit_update: kv_commit and round_update in ONE launch, plus the live budget — the split round tail
 * (models whose commit does not fit round_finish) with one launch instead of two and no budget mask.
 *
 * Effects equal, bit for bit, those of
 *     ddtree_kv_commit(tail->k_caches, tail->v_caches, ..., accept_nodes, accept_len, tail->ctx_len)
 *     ddtree_round_update(batch, accept_len, finished, bonus, committed_ids, accept_nodes, tail->hid, ...)
 *     live_budget[b] = active[b] ? live_budget[b] : 0           (when tail->live_budget is non-null)
 * with the arguments tree_accept produced (accept_nodes [batch, accept_width], accept_len, finished, bonus
 * [batch], committed_ids [batch, committed_width], int32) and the caches, block table and slot state in
 * `tail` (ddtree_round_tail_t, see round_finish.h; every pointer but v_caches and live_budget non-null).
 * Limits: 0 <= num_layers <= DDTREE_COMMIT_UPDATE_MAX_LAYERS (more layers: the two ops). counters: [batch]
 * int32 device workspace, zero before the first call, left zero (kv_commit's may be shared: same stream).
 * A grid of batch x (2 * num_layers + 1) CTAs; no synchronization, no allocation; CUDA-graph capturable.
 * Bad indices set DDTREE_FLAG_BAD_INDEX as the two ops do. */
#ifndef DDTREE_COMMIT_UPDATE_H_
#define DDTREE_COMMIT_UPDATE_H_

#include <cuda_runtime.h>

#include "ddtree/round_finish.h"
#include "ddtree/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDTREE_COMMIT_UPDATE_MAX_LAYERS 128

DDTREE_API ddtree_status_t ddtree_commit_update(int32_t batch, const int32_t* accept_nodes, int32_t accept_width,
                                                const int32_t* accept_len, const int32_t* finished,
                                                const int32_t* bonus, const int32_t* committed_ids,
                                                int32_t committed_width, const ddtree_round_tail_t* tail,
                                                int32_t* counters, int32_t* error_flags, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DDTREE_COMMIT_UPDATE_H_ */
