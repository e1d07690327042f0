/* qkv_prep: a model layer's step between its QKV GEMM and tree attention, in one launch: NeoX RoPE of the
 * query and key heads, q written contiguous, K/V rows written into the paged caches
 * (semantics: engine/python/ddtree_engine/reference/qkv_prep.py).
 *
 *   qkv          [T, row] in `in_dtype` (fp32 or bf16), row stride `qkv_row_stride` elements: Hq query heads,
 *                then Hkv key heads, then Hkv value heads, head_dim each (the QKV GEMM's output)
 *   cos, sin     [T, head_dim] contiguous, in `in_dtype`: rope(x)[j] = x[j] * cos[j] + x[j ^ half] * sin[j]
 *                (sin sign-folded: -sin on the first half; NeoX halves)
 *   slots        [T] int64: the cache row of each token (page * page_size + offset); a slot outside
 *                [0, cache_rows) skips that token's K/V and sets DDTREE_FLAG_BAD_INDEX in error_flags
 *   q_out        [T, Hq, head_dim] contiguous, in `out_dtype` (fp32 or bf16)
 *   k_cache, v_cache  [cache_rows, Hkv, head_dim] contiguous, in `out_dtype`
 *   error_flags  device int32 word (may be null)
 *
 * The rotation is fp32: two products and one add, each rounded, then one rounding to out_dtype.
 * head_dim must be a multiple of 2 * (16 / element size of in_dtype) (16 for bf16, 8 for fp32); every pointer
 * 16-byte aligned and qkv_row_stride * element size a multiple of 16. q_out and the caches must not overlap qkv.
 * One launch with the programmatic-dependent-launch attribute (sm_90+): it waits for its predecessor before
 * reading, and lets its dependent start at once (the dependent's own wait still sees all of our writes).
 * No synchronization, no allocation; CUDA-graph capturable. */
#ifndef DDTREE_QKV_PREP_H_
#define DDTREE_QKV_PREP_H_

#include <cuda_runtime.h>

#include "ddtree/status.h"

#ifdef __cplusplus
extern "C" {
#endif

DDTREE_API ddtree_status_t ddtree_qkv_prep(const void* qkv, int64_t qkv_row_stride, ddtree_dtype_t in_dtype,
                                           const void* cos, const void* sin, const int64_t* slots,
                                           int32_t num_tokens, int32_t num_q_heads, int32_t num_kv_heads,
                                           int32_t head_dim, void* q_out, void* k_cache, void* v_cache,
                                           int64_t cache_rows, ddtree_dtype_t out_dtype, int32_t* error_flags,
                                           cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* DDTREE_QKV_PREP_H_ */
