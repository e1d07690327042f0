// Launcher of tree_attention: validates arguments, plans the key-range split, launches the kernel
// (plus the merge kernel when the plan splits the key range).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common.h"
#include <atomic>

#include "ddtree/kernels/tree_attention.cuh"

// Phase-trace build (-DDDTREE_TA_FA3_TRACE_BUILD; for bench/profile/fa3_trace.py, never the default
// build): the fa3 kernel records %globaltimer and clock64 per CTA at its DDTREE_TA_FA3_TRACE marks into
// g_fa3_trace, and ddtree_debug_fa3_trace() (end of this file) copies the table out and clears it.
#ifdef DDTREE_TA_FA3_TRACE_BUILD
namespace ddtree {
namespace tree_attn {
constexpr int kFa3TraceCtas = 2048, kFa3TraceTags = 8;
__device__ unsigned long long g_fa3_trace[kFa3TraceCtas][2 * kFa3TraceTags];
}  // namespace tree_attn
}  // namespace ddtree
#define DDTREE_TA_FA3_TRACE(tag)                                                              \
  do {                                                                                        \
    unsigned long long gt_;                                                                   \
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt_));                                  \
    const unsigned cta_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);     \
    if (cta_ < kFa3TraceCtas) {                                                               \
      g_fa3_trace[cta_][tag] = gt_;                                                           \
      g_fa3_trace[cta_][kFa3TraceTags + (tag)] = static_cast<unsigned long long>(clock64()); \
    }                                                                                         \
  } while (0)
#endif

#include "ddtree/kernels/tree_attention_fa3.cuh"
#include "ddtree/tree_attention.h"

namespace {

using ddtree::detail::fail;
namespace ta = ddtree::tree_attn;

// Smallest chunk the planner makes: below this the partial write + merge costs about as much as
// reading the chunk's K/V.
constexpr int kMinChunk = 256;

struct Plan {
  int bm = 0, bn = 0, row_tiles = 0, num_splits = 0, chunk = 0;
  int impl = DDTREE_TA_IMPL_MMA;
  bool cluster_merge = false;  // fa3: merge the splits inside a cluster (see fa3_cluster_merge_fits)
  bool fused_merge = false;    // fa3: the last CTA of a split row tile merges it (see fa3_fused_merge_enabled)
  // Workspace layout: [arrival counters, zero between launches][fp32 partial O][fp32 partial (m, l)].
  size_t cnt_bytes = 0, part_o_bytes = 0, part_ml_bytes = 0;
  size_t workspace() const { return cnt_bytes + part_o_bytes + part_ml_bytes; }
};

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

template <class C>
const void* kernel_ptr() {
  return reinterpret_cast<const void*>(&ta::tree_attention_kernel<C>);
}

// Raises the kernel's dynamic shared-memory limit (once per device) and returns CTAs per SM.
template <class C>
ddtree_status_t prepare(int* ctas_per_sm) {
  static int cache[64] = {0};  // CTAs per SM per device ordinal; 0 = not prepared yet
  int dev = 0;
  DDTREE_CUDA_TRY(cudaGetDevice(&dev));
  if (dev >= 0 && dev < 64 && cache[dev] > 0) {
    *ctas_per_sm = cache[dev];
    return DDTREE_STATUS_SUCCESS;
  }
  DDTREE_CUDA_TRY(cudaFuncSetAttribute(kernel_ptr<C>(), cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
  int occ = 0;
  DDTREE_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, &ta::tree_attention_kernel<C>, C::NT, C::SMEM));
  if (occ <= 0)
    return fail(DDTREE_STATUS_UNSUPPORTED,
                "tree_attention: D=%d needs %d bytes of shared memory per block, more than this device offers",
                C::D, C::SMEM);
  if (dev >= 0 && dev < 64) cache[dev] = occ;
  *ctas_per_sm = occ;
  return DDTREE_STATUS_SUCCESS;
}

ddtree_status_t prepare_fa3(int* ctas_per_sm) {
  static int cache[64] = {0};
  int dev = 0;
  DDTREE_CUDA_TRY(cudaGetDevice(&dev));
  if (dev >= 0 && dev < 64 && cache[dev] > 0) {
    *ctas_per_sm = cache[dev];
    return DDTREE_STATUS_SUCCESS;
  }
  using F = ta::Fa3Config;
  DDTREE_CUDA_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(&ta::tree_attention_fa3_kernel),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, F::SMEM));
  int occ = 0;
  DDTREE_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, &ta::tree_attention_fa3_kernel, F::NT, F::SMEM));
  if (occ <= 0)
    return fail(DDTREE_STATUS_UNSUPPORTED, "tree_attention: the fa3 kernel needs %d bytes of shared memory per block",
                F::SMEM);
  if (dev >= 0 && dev < 64) cache[dev] = occ;
  *ctas_per_sm = occ;
  return DDTREE_STATUS_SUCCESS;
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
int fa3_max_active_clusters(int size) {
  static int cache[64][ta::Fa3Config::MAX_CLUSTER + 1] = {};  // + 1 so that 0 means "not queried"
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  if (cache[dev][size] == 0) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(size), 1, 1);
    cfg.blockDim = dim3(ta::Fa3Config::NT, 1, 1);
    cfg.dynamicSmemBytes = ta::Fa3Config::SMEM;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(size);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, reinterpret_cast<const void*>(&ta::tree_attention_fa3_kernel), &cfg) !=
        cudaSuccess) {
      cudaGetLastError();  // not sticky; leave no error behind for the launch check
      n = 0;
    }
    cache[dev][size] = n + 1;
  }
  return cache[dev][size] - 1;
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
// fa3 v10: the tile mask is waited for lazily (default); DDTREE_TA_FA3_LAZY_MASK=0 (read per launch)
// makes every thread wait for it after the prologue, as v9b's __syncthreads did.
bool fa3_lazy_mask_enabled() {
  const char* e = std::getenv("DDTREE_TA_FA3_LAZY_MASK");
  return e == nullptr || std::strcmp(e, "0") != 0;
}
// fa3 v10, opt-in: DDTREE_TA_FA3_BALANCE=w (read per launch; 1..16, 0 or unset = off) weights the chunk
// boundaries of split requests by tile cost, a masked tile counting w / 4 of a context tile
// (fa3_balanced_chunk). Changes the chunk boundaries, so results differ from uniform chunks by rounding.
int fa3_balance_weight() {
  const char* e = std::getenv("DDTREE_TA_FA3_BALANCE");
  if (e == nullptr) return 0;
  const int w = std::atoi(e);
  return w >= 1 && w <= 16 ? w : 0;
}
bool fa3_cluster_merge_fits(int num_splits, int64_t clusters) {
  if (num_splits < 2 || num_splits > ta::Fa3Config::MAX_CLUSTER || !cluster_merge_enabled()) return false;
  return clusters <= fa3_max_active_clusters(num_splits);
}

