// Launcher of draft_topk_lse (C ABI): validates, sizes the workspace, launches the kernels.
//
// Three implementations (engine/bench/NOTES.md): v4 (draft_topk_lse_v4.cuh: one launch, a thread-block
// cluster per row, k <= 64, devices with cluster launch = sm_90+), v3 (draft_topk_lse_v3.cuh, two launches,
// k <= 64) and v2 (draft_topk_lse.cuh, two launches, any k). The default is v4 where it applies, else v3
// for k <= 16, else v2; DDTREE_TOPK_IMPL=v2|v3 in the environment (read once per process) makes that
// version the default, and ddtree_draft_topk_lse_impl() picks per call. The workspace size covers v2
// and v3 (v4 uses none), so any of them can run on any workspace sized by the query.
// v4's kernel options (kV4Opt*): for k > 1 v13r (session 9), v11 (session 8), v9 (session 7) or v8 (session 6) by cluster
// size and k
// (run_v4_async), the kV4OptV7b instantiation for k = 1; DDTREE_TOPK_V4_OPT=v7b|v8|v9|v10|v11|v13 forces an option set
// (see env_v4_opt; v13 = the compact builds of v9 / v11, session 9). That policy (device attributes, V4Config,
// env_v4_opt, env_v4_cluster, v4_max_cluster) is in draft_topk_lse_v4_config.h.
// Launch (session 10, draft_topk_lse_v4_launch.h, NOTES "v14 (session 10"): a one-wave grid of 8-CTA clusters (<= 16
// rows of 163,840 at 132 SMs) reserves shared memory for one CTA per SM ("solo"); DDTREE_TOPK_V4_LAUNCH picks per call.
// Small rows (NOTES "v7" and "Session 6"): where the default resolves to v4 and V <= kSmallMaxV (1024), the
// default runs draft_topk_lse_small.cuh (one warp per row, the row in registers, no cluster) when
// DDTREE_TOPK_SMALL=1, v4 when =0, and when unset where it measured faster than v4 in one process on the H200
// (session 6, inside the end-to-end round at V = 320, k = 16 and 64, 15 and 120 rows: 2.7-5.2 µs against v4's
// 5.3-8.8): 256 < V <= 384 (the 12-logits-per-lane instantiation that ran) and k >= 16. Read on every call,
// so one process can A/B the two by capturing each into its own graph; an explicit "v4" always runs v4.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common.h"
#include "draft_topk_lse_v4_config.h"
#include "draft_topk_lse_v4_launch.h"
#include "ddtree/draft_topk_lse.h"
#include "ddtree/kernels/draft_topk_lse.cuh"
#include "ddtree/kernels/draft_topk_lse_small.cuh"
#include "ddtree/kernels/draft_topk_lse_v3.cuh"
#include "ddtree/kernels/draft_topk_lse_v4.cuh"

