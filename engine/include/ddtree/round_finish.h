/* round_finish: the end of a DDTree round in ONE launch — tree_accept (fused plan), then, in each request's
 * last CTA, kv_commit's K/V moves for every layer and round_update's slot bookkeeping.
 *
 * Effects equal, bit for bit, those of
 *     ddtree_tree_accept_fused(...)                              (the accept outputs, same arguments)
 *     ddtree_kv_commit(k, v, ..., accept_nodes, accept_len, ctx_len)
 *     ddtree_round_update(accept_len, finished, bonus, committed_ids, accept_nodes, hid, ...)
 *     live_budget[b] = active[b] ? live_budget[b] : 0           (when live_budget is non-null)
 * where ctx_len is the accept's ctx_len argument (advanced in place; the tail's ctx_len must be the same
 * pointer). Limits: n_max <= DDTREE_TREE_ACCEPT_FUSED_MAX_NODES, num_layers <= DDTREE_ROUND_FINISH_MAX_LAYERS,
 * 2 * num_layers * kv_row_bytes / copy unit <= DDTREE_ROUND_FINISH_MAX_PAIRS (the copy unit is 16 bytes when
 * kv_row_bytes and every cache base are 16-byte aligned, else 4, else 1): one CTA per request moves the
 * rows, which is fast only for small commits; ddtree_round_finish_fits() says whether a shape qualifies.
 * Larger models use the three launches. Same counters contract as ddtree_tree_accept_fused. No
 * synchronization, no allocation; CUDA-graph capturable. */
#ifndef DDTREE_ROUND_FINISH_H_
#define DDTREE_ROUND_FINISH_H_

#include <cuda_runtime.h>

#include "ddtree/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDTREE_ROUND_FINISH_MAX_LAYERS 32
#define DDTREE_ROUND_FINISH_MAX_PAIRS 2048

typedef struct ddtree_round_tail {
  /* kv_commit: per-layer caches [num_pages, page_size, row] (v_caches may be null: K only) */
  void* const* k_caches;
  void* const* v_caches;
  int32_t num_layers;
  int32_t num_pages;
  int32_t page_size;
  int32_t max_pages;
  int64_t kv_row_bytes;
  const int32_t* block_table; /* [batch, max_pages] */
  /* round_update (see ddtree/round_update.h) */
  const void* hid; /* [batch, hid_rows, hid_row_bytes] */
  int32_t hid_rows;
  int64_t hid_row_bytes;
  uint8_t* active;
  const uint8_t* ignore_stop;
  const int32_t* max_new;
  int32_t* out_len;
  int32_t* ctx_len;
  int32_t* root;
  void* hidden; /* [batch, hid_row_bytes] */
  int32_t* r_tokens;
  int32_t tokens_width;
  int32_t* r_count;
  int32_t* r_finish;
  int32_t* live_budget; /* [batch] or null: zeroed for every slot that is not active after the round */
} ddtree_round_tail_t;

/* 1 when the fused tail takes this commit shape (layers, row bytes, copy unit as above), else 0. */
DDTREE_API int32_t ddtree_round_finish_fits(int32_t num_layers, int64_t kv_row_bytes, int32_t copy_unit);

DDTREE_API ddtree_status_t ddtree_round_finish(
    const void* target_logits, ddtree_dtype_t dtype, int32_t batch, int32_t n_max, int32_t vocab,
    int64_t batch_stride, int64_t row_stride, const int32_t* node_token, const int32_t* first_child,
    const int32_t* next_sibling, const int32_t* num_nodes, const int32_t* ctx_len, const float* temperature,
    const int64_t* seed, const int32_t* stop_ids, int32_t num_stop, int32_t max_depth, int32_t* accept_nodes,
    int32_t* accept_len, int32_t* committed_ids, int32_t* bonus, int32_t* finished, void* workspace,
    size_t workspace_bytes, const ddtree_round_tail_t* tail, uint32_t* counters, int32_t* error_flags,
    cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DDTREE_ROUND_FINISH_H_ */