ddtree_status_t prepare_for(int d, int impl, int* ctas_per_sm) {
  if (impl == DDTREE_TA_IMPL_FA3) return prepare_fa3(ctas_per_sm);
  if (impl == DDTREE_TA_IMPL_WGMMA) return prepare<ta::WgmmaConfig128>(ctas_per_sm);
  switch (d) {
    case 64: return prepare<ta::SyncConfig<64>::type>(ctas_per_sm);
    case 128: return prepare<ta::SyncConfig<128>::type>(ctas_per_sm);
    case 256: return prepare<ta::SyncConfig<256>::type>(ctas_per_sm);
  }
  return fail(DDTREE_STATUS_UNSUPPORTED, "tree_attention: head_dim %d not supported (64, 128, 256)", d);
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

// The fa3 kernel itself is launched with programmatic dependent launch as well (unless
// DDTREE_DISABLE_PDL=1 or DDTREE_TA_FA3_PDL=0, the latter read on every launch so that a bench can
// compare both in one process): its CTAs may be scheduled while the previous kernel in the stream
// drains, and they execute griddepcontrol.wait before their first global access, so nothing is read
// before that kernel's results are visible. The merge kernel (when the plan splits without the
// cluster merge) follows with PDL too and waits for this kernel's partials the same way.
bool fa3_pdl_enabled() {
  const char* e = std::getenv("DDTREE_TA_FA3_PDL");
  return ddtree::detail::pdl_enabled() && (e == nullptr || std::strcmp(e, "0") != 0);
}

ddtree_status_t launch_fa3(const ta::Params& params, int batch, int hkv, const Plan& plan, cudaStream_t stream) {
  using F = ta::Fa3Config;
  static_assert(F::BM == ta::WgmmaConfig128::BM, "fa3 shares the wgmma plan and merge kernel");
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(plan.row_tiles * plan.num_splits), static_cast<unsigned>(hkv),
                     static_cast<unsigned>(batch));
  cfg.blockDim = dim3(F::NT, 1, 1);
  cfg.dynamicSmemBytes = F::SMEM;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n_attr = 0;
  ta::Params kp = params;
  if (plan.cluster_merge) {  // the clusters merge their splits themselves: no merge kernel
    attr[n_attr].id = cudaLaunchAttributeClusterDimension;
    attr[n_attr].val.clusterDim.x = static_cast<unsigned>(plan.num_splits);
    attr[n_attr].val.clusterDim.y = 1;
    attr[n_attr].val.clusterDim.z = 1;
    ++n_attr;
    kp.cluster_merge = 1;
  }
  kp.fused_merge = plan.fused_merge ? 1 : 0;
  kp.lazy_mask = fa3_lazy_mask_enabled() ? 1 : 0;
  kp.balance_w = fa3_balance_weight();
  // Should a driver refuse PDL (alone or together with cluster dims: a configuration error, returned
  // at once and not sticky), launch without it from then on.
  static bool pdl_refused = false;
  cudaError_t err = cudaErrorInvalidValue;
  bool launched = false;
  if (fa3_pdl_enabled() && !pdl_refused) {
    attr[n_attr].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n_attr].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = n_attr + 1;
    err = cudaLaunchKernelEx(&cfg, ta::tree_attention_fa3_kernel, kp);
    launched = true;
    if (err == cudaErrorInvalidValue || err == cudaErrorNotSupported || err == cudaErrorInvalidConfiguration) {
      (void)cudaGetLastError();
      pdl_refused = true;
      launched = false;
    }
  }
  if (!launched) {
    cfg.attrs = n_attr ? attr : nullptr;
    cfg.numAttrs = n_attr;
    err = cudaLaunchKernelEx(&cfg, ta::tree_attention_fa3_kernel, kp);
  }
  if (err != cudaSuccess) return ddtree::detail::from_cuda(err, "tree_attention fa3 kernel");
  ddtree_status_t st = ddtree::detail::check_launch("tree_attention fa3 kernel");
  if (st != DDTREE_STATUS_SUCCESS || plan.num_splits == 1 || plan.cluster_merge || plan.fused_merge) return st;
  dim3 mgrid(static_cast<unsigned>((plan.row_tiles * F::BM + 3) / 4), static_cast<unsigned>(hkv),
             static_cast<unsigned>(batch));
  return ddtree::detail::launch("tree_attention merge kernel", &ta::tree_attention_merge_kernel<F::D, F::BM>, mgrid,
                                dim3(128), stream, /*pdl=*/true, params);
}