namespace {

// Whether every row starts on a 16-byte boundary, so the kernels may load 16-byte vectors (else
// they take their element-wise path).
template <typename T>
bool rows_allow_vector_loads(const T* logits, int32_t batch, int64_t batch_stride, int64_t row_stride) {
  constexpr int kPerVector = 16 / int(sizeof(T));
  return reinterpret_cast<uintptr_t>(logits) % 16 == 0 && row_stride % kPerVector == 0 &&
         (batch <= 1 || batch_stride % kPerVector == 0);
}

using ddtree::detail::align_up;
namespace k = ddtree::kernels;

int64_t num_chunks(int32_t vocab) { return (int64_t(vocab) + k::kTopkChunk - 1) / k::kTopkChunk; }

size_t cand_bytes(int64_t rows, int32_t vocab, int32_t topk) {
  return align_up(size_t(rows) * size_t(num_chunks(vocab)) * size_t(topk) * sizeof(uint64_t));
}
size_t partial_bytes(int64_t rows, int32_t vocab) {
  return align_up(size_t(rows) * size_t(num_chunks(vocab)) * sizeof(float2));
}

// v3 workspace: per (row, chunk) a 64-item slot and a (max, sum) partial; sized for the fp32 chunk
// (the smaller one, so the most chunks).
int64_t v3_chunks(int32_t vocab, int chunk) { return (int64_t(vocab) + chunk - 1) / chunk; }
size_t v3_bytes(int64_t rows, int32_t vocab) {
  const int64_t chunks = v3_chunks(vocab, k::kV3MinChunk);
  return align_up(size_t(rows) * size_t(chunks) * k::kV3Slot * sizeof(uint64_t)) +
         align_up(size_t(rows) * size_t(chunks) * sizeof(float2));
}

constexpr int kV3DefaultMaxK = 16;  // the default's v3 range (see resolve_impl)

// DDTREE_TOPK_IMPL: "v2" or "v3" makes that version the default; anything else (or unset) means v4.
int32_t env_impl() {
  static const int32_t impl = [] {
    const char* e = std::getenv("DDTREE_TOPK_IMPL");
    if (e != nullptr && std::strcmp(e, "v2") == 0) return int32_t(DDTREE_TOPK_IMPL_V2);
    if (e != nullptr && std::strcmp(e, "v3") == 0) return int32_t(DDTREE_TOPK_IMPL_V3);
    return int32_t(DDTREE_TOPK_IMPL_V4);
  }();
  return impl;
}

// Whether the default takes the small-row kernel for this V <= kSmallMaxV and k (see the top of this file).
bool use_small(int32_t vocab, int32_t k) {
  const char* e = std::getenv("DDTREE_TOPK_SMALL");
  if (e != nullptr && std::strcmp(e, "1") == 0) return true;
  if (e != nullptr && std::strcmp(e, "0") == 0) return false;
  return vocab > 256 && vocab <= 384 && k >= 16;  // where it was measured faster (session 6)
}

// v4: one launch, grid (cluster, rows) with cluster dims (cluster, 1, 1); no workspace. Launched with
// programmatic dependent launch when enabled (the kernel waits before its first global access).
template <typename T, int THREADS, bool ASYNC = false, unsigned OPT = k::kV4OptDefault>
ddtree_status_t run_v4(const T* logits, int32_t batch, int32_t positions, int32_t vocab, int64_t batch_stride,
                       int64_t row_stride, int32_t topk, float* top_lp, int32_t* top_id, float* lse,
                       int32_t* error_flags, cudaStream_t stream) {
  const int64_t rows = int64_t(batch) * positions;
  const auto split = k::v4_split<T, THREADS>(vocab, v4_max_cluster(rows, sizeof(T) == 2));
  const bool vec = rows_allow_vector_loads(logits, batch, batch_stride, row_stride);
  constexpr auto kern_v = k::draft_topk_lse_v4_kernel<T, true, THREADS, ASYNC, OPT>;
  constexpr auto kern_e = k::draft_topk_lse_v4_kernel<T, false, THREADS, ASYNC, OPT>;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(split.cluster), unsigned(rows), 1u);
  cfg.blockDim = dim3(THREADS);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(split.cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  // v14 (session 10, draft_topk_lse_v4_launch.h): one CTA per SM for a one-wave grid of 8-CTA clusters, where all of
  // its clusters fit at that occupancy; DDTREE_TOPK_V4_LAUNCH forces a mode per call (A/B).
  namespace d = ddtree::detail;
  const d::V4Launch mode = d::env_v4_launch();
  bool solo = mode == d::V4Launch::kSolo || mode == d::V4Launch::kSoloNoPdl ||
              (mode == d::V4Launch::kDefault && THREADS == 512 && ASYNC && split.cluster == k::kV4MaxCluster &&
               rows * split.cluster <= int64_t(sm_count()));
  if (solo) {
    cfg.dynamicSmemBytes = size_t(vec ? d::v4_solo_pad<kern_v>() : d::v4_solo_pad<kern_e>());
    cfg.numAttrs = 1;
    solo = cfg.dynamicSmemBytes > 0 && (vec ? d::v4_clusters_fit<kern_v>(cfg, int(rows))
                                            : d::v4_clusters_fit<kern_e>(cfg, int(rows)));
    if (!solo) cfg.dynamicSmemBytes = 0;
  }
  const bool want_pdl = mode != d::V4Launch::kNoPdl && mode != d::V4Launch::kSoloNoPdl;
  auto go = [&](unsigned num_attrs) {
    cfg.numAttrs = num_attrs;
    return vec ? cudaLaunchKernelEx(&cfg, kern_v, logits, int(positions), int(vocab), batch_stride, row_stride,
                                    int(topk), split.cluster, split.pv, top_lp, top_id, lse, error_flags)
               : cudaLaunchKernelEx(&cfg, kern_e, logits, int(positions), int(vocab), batch_stride, row_stride,
                                    int(topk), split.cluster, split.pv, top_lp, top_id, lse, error_flags);
  };
  // Cluster dims together with programmatic serialization: should a driver refuse the pair (a
  // configuration error, returned at once and not sticky), launch without PDL from then on.
  static bool pdl_refused = false;
  cudaError_t err = cudaErrorInvalidValue;
  if (want_pdl && ddtree::detail::pdl_enabled() && !pdl_refused) {
    err = go(2);
    if (err == cudaErrorInvalidValue || err == cudaErrorNotSupported || err == cudaErrorInvalidConfiguration) {
      (void)cudaGetLastError();
      pdl_refused = true;
    }
  }
  if (!want_pdl || !ddtree::detail::pdl_enabled() || pdl_refused) err = go(1);
  if (err != cudaSuccess) return ddtree::detail::from_cuda(err, "draft_topk_lse_v4_kernel");
  return ddtree::detail::check_launch("draft_topk_lse_v4_kernel");
}

// v4 at 512 threads with the st.async exchange (the default shape): the instantiation by k, the cluster size and
// DDTREE_TOPK_V4_OPT (v13r at 8-CTA clusters, v11 / v9 at 4-7, v8 below, v7b at k = 1; details below). Default for k > 1 (H200, session 7, v8 and v9 in one process; NOTES "v9 (session 7)"): v9
// where a row gets a cluster of 4 or more CTAs, the sizes it measured faster at (163,840 with 8 and 4 CTAs per
// row: 1x15 K = 16/32/64 8.5/9.9/11.9 -> 7.4/8.5/10.1 µs, 8x15 27.4/27.9/34.6 -> 23.5/24.1/30.1); v8 for
// shorter rows (one CTA per row, V = 320: v9 within +0.1 µs of v8; 2-3 CTAs not measured).
template <typename T>
ddtree_status_t run_v4_async(const T* x, int32_t batch, int32_t positions, int32_t vocab, int64_t batch_stride,
                             int64_t row_stride, int32_t k, float* top_lp, int32_t* top_id, float* lse,
                             int32_t* error_flags, cudaStream_t stream) {
  V4Opt opt = env_v4_opt();
  const bool compact = opt == V4Opt::kV13, s8 = opt == V4Opt::kS8, s10 = opt == V4Opt::kS10;
  if (compact || s8 || s10) opt = V4Opt::kDefault;
  if (opt == V4Opt::kDefault && k > 1) {
    const int64_t rows = int64_t(batch) * positions;
    const int cluster = k::v4_split<T, 512>(vocab, v4_max_cluster(rows, sizeof(T) == 2)).cluster;
    const bool session9 = !compact && !s8;
    // Session 13 (NOTES "v17 (session 13"): 2-CTA clusters of many rows (the bf16 default at 67..132 rows) run v9 / v11
    // like 4 and more: 8x15 x 163,840 K = 16 / 32 / 64 v8 21.83 / 23.13 / 25.29 µs, v9 17.74 / 18.85 / 20.83, v11 18.02 /
    // 18.84 / 19.82 (151,936 alike).
    const bool wide = cluster >= 4 || (cluster == 2 && v4_rows_pair_wave(rows));
    opt = wide ? V4Opt::kV9 : V4Opt::kV8;
    // v11 (session 8, NOTES "v11 (session 8"): the row bound where it measured faster than v9 in one process (H200,
    // randn x 4 rows of 163,840): 8-CTA clusters at k = 64 (1x15: 8.98 -> 7.94 µs), 4-CTA clusters at k = 32 and 64
    // (8x15: 22.7 -> 22.1, 25.7 -> 23.4); not at k = 16 (+0.35 / +0.2) nor with 8 CTAs at k = 32 (even). Session 13:
    // 2-CTA clusters at k = 64 (above; k = 32 even, taken as at 4).
    if (wide && (k > 32 || (k == 32 && cluster <= 4))) opt = V4Opt::kV11;
    // v13 (session 9, NOTES "v13 (session 9"): the compact v11 (rare paths called) at 8-CTA clusters, where it measured
    // faster than session 8's choice in one process (H200, randn x 4 rows of 163,840, 1x15, K = 16 / 32 / 64: graph of
    // 32 identical calls, Python bench 7.72 / 8.33 / 8.68 -> 7.76 / 7.94 / 8.29 µs, stage profiler 7.07 / 7.66 / 7.88 ->
    // 7.04 / 7.22 / 7.52; each call right after another kernel (cold code, as in a decoding round) 13.55 / 13.85 /
    // 14.51 -> 12.81 / 12.98 / 13.19, both minus the same 12.3 µs). Not at 4-CTA clusters (8x15: +2-3% in the graph of
    // identical calls, -5 to -6% with cold code), nor at 5-7 (not measured).
    if (session9 && cluster == k::kV4MaxCluster) opt = V4Opt::kV13r;
    // v15 (session 11, NOTES "v15 (session 11"): v9 again at k <= 16 where the launch is solo (a one-wave grid of 8-CTA
    // clusters, the condition of run_v4's solo): faster than v13r in a graph of identical calls (1x15 K = 16: Python
    // A/B 6.58 vs 6.77 µs, topk_period 6.22 vs 6.35) and even with it right after an lm_head GEMM, as a decoding round
    // calls it (bench_topk_pypath.py part 2, two calls: -0.12 / +0.07 µs, within that setting's noise). At k = 32 v9
    // was slower (6.68 vs 6.50; after the GEMM 7.81 vs 7.60). Session 9's cold-code advantage of v13r (12.81 vs 13.55)
    // was measured with the pair launch after an instruction-cache polluter, without PDL; it did not show after a GEMM.
    if (session9 && !s10 && cluster == k::kV4MaxCluster && k <= 16 &&
        int64_t(batch) * positions * cluster <= int64_t(sm_count()))
      opt = V4Opt::kV9;
  }
  if (k == 1 || opt == V4Opt::kV7b)
    return run_v4<T, 512, true, k::kV4OptV7b>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id,
                                               lse, error_flags, stream);
  if (opt == V4Opt::kV13r)
    return run_v4<T, 512, true, k::kV4OptV13r>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id,
                                                lse, error_flags, stream);
  if (opt == V4Opt::kV13s)
    return run_v4<T, 512, true, k::kV4OptV13s>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id,
                                                lse, error_flags, stream);
  if (compact && opt == V4Opt::kV11)
    return run_v4<T, 512, true, k::kV4OptV13r>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id,
                                                lse, error_flags, stream);
  if (compact && opt == V4Opt::kV9)
    return run_v4<T, 512, true, k::kV4OptV13>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id,
                                               lse, error_flags, stream);
  if (opt == V4Opt::kV11)
    return run_v4<T, 512, true, k::kV4OptV11>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id,
                                               lse, error_flags, stream);
  if (opt == V4Opt::kV10)
    return run_v4<T, 512, true, k::kV4OptV10>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id,
                                               lse, error_flags, stream);
  if (opt == V4Opt::kV9)
    return run_v4<T, 512, true, k::kV4OptV9>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id,
                                              lse, error_flags, stream);
  return run_v4<T, 512, true, k::kV4OptV8>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id,
                                            lse, error_flags, stream);
}

