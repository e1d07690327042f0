// tree_attention, the planning half of the launcher (src/tree_attention/plan.h says why it is split): which
// back end runs, the key-range split plan, the workspace size, and the C ABI entries that need only these.
// No kernel is compiled here: the Fa3Config / WgmmaConfig128 constants come from headers whose kernels
// are templates, instantiated only by src/tree_attention.cu.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common.h"
#include "ddtree/kernels/tree_attention/fa3_config.cuh"
#include "ddtree/tree_attention.h"
#include "tree_attention/plan.h"

namespace {

using ddtree::tree_attention_launch::fa3_max_active_clusters;
using ddtree::tree_attention_launch::make_plan;
using ddtree::tree_attention_launch::Plan;
using ddtree::tree_attention_launch::prepare_for;
namespace ta = ddtree::tree_attn;

// Smallest chunk the planner makes: below this the partial write + merge costs about as much as
// reading the chunk's K/V.
constexpr int kMinChunk = 256;

// The library holds sm_90a code (wgmma) iff CMake built it for "90a" (DDTREE_CUDA_ARCHS_STRING
// names the archs of this very build), so no device query or sync is needed to choose.
#ifndef DDTREE_CUDA_ARCHS_STRING
#define DDTREE_CUDA_ARCHS_STRING ""
#endif
constexpr bool archs_have_sm90a(const char* s) {
  for (; *s; ++s)
    if (s[0] == '9' && s[1] == '0' && s[2] == 'a') return true;
  return false;
}
constexpr bool kLibHasSm90a = archs_have_sm90a(DDTREE_CUDA_ARCHS_STRING);

// Back end requested by env DDTREE_TREE_ATTENTION_IMPL (mma | wgmma | fa3; read once), overridden by
// ddtree_tree_attention_set_impl. AUTO = the default: wgmma where available, else mma.sync.
int env_impl() {
  static const int v = [] {
    const char* e = std::getenv("DDTREE_TREE_ATTENTION_IMPL");
    if (e == nullptr) return static_cast<int>(DDTREE_TA_IMPL_AUTO);
    if (std::strcmp(e, "mma") == 0) return static_cast<int>(DDTREE_TA_IMPL_MMA);
    if (std::strcmp(e, "wgmma") == 0) return static_cast<int>(DDTREE_TA_IMPL_WGMMA);
    if (std::strcmp(e, "fa3") == 0) return static_cast<int>(DDTREE_TA_IMPL_FA3);
    return static_cast<int>(DDTREE_TA_IMPL_AUTO);
  }();
  return v;
}
std::atomic<int> g_impl_override{DDTREE_TA_IMPL_AUTO};

// wgmma and fa3 need D = 128, a library with sm_90a code and a device of compute capability 9.0.
bool sm90a_available(int d) {
  if (!kLibHasSm90a || d != 128) return false;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major == 9 && minor == 0;
}

bool impl_available(int impl, int d) {
  if (impl == DDTREE_TA_IMPL_MMA) return d == 64 || d == 128 || d == 256;
  if (impl == DDTREE_TA_IMPL_WGMMA || impl == DDTREE_TA_IMPL_FA3) return sm90a_available(d);
  return false;
}

// The back end a launch with head_dim d uses now: the requested one when it can run, else the
// default (wgmma where available, else mma.sync).
int resolve_impl(int d) {
  int req = g_impl_override.load(std::memory_order_relaxed);
  if (req == DDTREE_TA_IMPL_AUTO) req = env_impl();
  if (req == DDTREE_TA_IMPL_MMA) return DDTREE_TA_IMPL_MMA;
  const int wgmma_or_mma = impl_available(DDTREE_TA_IMPL_WGMMA, d) ? DDTREE_TA_IMPL_WGMMA : DDTREE_TA_IMPL_MMA;
  if (req == DDTREE_TA_IMPL_WGMMA) return wgmma_or_mma;
  // AUTO (and FA3): fa3 where it can run. On the H200 it passed every selftest and GPU test and was
  // 2-15% faster than wgmma at every bench shape, with identical outputs there (engine/bench/NOTES.md).
  return impl_available(DDTREE_TA_IMPL_FA3, d) ? DDTREE_TA_IMPL_FA3 : wgmma_or_mma;
}

// fa3 split merge through distributed shared memory (opt-in: DDTREE_TA_CLUSTER_MERGE=1): the
// num_splits CTAs of a row tile form one thread-block cluster and merge in the kernel, so the fp32
// partials never leave the SMs and the merge kernel is not launched. Used when the switch is set,
// 2 <= num_splits <= 8 (portable cluster size) and every cluster of the grid can be resident at once
// (cudaOccupancyMaxActiveClusters, cached per device and size). Off by default because it measured
// slower on the H200 (engine/bench/NOTES.md, tree_attention v9): 8/1 x 512 x 4k at 2 and 3 chunks
// +2.8 and +1.4 µs against the merge kernel, and the planned 4 chunks (32 clusters of 4) do not fit
// one wave there, so the plan never took it. The switch is read on every plan (not once) so that a
// test can compare both merges in one process; they compute the same bits (cluster_merge_epilogue).
bool cluster_merge_enabled() {
  const char* e = std::getenv("DDTREE_TA_CLUSTER_MERGE");
  return e != nullptr && std::strcmp(e, "1") == 0;
}
// fa3 v10, opt-in (DDTREE_TA_FA3_FUSED_MERGE=1, read on every plan like the cluster switch, so that a
// test or bench can compare both merges in one process): a row tile split into 2..MAX_FUSED_SPLITS
// chunks is merged by the last of its CTAs to finish (fused_merge_epilogue), and no merge kernel runs.
// Off by default because it measured slower on the H200 (engine/bench/NOTES.md, v10): its merging CTA
// reads (nact - 1) x 64 KB of partials on one SM, a ~5-6 µs tail at 4 chunks, where the merge kernel
// spreads the same reads over every SM (8/1 x 512 x 4k: 28.5 vs 27.0 µs). Both compute the same bits.
bool fa3_fused_merge_enabled() {
  const char* e = std::getenv("DDTREE_TA_FA3_FUSED_MERGE");
  return e != nullptr && std::strcmp(e, "1") == 0;
}
bool fa3_cluster_merge_fits(int num_splits, int64_t clusters) {
  if (num_splits < 2 || num_splits > ta::Fa3Config::MAX_CLUSTER || !cluster_merge_enabled()) return false;
  return clusters <= fa3_max_active_clusters(num_splits);
}

ddtree_status_t check_shape(int batch, int hq, int hkv, int d, int n_max, int max_pages, int page_size,
                            int kv_chunk) {
  DDTREE_REQUIRE(batch >= 0 && batch <= 65535, "tree_attention: batch %d out of [0, 65535]", batch);
  DDTREE_REQUIRE(hkv >= 1 && hkv <= 65535 && hq >= hkv && hq % hkv == 0,
                 "tree_attention: num_qo_heads %d must be a positive multiple of num_kv_heads %d", hq, hkv);
  DDTREE_REQUIRE(d == 64 || d == 128 || d == 256, "tree_attention: head_dim %d not in {64, 128, 256}", d);
  const int bn = d == 256 ? 32 : 64;
  DDTREE_REQUIRE(n_max >= 1 && n_max <= 62 * bn,
                 "tree_attention: n_max %d out of [1, %d] for head_dim %d", n_max, 62 * bn, d);
  DDTREE_REQUIRE(page_size >= 1 && max_pages >= 1, "tree_attention: page_size %d / max_pages %d must be >= 1",
                 page_size, max_pages);
  DDTREE_REQUIRE(static_cast<int64_t>(page_size) * max_pages <= (int64_t{1} << 30),
                 "tree_attention: page_size * max_pages = %lld keys per request is too large",
                 static_cast<long long>(page_size) * max_pages);
  DDTREE_REQUIRE(kv_chunk >= 0, "tree_attention: kv_chunk %d must be >= 0 (0 = planned)", kv_chunk);
  return DDTREE_STATUS_SUCCESS;
}

}  // namespace

