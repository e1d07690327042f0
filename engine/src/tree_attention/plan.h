// tree_attention's launcher, split in two translation units that share this private header:
//   src/tree_attention/plan.cu  which back end runs, the key-range split plan and the workspace size, with
//                               the C ABI entries that only plan (no kernel in this unit);
//   src/tree_attention.cu       everything that names a kernel: per-device preparation (shared memory
//                               limit, occupancy), the launches, and ddtree_tree_attention itself.
// The kernels live only in the second unit: every unit that included tree_attention_fa3_kernel's header and
// named its instances would compile another copy of them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddtree/status.h"
#include "ddtree/tree_attention.h"

namespace ddtree {
namespace tree_attention_launch {

struct Plan {
  int bm = 0, bn = 0, row_tiles = 0, num_splits = 0, chunk = 0;
  int impl = DDTREE_TA_IMPL_MMA;
  bool cluster_merge = false;  // fa3: merge the splits inside a cluster (see fa3_cluster_merge_fits)
  bool fused_merge = false;    // fa3: the last CTA of a split row tile merges it (see fa3_fused_merge_enabled)
  // Workspace layout: [arrival counters, zero between launches][fp32 partial O][fp32 partial (m, l)].
  size_t cnt_bytes = 0, part_o_bytes = 0, part_ml_bytes = 0;
  size_t workspace() const { return cnt_bytes + part_o_bytes + part_ml_bytes; }
};

// plan.cu: the plan of a call (validates the shape; prepares the chosen kernel on this device).
ddtree_status_t make_plan(int batch, int hq, int hkv, int d, int n_max, int max_pages, int page_size,
                          int kv_chunk, Plan* plan);
// plan.cu: fa3 v10 switches read on every launch (see there).
bool fa3_lazy_mask_enabled();
bool fa3_strided_schedule();
bool fa3_early_inputs(bool inputs_ready);
bool merge_early_trigger();
int fa3_balance_weight();
bool fa3_lpt_order(bool helps);

// tree_attention.cu: raises the chosen kernel's dynamic shared-memory limit (once per device) and returns
// its CTAs per SM.
ddtree_status_t prepare_for(int d, int impl, int* ctas_per_sm);
// tree_attention.cu: how many fa3 clusters of `size` CTAs fit on this device at once (0 = none or unknown).
int fa3_max_active_clusters(int size);

}  // namespace tree_attention_launch
}  // namespace ddtree
