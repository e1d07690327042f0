/* tree_attention: DDTree verification attention (GQA, paged bf16 KV cache, ancestor bitsets).
 *
 * Query t of request b is tree node i = t - qo_indptr[b] (n_b = qo_indptr[b+1] - qo_indptr[b] <= n_max
 * nodes). Key slot s of request b lives at k_cache[block_table[b][s / page_size]][s % page_size]; slots
 * [0, ctx_len[b]) are committed tokens and tree node j sits at slot ctx_len[b] + j. Query i sees every
 * committed key and tree key j < n_b iff bit j of anc[b][i] (u32 words, little-endian bits,
 * W = ceil(n_max / 32) words per row). anc == NULL selects the causal (chain) mode: node i sees nodes
 * 0..i. A query whose row has no bit among j < n_b is padding: o = 0, lse = -inf.
 *
 * Shapes (all contiguous, row-major): q, o [T, Hq, D] bf16; k_cache, v_cache [num_pages, page_size,
 * Hkv, D] bf16; qo_indptr [B+1] i32; block_table [B, max_pages] i32; ctx_len [B] i32; anc [B, n_max, W]
 * u32; lse [T, Hq] f32 (natural log of the softmax denominator of sm_scale * q.k; may be NULL).
 * D in {64, 128, 256}; Hq % Hkv == 0; sm_scale > 0.
 *
 * Work split: the key range [0, ctx_len + n_b) is cut into chunks of a fixed size by absolute position
 * (kv_chunk, or a size planned from B, Hkv, n_max, the cache capacity and the GPU's SM count when
 * kv_chunk == 0); one CTA per (row tile, chunk, kv head, request). Requests that need more than one
 * chunk are finished by a merge kernel, launched right after on the same stream, that combines the
 * chunk partials in chunk order. A query's result therefore depends only on its visible keys, their
 * positions and the plan: a chain tree equals the causal mode bit for bit.
 *
 * Scratch: `workspace` holds per-row-tile arrival counters, then fp32 partials of split row tiles (size
 * from ddtree_tree_attention_workspace_size with the same plan inputs, 0 when nothing is split). The
 * partials need no initialization. The counters (the first ddtree_tree_attention_workspace_counter_bytes
 * bytes) are read only by the opt-in fused merge of the fa3 back end (env DDTREE_TA_FA3_FUSED_MERGE=1:
 * the last CTA of a row tile split into 2-4 chunks merges it); a launch that uses them needs them zero
 * and leaves them zero again: zero a new workspace once (cudaMemset), and again before such a launch
 * whose plan has more counter bytes than the last plan that used the buffer (its partials may lie
 * there). By default, and for more chunks, a small merge kernel runs right after the main one on the
 * same stream, and the workspace needs no initialization at all.
 * Back ends: on compute capability 9.0 with a library built for sm_90a, D=128 runs by default on fa3
 * (warp-specialized producer + two ping-ponging consumer warpgroups); wgmma (same tiles and plan, one
 * schedule in lockstep) on request; otherwise mma.sync. The choice: env
 * DDTREE_TREE_ATTENTION_IMPL=mma|wgmma|fa3 (read once), overridden by ddtree_tree_attention_set_impl;
 * a back end that cannot run here (other GPU, D != 128, no sm_90a code) falls back to the default.
 * mma.sync tiles keys by 64, wgmma/fa3 by 128, so results differ by rounding between back ends; the
 * exactness statements above hold within one back end.
 * Launches on `stream`, never synchronizes, capturable in a CUDA graph. Two launches that run at once
 * (different streams) need different workspaces: they would share partials and counters.
 * Stream order (fa3 back end, programmatic dependent launch): the kernel may start while the kernel
 * launched right before it on the stream still runs, and waits for that kernel before it reads anything.
 * ddtree_tree_attention_ex with DDTREE_TA_INPUTS_READY in `flags` lets it read qo_indptr, ctx_len,
 * block_table and anc BEFORE that wait (q, the caches and every output only after), so the caller promises
 * that the kernel launched immediately before tree_attention does not write those four (in a decoding round
 * they come from many launches earlier; q and the tree's K/V may be written right before). Without the flag
 * (ddtree_tree_attention) nothing is read before the wait. DDTREE_TA_FA3_EARLY_INPUTS=1|0 overrides the flag
 * for A/B runs; DDTREE_DISABLE_PDL=1 launches without PDL. The merge kernel lets the next PDL kernel on the
 * stream start its CTAs at its entry (DDTREE_TA_MERGE_TRIGGER=0: at its exit): a PDL kernel waits before it
 * reads. Results never depend on either. */