namespace ddtree {
namespace tree_attention_launch {

// fa3 v10: the tile mask is waited for lazily (default); DDTREE_TA_FA3_LAZY_MASK=0 (read per launch)
// makes every thread wait for it after the prologue, as v9b's __syncthreads did.
bool fa3_lazy_mask_enabled() {
  const char* e = std::getenv("DDTREE_TA_FA3_LAZY_MASK");
  return e == nullptr || std::strcmp(e, "0") != 0;
}
// fa3 v17 (session 9): the tile schedule of a split request. DDTREE_TA_FA3_SCHEDULE=strided (split s takes
// every nact-th tile, the tree tiles one to a split: fa3_strided_first) or =chunked (v10's contiguous chunks),
// read per launch so that one library can A/B both; unset = the build's default, DDTREE_TA_FA3_STRIDED_DEFAULT
// (a compile definition, 1 = strided). Strided is the default because it measured faster on the H200 where it
// acts (8/1 x 512 x 4k: 26.5-26.9 -> 24.9-25.5 µs against the chunked instance and main's v10 library in
// alternating rounds in one process) and within 0.98-1.02 at the other bench shapes (engine/bench/NOTES.md,
// "### v17"). The two schedules visit the same tiles in other groupings, so their results differ by rounding,
// not by math; at one split (64/8 x 512) they are the same tile walk and the same bits.
#ifndef DDTREE_TA_FA3_STRIDED_DEFAULT
#define DDTREE_TA_FA3_STRIDED_DEFAULT 1
#endif
bool fa3_strided_schedule() {
  const char* e = std::getenv("DDTREE_TA_FA3_SCHEDULE");
  if (e != nullptr && std::strcmp(e, "strided") == 0) return true;
  if (e != nullptr && std::strcmp(e, "chunked") == 0) return false;
  return DDTREE_TA_FA3_STRIDED_DEFAULT != 0;
}
// fa3 v18 (session 10): the strided instance that reads qo_indptr, ctx_len, the block table and the ancestor
// words before its PDL wait (tree_attention_fa3_kernel's kEarlyInputs) runs only when the caller says those
// inputs are ready (DDTREE_TA_INPUTS_READY in ddtree_tree_attention_ex's flags: the kernel launched right before
// does not write them); DDTREE_TA_FA3_EARLY_INPUTS=1|0 (read per launch) overrides that for A/B runs. The merge
// kernel that lets the next PDL kernel launch from its entry (kEarlyTrigger) is the default (DDTREE_TA_MERGE_TRIGGER
// =0 or the build's DDTREE_TA_MERGE_TRIGGER_DEFAULT=0: at its exit): every PDL kernel of this library waits before
// it reads what the merge wrote. Neither changes a result bit: only when the next grid's CTAs may start. Measured
// on the H200 in one process against both off (v17's launch sequence) and main's library: 8/1 x 512 x 4k
// 25.0-25.2 -> 24.4-24.5 µs with both, back to back (each call after the previous call's merge kernel), 8/1 x 64 x 4k
// 15.0-15.2 -> 13.6-13.8, the trigger alone 0.1-0.6 µs, the other shapes within 0.98-1.03 (engine/bench/NOTES.md,
// "### v18"). After a torch kernel, as in a model layer today, both measured 0.993-1.006: torch kernels never let
// a PDL successor start early.
#ifndef DDTREE_TA_MERGE_TRIGGER_DEFAULT
#define DDTREE_TA_MERGE_TRIGGER_DEFAULT 1
#endif
static bool env_flag(const char* name, bool dflt) {
  const char* e = std::getenv(name);
  if (e != nullptr && std::strcmp(e, "1") == 0) return true;
  if (e != nullptr && std::strcmp(e, "0") == 0) return false;
  return dflt;
}
bool fa3_early_inputs(bool inputs_ready) { return env_flag("DDTREE_TA_FA3_EARLY_INPUTS", inputs_ready); }
bool merge_early_trigger() { return env_flag("DDTREE_TA_MERGE_TRIGGER", DDTREE_TA_MERGE_TRIGGER_DEFAULT != 0); }
// fa3 v21 (session 12): the longest row tiles first (Params::lpt_order). At 64/8 x 512 x 4k the 256 CTAs are two
// waves on 132 SMs, a row tile's cost grows with its index (later tree nodes see more tree tiles: 33-36 tile
// costs), and in index order the last CTAs handed out are the costliest, so the grid ends on a tail (ncu: SMs
// active 89% of the kernel; 93% with this order: 142.9 -> 135.6 µs against main's library). With it on, the host
// takes it only where it measured faster: a grid of more than one wave whose K and V fit in half the L2 (`helps`,
// from launch_fa3). At 64/8 x 512 x 64k (270 MB of K/V) it read 1.4-1.6% slower: a head's CTAs then run in both
// waves, so its K/V stream from DRAM twice. On by default where `helps` (DDTREE_TA_FA3_LPT_DEFAULT=0, a compile
// definition, builds the old order): the helper's rule asked for no shape below 0.98 against main's library, and
// 8/1 x 512 x 4k read 0.967 in one of two runs (0.998 in the other), but the gate keeps the index order there, so
// that shape runs the same kernel code whichever this default is: what it measured is the two selects the kernel
// carries either way, or the library switch's known artefact. The default only decides the gated grids, which
// measured 1.053x twice (engine/bench/NOTES.md, "### v21"); the final run A/Bs it in one library (fa3_index_order).
// DDTREE_TA_FA3_LPT=1|0 (read per launch) forces it on (every grid that allows it, ungated) or off. Only which SM
// runs which CTA, and when, changes: the same bits.
#ifndef DDTREE_TA_FA3_LPT_DEFAULT
#define DDTREE_TA_FA3_LPT_DEFAULT 1
#endif
bool fa3_lpt_order(bool helps) { return env_flag("DDTREE_TA_FA3_LPT", DDTREE_TA_FA3_LPT_DEFAULT != 0 && helps); }
// fa3 v10, opt-in: DDTREE_TA_FA3_BALANCE=w (read per launch; 1..16, 0 or unset = off) weights the chunk
// boundaries of split requests by tile cost, a masked tile counting w / 4 of a context tile
// (fa3_balanced_chunk). Changes the chunk boundaries, so results differ from uniform chunks by rounding.
int fa3_balance_weight() {
  const char* e = std::getenv("DDTREE_TA_FA3_BALANCE");
  if (e == nullptr) return 0;
  const int w = std::atoi(e);
  return w >= 1 && w <= 16 ? w : 0;
}

// The split plan depends only on these inputs and the device's SM count / occupancy, never on the
// device-side lengths, so a launch needs no host sync and can be captured in a graph.
ddtree_status_t make_plan(int batch, int hq, int hkv, int d, int n_max, int max_pages, int page_size,
                          int kv_chunk, Plan* plan) {
  ddtree_status_t st = check_shape(batch, hq, hkv, d, n_max, max_pages, page_size, kv_chunk);
  if (st != DDTREE_STATUS_SUCCESS) return st;
  Plan p;
  p.impl = resolve_impl(d);
  int occ = 0;
  st = prepare_for(d, p.impl, &occ);
  if (st != DDTREE_STATUS_SUCCESS) return st;
  p.bm = d == 256 ? 64 : 128;
  p.bn = p.impl == DDTREE_TA_IMPL_FA3     ? ta::Fa3Config::BN
         : p.impl == DDTREE_TA_IMPL_WGMMA ? ta::WgmmaConfig128::BN
         : d == 256                      ? 32
                                         : 64;
  const int64_t rows = static_cast<int64_t>(n_max) * (hq / hkv);
  p.row_tiles = static_cast<int>((rows + p.bm - 1) / p.bm);
  const int64_t max_kv = static_cast<int64_t>(max_pages) * page_size;
  int64_t chunk;
  if (kv_chunk > 0) {
    chunk = kv_chunk;
  } else {
    // About one full wave of CTAs, counting every row tile of every request; chunks of >= kMinChunk.
    const int64_t per_split = std::max<int64_t>(1, static_cast<int64_t>(std::max(batch, 1)) * hkv * p.row_tiles);
    const int64_t target = static_cast<int64_t>(ddtree::detail::sm_count()) * occ;
    int64_t ns = std::max<int64_t>(1, (target + per_split / 2) / per_split);
    ns = std::min<int64_t>(ns, std::max<int64_t>(1, (max_kv + kMinChunk - 1) / kMinChunk));
    chunk = (max_kv + ns - 1) / ns;
  }
  chunk = (chunk + p.bn - 1) / p.bn * p.bn;
  p.chunk = static_cast<int>(std::min<int64_t>(chunk, (max_kv + p.bn - 1) / p.bn * p.bn));
  p.num_splits = static_cast<int>((max_kv + p.chunk - 1) / p.chunk);
  DDTREE_REQUIRE(static_cast<int64_t>(p.row_tiles) * p.num_splits <= 0x7fffffff,
                 "tree_attention: %d row tiles x %d splits exceed the grid", p.row_tiles, p.num_splits);
  const int64_t tiles = static_cast<int64_t>(batch) * hkv * p.row_tiles;
  p.cluster_merge = p.impl == DDTREE_TA_IMPL_FA3 && fa3_cluster_merge_fits(p.num_splits, tiles);
  p.fused_merge = p.impl == DDTREE_TA_IMPL_FA3 && !p.cluster_merge && p.num_splits >= 2 &&
                  p.num_splits <= ta::Fa3Config::MAX_FUSED_SPLITS && fa3_fused_merge_enabled();
  using ddtree::detail::align_up;
  // The partial buffers and counters stay in the workspace size whatever the merge: the size must not
  // depend on the environment variables above (a caller may size the workspace before a test flips
  // them). The counters come first, so a plan's counters never overlap its own partials; one u32 per
  // (request, kv head, row tile).
  if (p.num_splits > 1) {
    const size_t slots = static_cast<size_t>(tiles) * p.num_splits * p.bm;
    p.cnt_bytes = align_up(static_cast<size_t>(tiles) * sizeof(uint32_t));
    p.part_o_bytes = align_up(slots * d * sizeof(float));
    p.part_ml_bytes = align_up(slots * 2 * sizeof(float));
  }
  *plan = p;
  return DDTREE_STATUS_SUCCESS;
}

}  // namespace tree_attention_launch
}  // namespace ddtree