// The small-row kernel: one warp per row, kSmallWarps rows per CTA, grid (1, blocks); no workspace, PDL.
template <typename T>
ddtree_status_t run_small(const T* logits, int32_t batch, int32_t positions, int32_t vocab, int64_t batch_stride,
                          int64_t row_stride, int32_t topk, float* top_lp, int32_t* top_id, float* lse,
                          int32_t* error_flags, cudaStream_t stream) {
  const int64_t rows = int64_t(batch) * positions;
  const unsigned blocks = unsigned((rows + k::kSmallWarps - 1) / k::kSmallWarps);
  auto go = [&](auto kernel) {
    return ddtree::detail::launch("draft_topk_lse_small_kernel", kernel, dim3(1u, blocks, 1u),
                                  dim3(32 * k::kSmallWarps), stream, true, logits, int(rows), int(positions),
                                  int(vocab), batch_stride, row_stride, int(topk), top_lp, top_id, lse, error_flags);
  };
  switch (k::small_per_lane(vocab)) {
    case 8: return go(k::draft_topk_lse_small_kernel<T, 8>);
    case 12: return go(k::draft_topk_lse_small_kernel<T, 12>);
    case 16: return go(k::draft_topk_lse_small_kernel<T, 16>);
    default: return go(k::draft_topk_lse_small_kernel<T, 32>);
  }
}