template <class C>
void launch(const ta::Params& params, int batch, int hkv, const Plan& plan, cudaStream_t stream) {
  dim3 grid(static_cast<unsigned>(plan.row_tiles * plan.num_splits), static_cast<unsigned>(hkv),
            static_cast<unsigned>(batch));
  ta::tree_attention_kernel<C><<<grid, C::NT, C::SMEM, stream>>>(params);
  if (plan.num_splits > 1) {
    dim3 mgrid(static_cast<unsigned>((plan.row_tiles * C::BM + 3) / 4), static_cast<unsigned>(hkv),
               static_cast<unsigned>(batch));
    ta::tree_attention_merge_kernel<C::D, C::BM><<<mgrid, 128, 0, stream>>>(params);
  }
}

}  // namespace

extern "C" {

DDTREE_API size_t ddtree_tree_attention_workspace_size(int batch, int num_qo_heads, int num_kv_heads,
                                                       int head_dim, int n_max, int max_pages,
                                                       int page_size, int kv_chunk) {
  Plan plan;
  if (make_plan(batch, num_qo_heads, num_kv_heads, head_dim, n_max, max_pages, page_size, kv_chunk,
                &plan) != DDTREE_STATUS_SUCCESS)
    return 0;
  ddtree::detail::succeed();
  return plan.workspace();
}

DDTREE_API size_t ddtree_tree_attention_workspace_counter_bytes(int batch, int num_qo_heads, int num_kv_heads,
                                                               int head_dim, int n_max, int max_pages,
                                                               int page_size, int kv_chunk) {
  Plan plan;
  if (make_plan(batch, num_qo_heads, num_kv_heads, head_dim, n_max, max_pages, page_size, kv_chunk,
                &plan) != DDTREE_STATUS_SUCCESS)
    return 0;
  ddtree::detail::succeed();
  return plan.cnt_bytes;
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
  Plan plan;
  if (make_plan(batch, num_qo_heads, num_kv_heads, head_dim, n_max, max_pages, page_size, kv_chunk,
                &plan) != DDTREE_STATUS_SUCCESS)
    return 0;
  ddtree::detail::succeed();
  return plan.chunk;
}

DDTREE_API ddtree_status_t ddtree_tree_attention(
    const void* q, const void* k_cache, const void* v_cache, const int32_t* qo_indptr,
    const int32_t* block_table, const int32_t* ctx_len, const uint32_t* anc, void* o, float* lse,
    int num_tokens, int batch, int num_qo_heads, int num_kv_heads, int head_dim, int num_pages,
    int page_size, int max_pages, int n_max, float sm_scale, int kv_chunk, ddtree_dtype_t dtype,
    void* workspace, size_t workspace_bytes, void* stream) {
  if (dtype != DDTREE_DTYPE_BFLOAT16)
    return fail(DDTREE_STATUS_UNSUPPORTED, "tree_attention: dtype %d not supported (bf16 only)", static_cast<int>(dtype));
  DDTREE_REQUIRE(num_tokens >= 0, "tree_attention: num_tokens %d < 0", num_tokens);
  DDTREE_REQUIRE(num_pages >= 1, "tree_attention: num_pages %d < 1", num_pages);
  DDTREE_REQUIRE(std::isfinite(sm_scale) && sm_scale > 0.f, "tree_attention: sm_scale %g must be finite and > 0",
                 static_cast<double>(sm_scale));
  Plan plan;
  ddtree_status_t st = make_plan(batch, num_qo_heads, num_kv_heads, head_dim, n_max, max_pages, page_size,
                                 kv_chunk, &plan);
  if (st != DDTREE_STATUS_SUCCESS) return st;
  if (batch == 0 || num_tokens == 0) return ddtree::detail::succeed();
  DDTREE_REQUIRE(q && k_cache && v_cache && qo_indptr && block_table && ctx_len && o,
                 "tree_attention: q, k_cache, v_cache, qo_indptr, block_table, ctx_len and o must be non-null");
  const auto misaligned = [](const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) != 0; };
  DDTREE_REQUIRE(!misaligned(q) && !misaligned(k_cache) && !misaligned(v_cache) && !misaligned(o),
                 "tree_attention: q, k_cache, v_cache and o must be 16-byte aligned");
  DDTREE_REQUIRE((workspace != nullptr || plan.workspace() == 0) && workspace_bytes >= plan.workspace() &&
                     !misaligned(workspace),
                 "tree_attention: workspace of %zu bytes at %p, need %zu (16-byte aligned)", workspace_bytes,
                 workspace, plan.workspace());

  ta::Params params{};
  params.q = static_cast<const __nv_bfloat16*>(q);
  params.k = static_cast<const __nv_bfloat16*>(k_cache);
  params.v = static_cast<const __nv_bfloat16*>(v_cache);
  params.qo_indptr = qo_indptr;
  params.block_table = block_table;
  params.ctx_len = ctx_len;
  params.anc = anc;
  params.o = static_cast<__nv_bfloat16*>(o);
  params.lse = lse;
  auto* ws = static_cast<unsigned char*>(workspace);
  params.merge_cnt = reinterpret_cast<uint32_t*>(ws);
  params.part_o = reinterpret_cast<float*>(ws + plan.cnt_bytes);
  params.part_ml = reinterpret_cast<float*>(ws + plan.cnt_bytes + plan.part_o_bytes);
  params.num_tokens = num_tokens;
  params.hq = num_qo_heads;
  params.hkv = num_kv_heads;
  params.group = num_qo_heads / num_kv_heads;
  params.page_size = page_size;
  params.page_shift = (page_size & (page_size - 1)) == 0 ? __builtin_ctz(static_cast<unsigned>(page_size)) : -1;
  params.max_pages = max_pages;
  params.n_max = n_max;
  params.words = (n_max + 31) / 32;
  params.row_tiles = plan.row_tiles;
  params.num_splits = plan.num_splits;
  params.chunk = plan.chunk;
  params.scale_log2 = sm_scale * 1.4426950408889634f;

  auto s = static_cast<cudaStream_t>(stream);
  if (plan.impl == DDTREE_TA_IMPL_FA3) {
    return launch_fa3(params, batch, num_kv_heads, plan, s);
  } else if (plan.impl == DDTREE_TA_IMPL_WGMMA) {
    launch<ta::WgmmaConfig128>(params, batch, num_kv_heads, plan, s);
  } else {
    switch (head_dim) {
      case 64: launch<ta::SyncConfig<64>::type>(params, batch, num_kv_heads, plan, s); break;
      case 128: launch<ta::SyncConfig<128>::type>(params, batch, num_kv_heads, plan, s); break;
      default: launch<ta::SyncConfig<256>::type>(params, batch, num_kv_heads, plan, s); break;
    }
  }
  return ddtree::detail::check_launch("tree_attention kernel");
}

}  // extern "C"

#ifdef DDTREE_TA_FA3_TRACE_BUILD
// Copies the phase-trace table ([2048 CTAs][8 globaltimer ns, 8 clock64]) to `host` (room for
// 2048 * 16 u64) and clears it on the device. Synchronous; a debugging aid of the trace build only.
extern "C" DDTREE_API int ddtree_debug_fa3_trace(unsigned long long* host) {
  if (cudaMemcpyFromSymbol(host, ddtree::tree_attn::g_fa3_trace, sizeof(ddtree::tree_attn::g_fa3_trace)) != cudaSuccess)
    return -1;
  void* dev = nullptr;
  if (cudaGetSymbolAddress(&dev, ddtree::tree_attn::g_fa3_trace) != cudaSuccess) return -1;
  if (cudaMemset(dev, 0, sizeof(ddtree::tree_attn::g_fa3_trace)) != cudaSuccess) return -1;
  return ddtree::tree_attn::kFa3TraceCtas;
}
#endif