#ifndef DDTREE_TREE_ATTENTION_H_
#define DDTREE_TREE_ATTENTION_H_

#include <stddef.h>
#include <stdint.h>

#include "ddtree/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of fp32 partials workspace the launch with these plan inputs needs (0 when no split is planned
 * or the arguments are invalid; see ddtree_last_error). Uses the current device's SM count. */
DDTREE_API size_t ddtree_tree_attention_workspace_size(int batch, int num_qo_heads, int num_kv_heads,
                                                       int head_dim, int n_max, int max_pages,
                                                       int page_size, int kv_chunk);

/* Bytes at the start of that workspace that must be zero before a launch (the arrival counters; see
 * "Scratch" above; 0 when nothing is split or the arguments are invalid). */
DDTREE_API size_t ddtree_tree_attention_workspace_counter_bytes(int batch, int num_qo_heads, int num_kv_heads,
                                                               int head_dim, int n_max, int max_pages,
                                                               int page_size, int kv_chunk);

/* Chunk size in keys (the split boundary spacing) of the plan, for tests and benches (0 on invalid
 * arguments). */
DDTREE_API int ddtree_tree_attention_plan_chunk(int batch, int num_qo_heads, int num_kv_heads,
                                                int head_dim, int n_max, int max_pages, int page_size,
                                                int kv_chunk);

/* Back ends (DDTREE_TA_IMPL_AUTO = the default choice). */
enum {
  DDTREE_TA_IMPL_AUTO = 0,
  DDTREE_TA_IMPL_MMA = 1,
  DDTREE_TA_IMPL_WGMMA = 2,
  DDTREE_TA_IMPL_FA3 = 3
};

/* Process-wide override of the back end (AUTO: back to the env var / default). Plans depend on the
 * back end: query workspace sizes after setting it, and do not change it while another thread
 * launches. */
DDTREE_API ddtree_status_t ddtree_tree_attention_set_impl(int impl);

/* 1 iff back end `impl` can run head_dim on the current device with this library. */
DDTREE_API int ddtree_tree_attention_impl_available(int impl, int head_dim);

/* The back end (DDTREE_TA_IMPL_*) a launch with this head_dim would use now. */
DDTREE_API int ddtree_tree_attention_impl_for(int head_dim);

DDTREE_API ddtree_status_t ddtree_tree_attention(
    const void* q, const void* k_cache, const void* v_cache, const int32_t* qo_indptr,
    const int32_t* block_table, const int32_t* ctx_len, const uint32_t* anc, void* o, float* lse,
    int num_tokens, int batch, int num_qo_heads, int num_kv_heads, int head_dim, int num_pages,
    int page_size, int max_pages, int n_max, float sm_scale, int kv_chunk, ddtree_dtype_t dtype,
    void* workspace, size_t workspace_bytes, void* stream);

/* Flags of ddtree_tree_attention_ex. */
#define DDTREE_TA_INPUTS_READY 1u /* qo_indptr, ctx_len, block_table, anc not written by the previous launch */

/* ddtree_tree_attention with `flags` (0 = ddtree_tree_attention; unknown bits: DDTREE_STATUS_INVALID_ARGUMENT). */
DDTREE_API ddtree_status_t ddtree_tree_attention_ex(
    const void* q, const void* k_cache, const void* v_cache, const int32_t* qo_indptr,
    const int32_t* block_table, const int32_t* ctx_len, const uint32_t* anc, void* o, float* lse,
    int num_tokens, int batch, int num_qo_heads, int num_kv_heads, int head_dim, int num_pages,
    int page_size, int max_pages, int n_max, float sm_scale, int kv_chunk, ddtree_dtype_t dtype,
    void* workspace, size_t workspace_bytes, void* stream, unsigned flags);

#ifdef __cplusplus
}
#endif

#endif /* DDTREE_TREE_ATTENTION_H_ */