template <typename T>
ddtree_status_t run_v3(const T* logits, int32_t batch, int32_t positions, int32_t vocab, int64_t batch_stride,
                       int64_t row_stride, int32_t topk, float* top_lp, int32_t* top_id, float* lse, void* workspace,
                       int32_t* error_flags, cudaStream_t stream) {
  const int64_t rows = int64_t(batch) * positions;
  constexpr int CHUNK = k::v3_chunk<T>();
  const int chunks = int(v3_chunks(vocab, CHUNK));
  const int64_t max_chunks = v3_chunks(vocab, k::kV3MinChunk);
  auto* cand = static_cast<uint64_t*>(workspace);
  auto* partial = reinterpret_cast<float2*>(
      static_cast<char*>(workspace) + align_up(size_t(rows) * size_t(max_chunks) * k::kV3Slot * sizeof(uint64_t)));
  const bool vec = rows_allow_vector_loads(logits, batch, batch_stride, row_stride);
  const dim3 grid1{unsigned(chunks), unsigned(rows), 1u};
  ddtree_status_t st =
      vec ? ddtree::detail::launch("draft_topk_partial_v3_kernel", k::draft_topk_partial_v3_kernel<T, true>, grid1,
                                   dim3(k::kV3Threads), stream, false, logits, positions, vocab, batch_stride,
                                   row_stride, topk, chunks, cand, partial, error_flags)
          : ddtree::detail::launch("draft_topk_partial_v3_kernel", k::draft_topk_partial_v3_kernel<T, false>, grid1,
                                   dim3(k::kV3Threads), stream, false, logits, positions, vocab, batch_stride,
                                   row_stride, topk, chunks, cand, partial, error_flags);
  if (st != DDTREE_STATUS_SUCCESS) return st;
  return ddtree::detail::launch("draft_topk_merge_v3_kernel", k::draft_topk_merge_v3_kernel<CHUNK>,
                                dim3(unsigned(rows)), dim3(k::kV3MergeThreads), stream, true,
                                static_cast<const uint64_t*>(cand), static_cast<const float2*>(partial), chunks, topk,
                                vocab, top_lp, top_id, lse);
}

