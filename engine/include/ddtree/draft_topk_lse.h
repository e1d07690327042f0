/* draft_topk_lse: per row of draft logits, the top-k log-softmax values and token ids, and the
 * log-sum-exp of the row.
 *
 *   logits  [batch, positions, vocab] fp32 or bf16; element (b, l, v) at
 *           logits + b * batch_stride + l * row_stride + v (strides in elements, row_stride >= vocab)
 *   top_lp  [batch, positions, k] fp32: x - lse, sorted descending (by logit, ties -> lower id)
 *   top_id  [batch, positions, k] int32; ranks past vocab (vocab < k) get lp = -inf, id = -1
 *   lse     [batch, positions] fp32: log(sum exp x) over the whole row
 *
 * -inf logits are allowed (lp = -inf). A row holding NaN or +inf gets lse = NaN, lp = NaN, id = -1 and
 * sets DDTREE_FLAG_NAN_INPUT in *error_flags (if non-null). 1 <= k <= 1024, any vocab >= 1.
 * One (v4) or two (v2, v3) kernel launches on `stream`, no synchronization, no allocation: the caller
 * passes a device workspace of at least ddtree_draft_topk_lse_workspace_size() bytes (no initialization
 * needed; v4 does not touch it).
 *
 * Implementations: v4 (k <= 64 on devices with thread-block clusters, sm_90+: one launch, one cluster
 * per row that merges in distributed shared memory), v3 (k <= 64: filtered candidates, two launches) and
 * v2 (any k: radix select per chunk). ddtree_draft_topk_lse() uses v4 where it applies, else v3 for
 * k <= 16, else v2; the environment variable DDTREE_TOPK_IMPL=v2 or =v3 (read once per process) makes
 * that version the default instead. ddtree_draft_topk_lse_impl() takes the choice per call
 * (DDTREE_TOPK_IMPL_DEFAULT = as ddtree_draft_topk_lse); v4 that cannot run falls back to v3, v3 with
 * k > 64 to v2. ddtree_draft_topk_lse_resolve_impl() says which one a call with (k, impl) runs (2, 3 or 4)
 * on the current device. With DDTREE_TOPK_SMALL=1 (read once per process), default calls that resolve to
 * v4 with vocab <= 1024 run a one-warp-per-row kernel instead (opt-in: engine/bench/NOTES.md, "v7"). */
#ifndef DDTREE_DRAFT_TOPK_LSE_H_
#define DDTREE_DRAFT_TOPK_LSE_H_

#include <cuda_runtime.h>

#include "ddtree/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DDTREE_TOPK_IMPL_DEFAULT 0
#define DDTREE_TOPK_IMPL_V2 2
#define DDTREE_TOPK_IMPL_V3 3
#define DDTREE_TOPK_IMPL_V4 4

DDTREE_API size_t ddtree_draft_topk_lse_workspace_size(int32_t batch, int32_t positions, int32_t vocab, int32_t k);

DDTREE_API ddtree_status_t ddtree_draft_topk_lse(const void* logits, ddtree_dtype_t dtype, int32_t batch,
                                                 int32_t positions, int32_t vocab, int64_t batch_stride,
                                                 int64_t row_stride, int32_t k, float* top_lp, int32_t* top_id,
                                                 float* lse, void* workspace, size_t workspace_bytes,
                                                 int32_t* error_flags, cudaStream_t stream);

DDTREE_API ddtree_status_t ddtree_draft_topk_lse_impl(const void* logits, ddtree_dtype_t dtype, int32_t batch,
                                                      int32_t positions, int32_t vocab, int64_t batch_stride,
                                                      int64_t row_stride, int32_t k, float* top_lp, int32_t* top_id,
                                                      float* lse, void* workspace, size_t workspace_bytes,
                                                      int32_t* error_flags, cudaStream_t stream, int32_t impl);

DDTREE_API int32_t ddtree_draft_topk_lse_resolve_impl(int32_t k, int32_t impl);

#ifdef __cplusplus
}
#endif

#endif /* DDTREE_DRAFT_TOPK_LSE_H_ */