namespace {

// The C entries below that only report a figure of the plan: the figure when the shape plans (the last error
// cleared), else 0 with make_plan's message in ddtree_last_error().
template <typename Pick>
auto planned(int batch, int hq, int hkv, int d, int n_max, int max_pages, int page_size, int kv_chunk, Pick pick)
    -> decltype(pick(Plan{})) {
  Plan plan;
  if (make_plan(batch, hq, hkv, d, n_max, max_pages, page_size, kv_chunk, &plan) != DDTREE_STATUS_SUCCESS) return 0;
  ddtree::detail::succeed();
  return pick(plan);
}

}  // namespace

extern "C" {

DDTREE_API size_t ddtree_tree_attention_workspace_size(int batch, int num_qo_heads, int num_kv_heads,
                                                       int head_dim, int n_max, int max_pages,
                                                       int page_size, int kv_chunk) {
  return planned(batch, num_qo_heads, num_kv_heads, head_dim, n_max, max_pages, page_size, kv_chunk,
                 [](const Plan& p) { return p.workspace(); });
}

DDTREE_API size_t ddtree_tree_attention_workspace_counter_bytes(int batch, int num_qo_heads, int num_kv_heads,
                                                               int head_dim, int n_max, int max_pages,
                                                               int page_size, int kv_chunk) {
  return planned(batch, num_qo_heads, num_kv_heads, head_dim, n_max, max_pages, page_size, kv_chunk,
                 [](const Plan& p) { return p.cnt_bytes; });
}

DDTREE_API ddtree_status_t ddtree_tree_attention_set_impl(int impl) {
  DDTREE_REQUIRE(impl >= DDTREE_TA_IMPL_AUTO && impl <= DDTREE_TA_IMPL_FA3,
                 "tree_attention: impl %d not in 0..3 (auto, mma, wgmma, fa3)", impl);
  g_impl_override.store(impl, std::memory_order_relaxed);
  return ddtree::detail::succeed();
}

DDTREE_API int ddtree_tree_attention_impl_available(int impl, int head_dim) {
  return impl_available(impl, head_dim) ? 1 : 0;
}

DDTREE_API int ddtree_tree_attention_impl_for(int head_dim) { return resolve_impl(head_dim); }

DDTREE_API int ddtree_tree_attention_plan_chunk(int batch, int num_qo_heads, int num_kv_heads,
                                                int head_dim, int n_max, int max_pages, int page_size,
                                                int kv_chunk) {
  return planned(batch, num_qo_heads, num_kv_heads, head_dim, n_max, max_pages, page_size, kv_chunk,
                 [](const Plan& p) { return p.chunk; });
}

}  // extern "C"