template <typename T>
ddtree_status_t run(const T* logits, int32_t batch, int32_t positions, int32_t vocab, int64_t batch_stride,
                    int64_t row_stride, int32_t topk, float* top_lp, int32_t* top_id, float* lse, void* workspace,
                    int32_t* error_flags, cudaStream_t stream) {
  const int64_t rows = int64_t(batch) * positions;
  const int chunks = int(num_chunks(vocab));
  auto* cand = static_cast<uint64_t*>(workspace);
  auto* partial = reinterpret_cast<float2*>(static_cast<char*>(workspace) + cand_bytes(rows, vocab, topk));
  const bool vec = rows_allow_vector_loads(logits, batch, batch_stride, row_stride);
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
  const size_t v2 = cand_bytes(rows, vocab, k) + partial_bytes(rows, vocab);
  const size_t v3 = v3_bytes(rows, vocab);
  return v2 > v3 ? v2 : v3;
}

DDTREE_API ddtree_status_t ddtree_draft_topk_lse(const void* logits, ddtree_dtype_t dtype, int32_t batch,
                                                 int32_t positions, int32_t vocab, int64_t batch_stride,
                                                 int64_t row_stride, int32_t k, float* top_lp, int32_t* top_id,
                                                 float* lse, void* workspace, size_t workspace_bytes,
                                                 int32_t* error_flags, cudaStream_t stream) {
  return ddtree_draft_topk_lse_impl(logits, dtype, batch, positions, vocab, batch_stride, row_stride, k, top_lp,
                                    top_id, lse, workspace, workspace_bytes, error_flags, stream,
                                    DDTREE_TOPK_IMPL_DEFAULT);
}

DDTREE_API int32_t ddtree_draft_topk_lse_resolve_impl(int32_t k, int32_t impl) {
  // v4 needs cluster launch (sm_90+) and k <= 64; where it cannot run, v3 takes over. By default v3 runs
  // only where the H200 measured it faster than v2 (k <= 16: 3x at k = 1, 2x at k = 16; 2.3x slower at
  // k = 64); asked for explicitly, it takes any k <= 64. v2 runs everything else.
  const bool dflt = impl == DDTREE_TOPK_IMPL_DEFAULT;
  if (dflt) impl = env_impl();
  if (impl == DDTREE_TOPK_IMPL_V4) {
    if (k >= 1 && k <= k::kV4MaxK && cluster_launch()) return DDTREE_TOPK_IMPL_V4;
    impl = DDTREE_TOPK_IMPL_V3;
  }
  const int max_k = dflt ? kV3DefaultMaxK : k::kV3MaxK;
  return (impl == DDTREE_TOPK_IMPL_V3 && k >= 1 && k <= max_k) ? int32_t(DDTREE_TOPK_IMPL_V3)
                                                                : int32_t(DDTREE_TOPK_IMPL_V2);
}

