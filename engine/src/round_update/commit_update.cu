// Launcher of commit_update (C ABI): validates like kv_commit and round_update, packs the layer pointers,
// picks the K/V copy unit (template) and the hidden-state copy unit (a run-time switch in the one CTA that
// copies it) from the row sizes and base addresses.
#include <cstdlib>

#include "common.h"
#include "ddtree/commit_update.h"
#include "ddtree/kernels/commit_update.cuh"

namespace {
namespace k = ddtree::kernels;

int copy_unit(uintptr_t bits) { return bits % 16 == 0 ? 16 : bits % 4 == 0 ? 4 : 1; }

// DDTREE_COMMIT_UPDATE_PDL=1: launch with programmatic dependent launch (the launch overlaps the end of the
// previous kernel, tree_accept in the round); off by default (session 11, s11tail: an A/B in the round).
bool commit_update_pdl() {
  const char* e = std::getenv("DDTREE_COMMIT_UPDATE_PDL");
  return e != nullptr && e[0] == '1' && e[1] == 0;
}

// DDTREE_COMMIT_UPDATE_TILE=16: session 11's 16-row K/V pass (kCommitTile) instead of kCommitUpdateTile's 8, for
// an A/B in one process (session 12, s12tail).
bool commit_update_tile16() {
  const char* e = std::getenv("DDTREE_COMMIT_UPDATE_TILE");
  return e != nullptr && e[0] == '1' && e[1] == '6' && e[2] == 0;
}

template <typename U>
ddtree_status_t launch_unit(const k::CommitLayers& layers, const ddtree_round_tail_t& t, int32_t batch,
                            const k::RoundUpdateParams& p, int hid_unit, int32_t* counters, cudaStream_t stream) {
  auto kernel = commit_update_tile16() ? k::commit_update_kernel<U, k::kCommitTile> : k::commit_update_kernel<U>;
  return ddtree::detail::launch("commit_update_kernel", kernel,
                                dim3(unsigned(batch), unsigned(2 * t.num_layers + 1)), dim3(k::kCommitThreads),
                                stream, commit_update_pdl(), layers, t.num_layers, t.num_pages, t.page_size,
                                t.kv_row_bytes, t.block_table, t.max_pages, p, hid_unit, t.ctx_len, counters);
}

}  // namespace

extern "C" {

DDTREE_API ddtree_status_t ddtree_commit_update(int32_t batch, const int32_t* accept_nodes, int32_t accept_width,
                                                const int32_t* accept_len, const int32_t* finished,
                                                const int32_t* bonus, const int32_t* committed_ids,
                                                int32_t committed_width, const ddtree_round_tail_t* tail,
                                                int32_t* counters, int32_t* error_flags, cudaStream_t stream) {
  DDTREE_REQUIRE(tail != nullptr, "commit_update: tail must be non-null");
  const ddtree_round_tail_t& t = *tail;
  DDTREE_REQUIRE(batch >= 0 && batch <= 65535, "commit_update: batch must be in [0, 65535], got %d", batch);
  DDTREE_REQUIRE(t.num_layers >= 0 && t.num_layers <= DDTREE_COMMIT_UPDATE_MAX_LAYERS,
                 "commit_update: num_layers must be in [0, %d], got %d", DDTREE_COMMIT_UPDATE_MAX_LAYERS,
                 t.num_layers);
  if (batch == 0) return ddtree::detail::succeed();
  DDTREE_REQUIRE(t.num_pages >= 1 && t.page_size >= 1 && t.max_pages >= 1 && accept_width >= 1 &&
                     committed_width >= 1 && t.hid_rows >= 1 && t.tokens_width >= 1,
                 "commit_update: num_pages, page_size, max_pages, accept_width, committed_width, hid_rows and "
                 "tokens_width must be >= 1");
  DDTREE_REQUIRE(t.kv_row_bytes >= 1 && t.hid_row_bytes >= 1, "commit_update: row sizes must be >= 1");
  DDTREE_REQUIRE(accept_nodes && accept_len && finished && bonus && committed_ids && counters && t.block_table &&
                     t.hid && t.active && t.ignore_stop && t.max_new && t.out_len && t.ctx_len && t.root &&
                     t.hidden && t.r_tokens && t.r_count && t.r_finish && (t.num_layers == 0 || t.k_caches),
                 "commit_update: every pointer but v_caches and live_budget must be non-null");
  k::CommitLayers layers = {};
  uintptr_t kv_bits = uintptr_t(t.kv_row_bytes);
  for (int l = 0; l < t.num_layers; ++l) {
    layers.k[l] = static_cast<char*>(t.k_caches[l]);
    layers.v[l] = t.v_caches != nullptr ? static_cast<char*>(t.v_caches[l]) : nullptr;
    DDTREE_REQUIRE(layers.k[l] != nullptr && (t.v_caches == nullptr || layers.v[l] != nullptr),
                   "commit_update: cache pointer of layer %d is null", l);
    kv_bits |= reinterpret_cast<uintptr_t>(layers.k[l]) | reinterpret_cast<uintptr_t>(layers.v[l]);
  }
  // ctx_len null: the kernel folds round_update's undo of the advance into its one ctx_len write.
  const k::RoundUpdateParams p = {accept_len, finished, bonus, committed_ids, committed_width, accept_nodes,
                                  accept_width, static_cast<const char*>(t.hid), t.hid_rows, t.hid_row_bytes,
                                  t.active, t.ignore_stop, t.max_new, t.out_len, nullptr, t.root,
                                  static_cast<char*>(t.hidden), t.r_tokens, t.tokens_width, t.r_count, t.r_finish,
                                  error_flags, t.live_budget};
  const int hid_unit = copy_unit(uintptr_t(t.hid_row_bytes) | reinterpret_cast<uintptr_t>(t.hid) |
                                 reinterpret_cast<uintptr_t>(t.hidden));
  switch (copy_unit(kv_bits)) {
    case 16: return launch_unit<uint4>(layers, t, batch, p, hid_unit, counters, stream);
    case 4: return launch_unit<uint32_t>(layers, t, batch, p, hid_unit, counters, stream);
    default: return launch_unit<uint8_t>(layers, t, batch, p, hid_unit, counters, stream);
  }
}

}  // extern "C"
