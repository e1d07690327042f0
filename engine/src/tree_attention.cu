// Launcher of tree_attention: validates arguments, plans the key-range split, launches the kernel
// (plus the merge kernel when the plan splits the key range). This unit holds everything that names a
// kernel; the plan is src/tree_attention/plan.cu (src/tree_attention/plan.h says why).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common.h"

// Phase-trace build (-DDDTREE_TA_FA3_TRACE_BUILD; for bench/profile/fa3_trace.py, never the default
// build): the fa3 kernel records %globaltimer and clock64 per CTA at its DDTREE_TA_FA3_TRACE marks into
// g_fa3_trace, and ddtree_debug_fa3_trace() (end of this file) copies the table out and clears it; the merge
// kernel its DDTREE_TA_MERGE_TRACE marks into g_merge_trace (ddtree_debug_merge_trace). Defined before the
// kernel headers, which default both macros to no-ops.
#ifdef DDTREE_TA_FA3_TRACE_BUILD
namespace ddtree {
namespace tree_attn {
constexpr int kFa3TraceCtas = 2048, kFa3TraceTags = 16;
// The merge kernel (session 8): per CTA, %globaltimer at entry, after its PDL wait, and at its end.
constexpr int kMergeTraceCtas = 4096, kMergeTraceTags = 3;
__device__ unsigned long long g_merge_trace[kMergeTraceCtas][kMergeTraceTags];
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
#define DDTREE_TA_MERGE_TRACE(tag)                                                            \
  do {                                                                                        \
    unsigned long long gt_;                                                                   \
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt_));                                  \
    const unsigned cta_ = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);     \
    if (threadIdx.x == 0 && cta_ < kMergeTraceCtas) g_merge_trace[cta_][tag] = gt_;           \
  } while (0)
#endif

#include "ddtree/kernels/tree_attention.cuh"
#include "ddtree/kernels/tree_attention_fa3.cuh"
#include "ddtree/tree_attention.h"
#include "tree_attention/plan.h"

namespace {

using ddtree::detail::fail;
namespace ta = ddtree::tree_attn;
using ddtree::tree_attention_launch::fa3_balance_weight;
using ddtree::tree_attention_launch::fa3_early_inputs;
using ddtree::tree_attention_launch::fa3_lazy_mask_enabled;
using ddtree::tree_attention_launch::fa3_lpt_order;
using ddtree::tree_attention_launch::fa3_strided_schedule;
using ddtree::tree_attention_launch::make_plan;
using ddtree::tree_attention_launch::merge_early_trigger;
using ddtree::tree_attention_launch::Plan;

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
  // Both tile schedules' instances (v17): the same resources, each needs its own shared-memory limit.
  DDTREE_CUDA_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(&ta::tree_attention_fa3_kernel<false>),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, F::SMEM));
  DDTREE_CUDA_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(&ta::tree_attention_fa3_kernel<true>),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, F::SMEM));
  DDTREE_CUDA_TRY(cudaFuncSetAttribute(reinterpret_cast<const void*>(&ta::tree_attention_fa3_kernel<true, true>),
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, F::SMEM));
  int occ = 0;
  DDTREE_CUDA_TRY(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, &ta::tree_attention_fa3_kernel<false>, F::NT, F::SMEM));
  if (occ <= 0)
    return fail(DDTREE_STATUS_UNSUPPORTED, "tree_attention: the fa3 kernel needs %d bytes of shared memory per block",
                F::SMEM);
  if (dev >= 0 && dev < 64) cache[dev] = occ;
  *ctas_per_sm = occ;
  return DDTREE_STATUS_SUCCESS;
}

}  // namespace