DDTREE_API ddtree_status_t ddtree_draft_topk_lse_impl(const void* logits, ddtree_dtype_t dtype, int32_t batch,
                                                      int32_t positions, int32_t vocab, int64_t batch_stride,
                                                      int64_t row_stride, int32_t k, float* top_lp, int32_t* top_id,
                                                      float* lse, void* workspace, size_t workspace_bytes,
                                                      int32_t* error_flags, cudaStream_t stream, int32_t impl) {
  DDTREE_REQUIRE(impl == DDTREE_TOPK_IMPL_DEFAULT || impl == DDTREE_TOPK_IMPL_V2 || impl == DDTREE_TOPK_IMPL_V3 ||
                     impl == DDTREE_TOPK_IMPL_V4,
                 "draft_topk_lse: impl must be 0 (default), 2, 3 or 4, got %d", impl);
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
  const int32_t which = ddtree_draft_topk_lse_resolve_impl(k, impl);
  if (which == DDTREE_TOPK_IMPL_V4 && impl == DDTREE_TOPK_IMPL_DEFAULT && vocab <= k::kSmallMaxV && use_small(vocab, k)) {
    if (dtype == DDTREE_DTYPE_FLOAT32)
      return run_small(static_cast<const float*>(logits), batch, positions, vocab, batch_stride, row_stride, k,
                       top_lp, top_id, lse, error_flags, stream);
    return run_small(static_cast<const __nv_bfloat16*>(logits), batch, positions, vocab, batch_stride, row_stride, k,
                     top_lp, top_id, lse, error_flags, stream);
  }
  if (which == DDTREE_TOPK_IMPL_V4) {
    const int threads = v4_config().threads;
    if (dtype == DDTREE_DTYPE_FLOAT32) {
      const auto* x = static_cast<const float*>(logits);
      if (threads == 256)
        return run_v4<float, 256>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id, lse,
                                  error_flags, stream);
      if (threads == 1024)
        return run_v4<float, 1024>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id, lse,
                                   error_flags, stream);
      if (v4_config().async)
        return run_v4_async(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id, lse,
                            error_flags, stream);
      return run_v4<float, 512>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id, lse,
                                error_flags, stream);
    }
    const auto* x = static_cast<const __nv_bfloat16*>(logits);
    if (threads == 256)
      return run_v4<__nv_bfloat16, 256>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id, lse,
                                        error_flags, stream);
    if (threads == 1024)
      return run_v4<__nv_bfloat16, 1024>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id,
                                         lse, error_flags, stream);
    if (v4_config().async)
      return run_v4_async(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id, lse, error_flags,
                          stream);
    return run_v4<__nv_bfloat16, 512>(x, batch, positions, vocab, batch_stride, row_stride, k, top_lp, top_id, lse,
                                      error_flags, stream);
  }
  if (which == DDTREE_TOPK_IMPL_V3) {
    if (dtype == DDTREE_DTYPE_FLOAT32) {
      return run_v3(static_cast<const float*>(logits), batch, positions, vocab, batch_stride, row_stride, k, top_lp,
                    top_id, lse, workspace, error_flags, stream);
    }
    return run_v3(static_cast<const __nv_bfloat16*>(logits), batch, positions, vocab, batch_stride, row_stride, k,
                  top_lp, top_id, lse, workspace, error_flags, stream);
  }
  if (dtype == DDTREE_DTYPE_FLOAT32) {
    return run(static_cast<const float*>(logits), batch, positions, vocab, batch_stride, row_stride, k, top_lp,
               top_id, lse, workspace, error_flags, stream);
  }
  return run(static_cast<const __nv_bfloat16*>(logits), batch, positions, vocab, batch_stride, row_stride, k, top_lp,
             top_id, lse, workspace, error_flags, stream);
}

}  // extern "C"
