// Launcher of draft_topk_lse (C ABI): validates, sizes the workspace, launches phase 1 and phase 2.
#include "common.h"
#include "ddtree/draft_topk_lse.h"
#include "ddtree/kernels/draft_topk_lse.cuh"

namespace {

using ddtree::detail::align_up;
namespace k = ddtree::kernels;

int64_t num_chunks(int32_t vocab) { return (int64_t(vocab) + k::kTopkChunk - 1) / k::kTopkChunk; }

size_t cand_bytes(int64_t rows, int32_t vocab, int32_t topk) {
  return align_up(size_t(rows) * size_t(num_chunks(vocab)) * size_t(topk) * sizeof(uint64_t));
}
size_t partial_bytes(int64_t rows, int32_t vocab) {
  return align_up(size_t(rows) * size_t(num_chunks(vocab)) * sizeof(float2));
}

template <typename T>
ddtree_status_t run(const T* logits, int32_t batch, int32_t positions, int32_t vocab, int64_t batch_stride,
                    int64_t row_stride, int32_t topk, float* top_lp, int32_t* top_id, float* lse, void* workspace,
                    int32_t* error_flags, cudaStream_t stream) {
  const int64_t rows = int64_t(batch) * positions;
  const int chunks = int(num_chunks(vocab));
  auto* cand = static_cast<uint64_t*>(workspace);
  auto* partial = reinterpret_cast<float2*>(static_cast<char*>(workspace) + cand_bytes(rows, vocab, topk));
  constexpr int VN = 16 / int(sizeof(T));
  const bool vec = reinterpret_cast<uintptr_t>(logits) % 16 == 0 && row_stride % VN == 0 &&
                   (batch <= 1 || batch_stride % VN == 0);
  const dim3 grid1{unsigned(chunks), unsigned(rows), 1u};
  ddtree_status_t st =
      vec ? ddtree::detail::launch("draft_topk_partial_kernel", k::draft_topk_partial_kernel<T, true>, grid1,
                                   dim3(k::kTopkThreads), stream, false, logits, positions, vocab, batch_stride,
                                   row_stride, topk, chunks, cand, partial, error_flags)
          : ddtree::detail::launch("draft_topk_partial_kernel", k::draft_topk_partial_kernel<T, false>, grid1,
                                   dim3(k::kTopkThreads), stream, false, logits, positions, vocab, batch_stride,
                                   row_stride, topk, chunks, cand, partial, error_flags);
  if (st != DDTREE_STATUS_SUCCESS) return st;
  return ddtree::detail::launch("draft_topk_merge_kernel", k::draft_topk_merge_kernel, dim3(unsigned(rows)),
                                dim3(k::kTopkMergeThreads), stream, true, static_cast<const uint64_t*>(cand),
                                static_cast<const float2*>(partial), chunks, topk, vocab, top_lp, top_id, lse);
}

}  // namespace

extern "C" {

DDTREE_API size_t ddtree_draft_topk_lse_workspace_size(int32_t batch, int32_t positions, int32_t vocab, int32_t k) {
  if (batch <= 0 || positions <= 0 || vocab <= 0 || k <= 0) return 0;
  const int64_t rows = int64_t(batch) * positions;
  return cand_bytes(rows, vocab, k) + partial_bytes(rows, vocab);
}

DDTREE_API ddtree_status_t ddtree_draft_topk_lse(const void* logits, ddtree_dtype_t dtype, int32_t batch,
                                                 int32_t positions, int32_t vocab, int64_t batch_stride,
                                                 int64_t row_stride, int32_t k, float* top_lp, int32_t* top_id,
                                                 float* lse, void* workspace, size_t workspace_bytes,
                                                 int32_t* error_flags, cudaStream_t stream) {
  DDTREE_REQUIRE(batch >= 0 && positions >= 0, "draft_topk_lse: batch (%d) and positions (%d) must be >= 0",
                 batch, positions);
  DDTREE_REQUIRE(vocab >= 1, "draft_topk_lse: vocab must be >= 1, got %d", vocab);
  DDTREE_REQUIRE(k >= 1 && k <= ddtree::kernels::kTopkMaxK, "draft_topk_lse: k must be in [1, %d], got %d",
                 ddtree::kernels::kTopkMaxK, k);
  DDTREE_REQUIRE(row_stride >= vocab, "draft_topk_lse: row_stride (%lld) must be >= vocab (%d)",
                 static_cast<long long>(row_stride), vocab);
  DDTREE_REQUIRE(batch <= 1 || batch_stride >= (int64_t(positions) - 1) * row_stride + vocab,
                 "draft_topk_lse: batch_stride (%lld) overlaps the previous request's rows",
                 static_cast<long long>(batch_stride));
  DDTREE_REQUIRE(dtype == DDTREE_DTYPE_FLOAT32 || dtype == DDTREE_DTYPE_BFLOAT16,
                 "draft_topk_lse: logits must be float32 or bfloat16 (dtype code %d)", int(dtype));
  const int64_t rows = int64_t(batch) * positions;
  if (rows == 0) return ddtree::detail::succeed();
  DDTREE_REQUIRE(rows <= 65535, "draft_topk_lse: batch * positions (%lld) must be <= 65535",
                 static_cast<long long>(rows));
  DDTREE_REQUIRE(logits != nullptr && top_lp != nullptr && top_id != nullptr && lse != nullptr,
                 "draft_topk_lse: logits, top_lp, top_id and lse must be non-null");
  const size_t need = ddtree_draft_topk_lse_workspace_size(batch, positions, vocab, k);
  if (workspace == nullptr || workspace_bytes < need) {
    return ddtree::detail::fail(DDTREE_STATUS_WORKSPACE_TOO_SMALL,
                                "draft_topk_lse: workspace of %zu bytes given, %zu needed", workspace_bytes, need);
  }
  DDTREE_REQUIRE(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, "draft_topk_lse: workspace must be 16-byte aligned");
  if (dtype == DDTREE_DTYPE_FLOAT32) {
    return run(static_cast<const float*>(logits), batch, positions, vocab, batch_stride, row_stride, k, top_lp,
               top_id, lse, workspace, error_flags, stream);
  }
  return run(static_cast<const __nv_bfloat16*>(logits), batch, positions, vocab, batch_stride, row_stride, k, top_lp,
             top_id, lse, workspace, error_flags, stream);
}

}  // extern "C"
