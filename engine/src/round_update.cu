// Launcher of round_update (C ABI): validates, then one launch of a CTA per slot, copying the hidden
// state with the widest unit the row size and the two base addresses allow.
#include "common.h"
#include "ddtree/kernels/round_update.cuh"
#include "ddtree/round_update.h"

namespace {
namespace k = ddtree::kernels;

template <typename U>
ddtree_status_t launch_unit(const k::RoundUpdateParams& p, int32_t batch, cudaStream_t stream) {
  return ddtree::detail::launch("round_update_kernel", k::round_update_kernel<U>, dim3(unsigned(batch)),
                                dim3(k::kRoundUpdateThreads), stream, false, p);
}

}  // namespace

extern "C" {

DDTREE_API ddtree_status_t ddtree_round_update(int32_t batch, const int32_t* accept_len, const int32_t* finished,
                                               const int32_t* bonus, const int32_t* committed_ids,
                                               int32_t committed_width, const int32_t* accept_nodes,
                                               int32_t accept_width, const void* hid, int32_t hid_rows,
                                               int64_t row_bytes, uint8_t* active, const uint8_t* ignore_stop,
                                               const int32_t* max_new, int32_t* out_len, int32_t* ctx_len,
                                               int32_t* root, void* hidden, int32_t* r_tokens, int32_t tokens_width,
                                               int32_t* r_count, int32_t* r_finish, int32_t* error_flags,
                                               cudaStream_t stream) {
  DDTREE_REQUIRE(batch >= 0, "round_update: batch must be >= 0, got %d", batch);
  if (batch == 0) return ddtree::detail::succeed();
  DDTREE_REQUIRE(committed_width >= 1 && accept_width >= 1 && hid_rows >= 1 && tokens_width >= 1,
                 "round_update: committed_width (%d), accept_width (%d), hid_rows (%d) and tokens_width (%d) must "
                 "be >= 1",
                 committed_width, accept_width, hid_rows, tokens_width);
  DDTREE_REQUIRE(row_bytes >= 1, "round_update: row_bytes must be >= 1, got %lld", static_cast<long long>(row_bytes));
  DDTREE_REQUIRE(accept_len && finished && bonus && committed_ids && accept_nodes && hid && active && ignore_stop &&
                     max_new && out_len && ctx_len && root && hidden && r_tokens && r_count && r_finish,
                 "round_update: every tensor pointer must be non-null");
  k::RoundUpdateParams p = {accept_len, finished,  bonus,  committed_ids, committed_width, accept_nodes,
                            accept_width, static_cast<const char*>(hid), hid_rows, row_bytes, active,
                            ignore_stop, max_new,   out_len, ctx_len, root, static_cast<char*>(hidden),
                            r_tokens,   tokens_width, r_count, r_finish, error_flags, nullptr};
  const uintptr_t bits = uintptr_t(row_bytes) | reinterpret_cast<uintptr_t>(hid) | reinterpret_cast<uintptr_t>(hidden);
  if (bits % 16 == 0) return launch_unit<uint4>(p, batch, stream);
  if (bits % 4 == 0) return launch_unit<uint32_t>(p, batch, stream);
  return launch_unit<uint8_t>(p, batch, stream);
}

}  // extern "C"
