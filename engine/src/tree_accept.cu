// Launcher of tree_accept (C ABI): validates, carves the workspace, launches the fused kernel (one launch)
// or the split plan's three kernels.
#include "common.h"
#include "ddtree/kernels/tree_accept.cuh"
#include "ddtree/tree_accept.h"

static_assert(DDTREE_TREE_ACCEPT_FUSED_MAX_NODES == ddtree::kernels::kAcceptFusedMaxNodes, "C ABI limit");

// The arguments both C entry points share (spelled out in ddtree/tree_accept.h), as parameters and as a
// forwarding list.
#define DDTREE_ACCEPT_PARAMS                                                                                   \
  const void *target_logits, ddtree_dtype_t dtype, int32_t batch, int32_t n_max, int32_t vocab,                \
      int64_t batch_stride, int64_t row_stride, const int32_t *node_token, const int32_t *first_child,         \
      const int32_t *next_sibling, const int32_t *num_nodes, const int32_t *ctx_len, const float *temperature, \
      const int64_t *seed, const int32_t *stop_ids, int32_t num_stop, int32_t max_depth, int32_t *accept_nodes, \
      int32_t *accept_len, int32_t *committed_ids, int32_t *bonus, int32_t *finished, void *workspace,         \
      size_t workspace_bytes
#define DDTREE_ACCEPT_ARGS                                                                                      \
  target_logits, dtype, batch, n_max, vocab, batch_stride, row_stride, node_token, first_child, next_sibling,  \
      num_nodes, ctx_len, temperature, seed, stop_ids, num_stop, max_depth, accept_nodes, accept_len,          \
      committed_ids, bonus, finished, workspace, workspace_bytes