namespace ddtree {
namespace tree_attention_launch {

// The cluster merge's residency test (cluster_merge_enabled, plan.cu), cached per device and size.
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
    // Both schedules' instances take the same resources: either one answers for the other.
    const void* fn = reinterpret_cast<const void*>(&ta::tree_attention_fa3_kernel<false>);
    if (cudaOccupancyMaxActiveClusters(&n, fn, &cfg) != cudaSuccess) {
      cudaGetLastError();  // not sticky; leave no error behind for the launch check
      n = 0;
    }
    cache[dev][size] = n + 1;
  }
  return cache[dev][size] - 1;
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

}  // namespace tree_attention_launch
}  // namespace ddtree

namespace {

// The fa3 kernel itself is launched with programmatic dependent launch as well (unless
// DDTREE_DISABLE_PDL=1 or DDTREE_TA_FA3_PDL=0, the latter read on every launch so that a bench can
// compare both in one process): its CTAs may be scheduled while the previous kernel in the stream
// drains, and they execute griddepcontrol.wait before their first global access (v18's default instance:
// before their first read of q or the cache, the four index inputs being read ahead; tree_attention.h
// says which inputs the previous kernel must not write), so nothing it writes is read before it is
// visible. The merge kernel (when the plan splits without the cluster merge) follows with PDL too and
// waits for this kernel's partials the same way; it triggers its own dependents at entry (v18).
bool fa3_pdl_enabled() {
  const char* e = std::getenv("DDTREE_TA_FA3_PDL");
  return ddtree::detail::pdl_enabled() && (e == nullptr || std::strcmp(e, "0") != 0);
}

ddtree_status_t launch_fa3(const ta::Params& params, int batch, int hkv, const Plan& plan, bool inputs_ready,
                           cudaStream_t stream) {
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
  // v21: longest row tiles first (fa3_lpt_order, plan.cu; opt-in), gated to where it measured faster: a grid of
  // more than one wave (fa3: one CTA per SM) whose K and V (every request's key capacity, bf16) fit in half the
  // L2. The cluster merge needs a row tile's splits adjacent in x, and y holds at most 65535 CTAs.
  const unsigned nx = static_cast<unsigned>(plan.row_tiles * plan.num_splits);
  const int64_t ctas = static_cast<int64_t>(nx) * hkv * batch;
  const int64_t kv_bytes = static_cast<int64_t>(batch) * params.max_pages * params.page_size * hkv * F::D * 4;
  const bool lpt_helps = ctas > ddtree::detail::sm_count() && 2 * kv_bytes <= ddtree::detail::l2_cache_bytes();
  kp.lpt_order = !plan.cluster_merge && nx <= 65535u && fa3_lpt_order(lpt_helps) ? 1 : 0;
  if (kp.lpt_order) cfg.gridDim = dim3(static_cast<unsigned>(hkv), nx, static_cast<unsigned>(batch));
  // v17: the tile schedule (fa3_strided_schedule, plan.cu); the balanced boundaries are chunks by design.
  // v18: the strided instance with the early input reads when the caller says the inputs are ready
  // (fa3_early_inputs); chunked stays v10's kernel.
  const bool strided = fa3_strided_schedule() && kp.balance_w == 0;
  auto* kernel = !strided              ? &ta::tree_attention_fa3_kernel<false>
                 : fa3_early_inputs(inputs_ready) ? &ta::tree_attention_fa3_kernel<true, true>
                                      : &ta::tree_attention_fa3_kernel<true>;
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
    err = cudaLaunchKernelEx(&cfg, kernel, kp);
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
    err = cudaLaunchKernelEx(&cfg, kernel, kp);
  }
  if (err != cudaSuccess) return ddtree::detail::from_cuda(err, "tree_attention fa3 kernel");
  ddtree_status_t st = ddtree::detail::check_launch("tree_attention fa3 kernel");
  if (st != DDTREE_STATUS_SUCCESS || plan.num_splits == 1 || plan.cluster_merge || plan.fused_merge) return st;
  dim3 mgrid(static_cast<unsigned>((plan.row_tiles * F::BM + 3) / 4), static_cast<unsigned>(hkv),
             static_cast<unsigned>(batch));
  auto* merge = merge_early_trigger() ? &ta::tree_attention_merge_kernel<F::D, F::BM, true>
                                      : &ta::tree_attention_merge_kernel<F::D, F::BM>;
  return ddtree::detail::launch("tree_attention merge kernel", merge, mgrid, dim3(128), stream, /*pdl=*/true, params);
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

DDTREE_API ddtree_status_t ddtree_tree_attention(
    const void* q, const void* k_cache, const void* v_cache, const int32_t* qo_indptr,
    const int32_t* block_table, const int32_t* ctx_len, const uint32_t* anc, void* o, float* lse,
    int num_tokens, int batch, int num_qo_heads, int num_kv_heads, int head_dim, int num_pages,
    int page_size, int max_pages, int n_max, float sm_scale, int kv_chunk, ddtree_dtype_t dtype,
    void* workspace, size_t workspace_bytes, void* stream) {
  return ddtree_tree_attention_ex(q, k_cache, v_cache, qo_indptr, block_table, ctx_len, anc, o, lse, num_tokens,
                                  batch, num_qo_heads, num_kv_heads, head_dim, num_pages, page_size, max_pages,
                                  n_max, sm_scale, kv_chunk, dtype, workspace, workspace_bytes, stream, 0u);
}

DDTREE_API ddtree_status_t ddtree_tree_attention_ex(
    const void* q, const void* k_cache, const void* v_cache, const int32_t* qo_indptr,
    const int32_t* block_table, const int32_t* ctx_len, const uint32_t* anc, void* o, float* lse,
    int num_tokens, int batch, int num_qo_heads, int num_kv_heads, int head_dim, int num_pages,
    int page_size, int max_pages, int n_max, float sm_scale, int kv_chunk, ddtree_dtype_t dtype,
    void* workspace, size_t workspace_bytes, void* stream, unsigned flags) {
  DDTREE_REQUIRE((flags & ~DDTREE_TA_INPUTS_READY) == 0u, "tree_attention: unknown flags 0x%x", flags);
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
    return launch_fa3(params, batch, num_kv_heads, plan, (flags & DDTREE_TA_INPUTS_READY) != 0u, s);
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
// Copies the phase-trace table ([2048 CTAs][16 globaltimer ns, 16 clock64]) to `host` (room for
// 2048 * 32 u64) and clears it on the device. Synchronous; a debugging aid of the trace build only.
extern "C" DDTREE_API int ddtree_debug_fa3_trace(unsigned long long* host) {
  if (cudaMemcpyFromSymbol(host, ddtree::tree_attn::g_fa3_trace, sizeof(ddtree::tree_attn::g_fa3_trace)) != cudaSuccess)
    return -1;
  void* dev = nullptr;
  if (cudaGetSymbolAddress(&dev, ddtree::tree_attn::g_fa3_trace) != cudaSuccess) return -1;
  if (cudaMemset(dev, 0, sizeof(ddtree::tree_attn::g_fa3_trace)) != cudaSuccess) return -1;
  return ddtree::tree_attn::kFa3TraceCtas;
}
// The merge kernel's table ([4096 CTAs][3 globaltimer ns]: entry, after the PDL wait, end), same protocol.
extern "C" DDTREE_API int ddtree_debug_merge_trace(unsigned long long* host) {
  if (cudaMemcpyFromSymbol(host, ddtree::tree_attn::g_merge_trace, sizeof(ddtree::tree_attn::g_merge_trace)) !=
      cudaSuccess)
    return -1;
  void* dev = nullptr;
  if (cudaGetSymbolAddress(&dev, ddtree::tree_attn::g_merge_trace) != cudaSuccess) return -1;
  if (cudaMemset(dev, 0, sizeof(ddtree::tree_attn::g_merge_trace)) != cudaSuccess) return -1;
  return ddtree::tree_attn::kMergeTraceCtas;
}
#endif
