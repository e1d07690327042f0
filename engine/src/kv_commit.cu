// Launcher of kv_commit (C ABI): validates, packs the layer pointers into the launch, picks the widest
// copy unit the row size and alignment allow.
#include <algorithm>

#include "common.h"
#include "ddtree/kernels/kv_commit.cuh"
#include "ddtree/kv_commit.h"

namespace {
namespace k = ddtree::kernels;

template <typename U>
ddtree_status_t launch_unit(const k::CommitLayers& layers, int n_layers, int32_t num_pages, int32_t page_size,
                            int64_t row_bytes, const int32_t* block_table, int32_t batch, int32_t max_pages,
                            const int32_t* accept_nodes, int32_t width, const int32_t* accept_len, int32_t* ctx_len,
                            int32_t* counters, int update_ctx, int32_t* flags, cudaStream_t stream) {
  return ddtree::detail::launch("kv_commit_kernel", k::kv_commit_kernel<U>,
                                dim3(unsigned(batch), unsigned(2 * n_layers)), dim3(k::kCommitThreads), stream, false,
                                layers, n_layers, num_pages, page_size, row_bytes, block_table, max_pages,
                                accept_nodes, width, accept_len, ctx_len, counters, update_ctx, flags);
}

}  // namespace

extern "C" {

DDTREE_API ddtree_status_t ddtree_kv_commit(void* const* k_caches, void* const* v_caches, int32_t num_layers,
                                            int32_t num_pages, int32_t page_size, int64_t row_bytes,
                                            const int32_t* block_table, int32_t batch, int32_t max_pages,
                                            const int32_t* accept_nodes, int32_t width, const int32_t* accept_len,
                                            int32_t* ctx_len, int32_t* counters, int32_t* error_flags,
                                            cudaStream_t stream) {
  DDTREE_REQUIRE(batch >= 0 && num_layers >= 0, "kv_commit: batch (%d) and num_layers (%d) must be >= 0", batch,
                 num_layers);
  if (batch == 0) return ddtree::detail::succeed();
  DDTREE_REQUIRE(batch <= 65535, "kv_commit: batch must be <= 65535, got %d", batch);
  DDTREE_REQUIRE(num_pages >= 1 && page_size >= 1 && max_pages >= 1 && width >= 1,
                 "kv_commit: num_pages (%d), page_size (%d), max_pages (%d) and width (%d) must be >= 1", num_pages,
                 page_size, max_pages, width);
  DDTREE_REQUIRE(row_bytes >= 1, "kv_commit: row_bytes must be >= 1, got %lld", static_cast<long long>(row_bytes));
  DDTREE_REQUIRE(block_table != nullptr && accept_nodes != nullptr && accept_len != nullptr && ctx_len != nullptr &&
                     counters != nullptr,
                 "kv_commit: block_table, accept_nodes, accept_len, ctx_len and counters must be non-null");
  DDTREE_REQUIRE(num_layers == 0 || k_caches != nullptr, "kv_commit: k_caches must be non-null");
  // The widest unit that divides the row and every cache's base address.
  uintptr_t align_bits = uintptr_t(row_bytes);
  for (int l = 0; l < num_layers; ++l) {
    DDTREE_REQUIRE(k_caches[l] != nullptr && (v_caches == nullptr || v_caches[l] != nullptr),
                   "kv_commit: cache pointer of layer %d is null", l);
    align_bits |= reinterpret_cast<uintptr_t>(k_caches[l]);
    if (v_caches != nullptr) align_bits |= reinterpret_cast<uintptr_t>(v_caches[l]);
  }
  const int unit = (align_bits % 16 == 0) ? 16 : (align_bits % 4 == 0) ? 4 : 1;
  if (num_layers == 0) {
    // Nothing to move, but ctx_len still advances: one launch with no cache work.
    k::CommitLayers layers = {};
    return launch_unit<uint8_t>(layers, 0 + 1, num_pages, page_size, row_bytes, block_table, batch, max_pages,
                                accept_nodes, width, accept_len, ctx_len, counters, 1, error_flags, stream);
  }
  for (int first = 0; first < num_layers; first += k::kCommitMaxLayers) {
    const int n_layers = std::min(k::kCommitMaxLayers, num_layers - first);
    k::CommitLayers layers = {};
    for (int l = 0; l < n_layers; ++l) {
      layers.k[l] = static_cast<char*>(k_caches[first + l]);
      layers.v[l] = v_caches != nullptr ? static_cast<char*>(v_caches[first + l]) : nullptr;
    }
    const int update = first + n_layers == num_layers;  // only the last launch advances ctx_len
    ddtree_status_t st;
    if (unit == 16)
      st = launch_unit<uint4>(layers, n_layers, num_pages, page_size, row_bytes, block_table, batch, max_pages,
                              accept_nodes, width, accept_len, ctx_len, counters, update, error_flags, stream);
    else if (unit == 4)
      st = launch_unit<uint32_t>(layers, n_layers, num_pages, page_size, row_bytes, block_table, batch, max_pages,
                                 accept_nodes, width, accept_len, ctx_len, counters, update, error_flags, stream);
    else
      st = launch_unit<uint8_t>(layers, n_layers, num_pages, page_size, row_bytes, block_table, batch, max_pages,
                                accept_nodes, width, accept_len, ctx_len, counters, update, error_flags, stream);
    if (st != DDTREE_STATUS_SUCCESS) return st;
  }
  return ddtree::detail::succeed();
}

}  // extern "C"