namespace {

using ddtree::detail::align_up;
namespace k = ddtree::kernels;

int num_chunks(int32_t vocab) { return (vocab + k::kAcceptChunk - 1) / k::kAcceptChunk; }

size_t tree_bytes(int32_t batch, int32_t n_max) { return align_up(size_t(batch) * size_t(n_max) * sizeof(int32_t)); }

template <typename T>
ddtree_status_t run(const T* logits, int32_t batch, int32_t n_max, int32_t vocab, int64_t batch_stride,
                    int64_t row_stride, const int32_t* node_token, const int32_t* first_child,
                    const int32_t* next_sibling, const int32_t* num_nodes, const int32_t* ctx_len,
                    const float* temperature, const int64_t* seed, const int32_t* stop_ids, int32_t num_stop,
                    int32_t width, int32_t* accept_nodes, int32_t* accept_len, int32_t* committed_ids,
                    int32_t* bonus, int32_t* finished, void* workspace, int32_t* flags, cudaStream_t stream) {
  char* ws = static_cast<char*>(workspace);
  auto* parent = reinterpret_cast<int32_t*>(ws);
  auto* depth = reinterpret_cast<int32_t*>(ws + tree_bytes(batch, n_max));
  auto* partial = reinterpret_cast<uint64_t*>(ws + 2 * tree_bytes(batch, n_max));
  const int chunks = num_chunks(vocab);
  ddtree_status_t st = ddtree::detail::launch("tree_accept_tree_kernel", k::tree_accept_tree_kernel,
                                              dim3(unsigned(batch)), dim3(k::kAcceptWalkThreads), stream, false,
                                              first_child, next_sibling, num_nodes, n_max, parent, depth, flags);
  if (st != DDTREE_STATUS_SUCCESS) return st;
  constexpr int VN = 16 / int(sizeof(T));
  const bool vec = reinterpret_cast<uintptr_t>(logits) % 16 == 0 && row_stride % VN == 0 &&
                   (batch <= 1 || batch_stride % VN == 0);
  const dim3 grid{unsigned(chunks), unsigned(n_max), unsigned(batch)};
  st = vec ? ddtree::detail::launch("tree_accept_target_kernel", k::tree_accept_target_kernel<T, true>, grid,
                                    dim3(k::kAcceptThreads), stream, true, logits, batch_stride, row_stride, vocab,
                                    n_max, num_nodes, ctx_len, temperature, seed,
                                    static_cast<const int32_t*>(depth), chunks, partial, flags)
           : ddtree::detail::launch("tree_accept_target_kernel", k::tree_accept_target_kernel<T, false>, grid,
                                    dim3(k::kAcceptThreads), stream, true, logits, batch_stride, row_stride, vocab,
                                    n_max, num_nodes, ctx_len, temperature, seed,
                                    static_cast<const int32_t*>(depth), chunks, partial, flags);
  if (st != DDTREE_STATUS_SUCCESS) return st;
  return ddtree::detail::launch("tree_accept_walk_kernel", k::tree_accept_walk_kernel, dim3(unsigned(batch)),
                                dim3(k::kAcceptWalkThreads), stream, true, static_cast<const uint64_t*>(partial),
                                chunks, node_token, static_cast<const int32_t*>(parent), num_nodes, n_max, stop_ids,
                                num_stop, width, accept_nodes, accept_len, committed_ids, bonus, finished);
}

template <typename T>
ddtree_status_t run_fused(const T* logits, int32_t batch, int32_t n_max, int32_t vocab, int64_t batch_stride,
                          int64_t row_stride, const int32_t* node_token, const int32_t* first_child,
                          const int32_t* next_sibling, const int32_t* num_nodes, const int32_t* ctx_len,
                          const float* temperature, const int64_t* seed, const int32_t* stop_ids, int32_t num_stop,
                          int32_t width, int32_t* accept_nodes, int32_t* accept_len, int32_t* committed_ids,
                          int32_t* bonus, int32_t* finished, void* workspace, uint32_t* counters, int32_t* flags,
                          cudaStream_t stream) {
  // Same workspace layout as the split plan (parents and depths unused) so one size query serves both.
  auto* partial = reinterpret_cast<uint64_t*>(static_cast<char*>(workspace) + 2 * tree_bytes(batch, n_max));
  const int chunks = num_chunks(vocab);
  constexpr int VN = 16 / int(sizeof(T));
  const bool vec = reinterpret_cast<uintptr_t>(logits) % 16 == 0 && row_stride % VN == 0 &&
                   (batch <= 1 || batch_stride % VN == 0);
  const dim3 grid{unsigned(chunks), unsigned(n_max), unsigned(batch)};
  // Without PDL: the logits come from the model's last kernel, which does not trigger dependents early.
  if (vec)
    return ddtree::detail::launch("tree_accept_fused_kernel", k::tree_accept_fused_kernel<T, true>, grid,
                                  dim3(k::kAcceptThreads), stream, false, logits, batch_stride, row_stride, vocab,
                                  n_max, node_token, first_child, next_sibling, num_nodes, ctx_len, temperature, seed,
                                  stop_ids, num_stop, width, chunks, partial, counters, accept_nodes, accept_len,
                                  committed_ids, bonus, finished, flags);
  return ddtree::detail::launch("tree_accept_fused_kernel", k::tree_accept_fused_kernel<T, false>, grid,
                                dim3(k::kAcceptThreads), stream, false, logits, batch_stride, row_stride, vocab,
                                n_max, node_token, first_child, next_sibling, num_nodes, ctx_len, temperature, seed,
                                stop_ids, num_stop, width, chunks, partial, counters, accept_nodes, accept_len,
                                committed_ids, bonus, finished, flags);
}

// Argument checks shared by both entry points.
ddtree_status_t validate(const char* op, DDTREE_ACCEPT_PARAMS) {
  DDTREE_REQUIRE(n_max >= 1 && n_max <= 65535, "%s: n_max must be in [1, 65535], got %d", op, n_max);
  DDTREE_REQUIRE(batch <= 65535, "%s: batch must be <= 65535, got %d", op, batch);
  DDTREE_REQUIRE(vocab >= 1, "%s: vocab must be >= 1, got %d", op, vocab);
  DDTREE_REQUIRE(row_stride >= vocab, "%s: row_stride (%lld) must be >= vocab (%d)", op,
                 static_cast<long long>(row_stride), vocab);
  DDTREE_REQUIRE(batch <= 1 || batch_stride >= (int64_t(n_max) - 1) * row_stride + vocab,
                 "%s: batch_stride (%lld) overlaps the previous request's rows", op,
                 static_cast<long long>(batch_stride));
  DDTREE_REQUIRE(max_depth >= 0 && max_depth < ddtree::kernels::kAcceptMaxWidth,
                 "%s: max_depth must be in [0, %d), got %d", op, ddtree::kernels::kAcceptMaxWidth, max_depth);
  DDTREE_REQUIRE(num_stop >= 0 && (num_stop == 0 || stop_ids != nullptr),
                 "%s: stop_ids must be non-null when num_stop (%d) > 0", op, num_stop);
  DDTREE_REQUIRE(dtype == DDTREE_DTYPE_FLOAT32 || dtype == DDTREE_DTYPE_BFLOAT16,
                 "%s: target_logits must be float32 or bfloat16 (dtype code %d)", op, int(dtype));
  DDTREE_REQUIRE(target_logits != nullptr && node_token != nullptr && first_child != nullptr &&
                     next_sibling != nullptr && num_nodes != nullptr && ctx_len != nullptr &&
                     temperature != nullptr && seed != nullptr,
                 "%s: input pointers must be non-null", op);
  DDTREE_REQUIRE(accept_nodes != nullptr && accept_len != nullptr && committed_ids != nullptr && bonus != nullptr &&
                     finished != nullptr,
                 "%s: output pointers must be non-null", op);
  const size_t need = ddtree_tree_accept_workspace_size(batch, n_max, vocab);
  if (workspace == nullptr || workspace_bytes < need) {
    return ddtree::detail::fail(DDTREE_STATUS_WORKSPACE_TOO_SMALL,
                                "%s: workspace of %zu bytes given, %zu needed", op, workspace_bytes, need);
  }
  DDTREE_REQUIRE(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, "%s: workspace must be 16-byte aligned", op);
  return DDTREE_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

DDTREE_API size_t ddtree_tree_accept_workspace_size(int32_t batch, int32_t n_max, int32_t vocab) {
  if (batch <= 0 || n_max <= 0 || vocab <= 0) return 0;
  return 2 * tree_bytes(batch, n_max) +
         align_up(size_t(batch) * size_t(n_max) * size_t(num_chunks(vocab)) * sizeof(uint64_t));
}

}  // extern "C"

namespace {

// Both entry points: argument checks, then the split plan (fused = false) or the fused plan.
ddtree_status_t check_and_run(bool fused, DDTREE_ACCEPT_PARAMS, uint32_t* counters, int32_t* error_flags,
                              cudaStream_t stream) {
  const char* op = fused ? "tree_accept_fused" : "tree_accept";
  DDTREE_REQUIRE(batch >= 0, "%s: batch must be >= 0, got %d", op, batch);
  if (batch == 0) return ddtree::detail::succeed();
  if (fused) {
    DDTREE_REQUIRE(n_max <= DDTREE_TREE_ACCEPT_FUSED_MAX_NODES,
                   "tree_accept_fused: n_max must be <= %d (use ddtree_tree_accept for larger trees), got %d",
                   DDTREE_TREE_ACCEPT_FUSED_MAX_NODES, n_max);
    DDTREE_REQUIRE(counters != nullptr && reinterpret_cast<uintptr_t>(counters) % 4 == 0,
                   "tree_accept_fused: counters must be a non-null, 4-byte aligned array of batch (%d) zeros", batch);
  }
  const ddtree_status_t st = validate(op, DDTREE_ACCEPT_ARGS);
  if (st != DDTREE_STATUS_SUCCESS) return st;
  const int32_t width = max_depth + 1;
  auto launch = [&](auto* logits) {
    return fused ? run_fused(logits, batch, n_max, vocab, batch_stride, row_stride, node_token, first_child,
                             next_sibling, num_nodes, ctx_len, temperature, seed, stop_ids, num_stop, width,
                             accept_nodes, accept_len, committed_ids, bonus, finished, workspace, counters,
                             error_flags, stream)
                 : run(logits, batch, n_max, vocab, batch_stride, row_stride, node_token, first_child, next_sibling,
                       num_nodes, ctx_len, temperature, seed, stop_ids, num_stop, width, accept_nodes, accept_len,
                       committed_ids, bonus, finished, workspace, error_flags, stream);
  };
  return dtype == DDTREE_DTYPE_FLOAT32 ? launch(static_cast<const float*>(target_logits))
                                       : launch(static_cast<const __nv_bfloat16*>(target_logits));
}

}  // namespace

extern "C" {

DDTREE_API ddtree_status_t ddtree_tree_accept(DDTREE_ACCEPT_PARAMS, int32_t* error_flags, cudaStream_t stream) {
  return check_and_run(false, DDTREE_ACCEPT_ARGS, nullptr, error_flags, stream);
}

DDTREE_API ddtree_status_t ddtree_tree_accept_fused(DDTREE_ACCEPT_PARAMS, uint32_t* counters, int32_t* error_flags,
                                                    cudaStream_t stream) {
  return check_and_run(true, DDTREE_ACCEPT_ARGS, counters, error_flags, stream);
}

}  // extern "C"
