// Stage-truncation profile and stage trace of draft_topk_lse v4 (NOTES, "v6 (session 4)", "v8 (session 6)").
// The kernel instantiated with STOP = 1..5 exits after a stage (1 loads + maxima, 2 sums + first barrier,
// 3 bound / CTA partial, 4 candidates, 5 all but the merge; 0 = whole), for session 6's default (v8) and
// session 7's v9 (NOTES "v9"), then each v9 option alone and both whole once more, at 1x15 (8 CTAs per row) and 8x15
// (4) x 163,840 bf16 (uniform logits in [-12, 12)) and 1x15 / 8x15 x 320, k = 1, 16, 32, 64; an empty kernel
// with the same launch (clusters + PDL) and the library's C ABI call. Each figure:
// median µs per call of 40 replays of a CUDA graph of 32 calls over rotating inputs (> L2), as the Python
// bench measures. Then STOP = 9 (the whole kernel with per-CTA %clock64 stamps at each stage, the latest
// warp per CTA): the mean and max over CTAs of each stage's time after the PDL wait, for one call after
// four untraced ones. Build (repo root, after the library in engine/build-topk):
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -Iengine/include \
//     engine/bench/profile/draft_topk_lse_stages.cu -Lengine/build-topk -lddtree \
//     -Xlinker -rpath='$ORIGIN' -o engine/build-topk/topk_stages
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "ddtree/draft_topk_lse.h"

// Trace build of the kernel (STOP = 9: the whole kernel plus stamps): lane 0 of each warp passing mark i
// raises slot i of its CTA's row in g_trace to its SM clock (the latest warp wins), slot 0 is thread 0's
// entry clock, slot 15 its entry %globaltimer and slot 14 the latest %globaltimer of any mark.
// STOP = 10: the same into g_trace2 (session 8: two consecutive calls, one per buffer, for the time from one call's
// last mark to the next call's PDL release).
__device__ unsigned long long* g_trace;
__device__ unsigned long long* g_trace2;
__device__ __forceinline__ void v4_trace_mark(int i, unsigned long long* buf) {
  if ((threadIdx.x & 31) != 0) return;
  unsigned long long* t = buf + (size_t(blockIdx.y) * gridDim.x + blockIdx.x) * 16;
  const unsigned long long c = clock64();
  unsigned long long g;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
  if (i == 0) {
    if (threadIdx.x == 0) {
      t[0] = c;
      t[15] = g;
    }
    return;
  }
  atomicMax(t + i, c);
  atomicMax(t + 14, g);
}
#define DDTREE_V4_MARK(i) \
  do {                     \
    if (STOP == 9 || STOP == 10) v4_trace_mark(i, STOP == 10 ? g_trace2 : g_trace); \
  } while (0)
#include "graph_timer.h"
#include "ddtree/kernels/draft_topk_lse_v4.cuh"

namespace k = ddtree::kernels;
using bf16 = __nv_bfloat16;

// Same signature and launch as the kernel: the floor of a call (launch, cluster scheduling, PDL wait).
__global__ void __launch_bounds__(512, 2) empty_kernel(const bf16*, int, int, int64_t, int64_t, int, int, int, float*,
                                                       int32_t*, float*, int32_t*) {
  k::pdl_launch_dependents();
  k::pdl_wait();
}

// (fill_normal, randn x 4 rows: graph_timer.h.)

// Session 9 (NOTES "v13"): an instruction-cache polluter. Each block (one warp; two per SM) runs 8,192 straight-line FMAs
// (128 KB of code) once, so the kernel launched after it starts with its code cold in every SM's instruction caches, as
// in a decoding round, where the drafter's and other kernels run between two top-k calls. (A graph of 32 identical
// calls keeps the top-k code warm from one call to the next.)
__global__ void icache_polluter(float* out, float a, float b) {
  float x0 = threadIdx.x, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3, x4 = x0 + 4, x5 = x0 + 5, x6 = x0 + 6, x7 = x0 + 7;
#pragma unroll
  for (int i = 0; i < 1024; ++i) {
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x0) : "f"(a), "f"(b));
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x1) : "f"(a), "f"(b));
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x2) : "f"(a), "f"(b));
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x3) : "f"(a), "f"(b));
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x4) : "f"(a), "f"(b));
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x5) : "f"(a), "f"(b));
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x6) : "f"(a), "f"(b));
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x7) : "f"(a), "f"(b));
  }
  const float v = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
  if (v == 1.2345e-30f) out[threadIdx.x] = v;
}

struct Shape {
  int B, L, V, max_cluster, sets;
  std::vector<bf16*> xs;
};

template <typename Kernel>
void launch(Kernel kern, const Shape& sh, const bf16* x, int topk, float* lp, int32_t* id, float* lse, int32_t* flags,
            cudaStream_t s) {
  const auto split = k::v4_split<bf16, 512>(sh.V, sh.max_cluster);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(split.cluster), unsigned(sh.B * sh.L), 1u);
  cfg.blockDim = dim3(512);
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = unsigned(split.cluster);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  CK(cudaLaunchKernelEx(&cfg, kern, x, sh.L, sh.V, int64_t(sh.L) * sh.V, int64_t(sh.V), topk, split.cluster,
                        split.pv, lp, id, lse, flags));
}

template <unsigned OPT, int STOP>
float time_variant(const Shape& sh, int topk, float* lp, int32_t* id, float* lse, int32_t* flags, cudaStream_t s) {
  auto kern = k::draft_topk_lse_v4_kernel<bf16, true, 512, true, OPT, STOP>;
  return time_graph(s, 32, [&](int i) { launch(kern, sh, sh.xs[i % sh.sets], topk, lp, id, lse, flags, s); });
}

// Session 9: the whole kernel launched right after icache_polluter, as graph replays of 32 (polluter, call) pairs, minus
// the polluter alone (`pol_us`, timed once per process): the per-call time with cold instruction caches.
template <unsigned OPT>
void whole_cold(const char* name, std::vector<Shape>& shapes, const std::vector<int>& ks, float* lp, int32_t* id,
                float* lse, int32_t* flags, cudaStream_t s, int pol_blocks, float pol_us) {
  auto kern = k::draft_topk_lse_v4_kernel<bf16, true, 512, true, OPT, 0>;
  std::printf("%-22s %-26s", name, "0 whole, after polluter");
  for (Shape& sh : shapes)
    for (int kk : ks)
      std::printf(" %8.2f", time_graph(s, 32, [&](int i) {
                    icache_polluter<<<pol_blocks, 32, 0, s>>>(lp, 1.0001f, 1e-7f);
                    launch(kern, sh, sh.xs[i % sh.sets], kk, lp, id, lse, flags, s);
                  }) - pol_us);
  std::printf("\n");
  std::fflush(stdout);
}

// The whole kernel only (STOP = 0), for option combinations.
template <unsigned OPT>
void whole(const char* name, std::vector<Shape>& shapes, const std::vector<int>& ks, float* lp, int32_t* id, float* lse,
           int32_t* flags, cudaStream_t s) {
  std::printf("%-22s %-26s", name, "0 whole kernel");
  for (Shape& sh : shapes)
    for (int kk : ks) std::printf(" %8.2f", time_variant<OPT, 0>(sh, kk, lp, id, lse, flags, s));
  std::printf("\n");
  std::fflush(stdout);
}

template <unsigned OPT>
void row(const char* name, std::vector<Shape>& shapes, const std::vector<int>& ks, float* lp, int32_t* id, float* lse,
         int32_t* flags, cudaStream_t s) {
  auto one = [&](auto stop_tag, const char* stage) {
    constexpr int STOP = decltype(stop_tag)::value;
    std::printf("%-22s %-26s", name, stage);
    for (Shape& sh : shapes)
      for (int kk : ks) std::printf(" %8.2f", time_variant<OPT, STOP>(sh, kk, lp, id, lse, flags, s));
    std::printf("\n");
    std::fflush(stdout);
  };
  one(std::integral_constant<int, 1>{}, "1 loads+max");
  one(std::integral_constant<int, 2>{}, "2 +sums,barrier1");
  one(std::integral_constant<int, 3>{}, "3 +bound/partial");
  one(std::integral_constant<int, 4>{}, "4 +candidates (k>1)");
  one(std::integral_constant<int, 5>{}, "5 +ranks,exchange");
  one(std::integral_constant<int, 0>{}, "0 whole kernel");
}

int main(int argc, char** argv) {
  // The last two: the end-to-end bench's small model (V = 320, one CTA per row; NOTES "v7").
  std::vector<Shape> shapes = {
      {1, 15, 163840, 8, 16, {}}, {8, 15, 163840, 4, 4, {}}, {1, 15, 320, 8, 4, {}}, {8, 15, 320, 8, 4, {}}};
  const std::vector<int> ks = {1, 16, 32, 64};
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  // randn x 4 rows (the Python bench's) in the v11 and v13(b) modes, uniform ones otherwise (`calls`, for ncu, as in session 8).
  const std::string mode = argc > 1 ? argv[1] : "";
  const bool normal = mode == "v11" || mode == "v13" || mode == "v13b";
  for (Shape& sh : shapes) {
    const size_t n = size_t(sh.B) * sh.L * sh.V;
    for (int i = 0; i < sh.sets; ++i) {
      bf16* p;
      CK(cudaMalloc(&p, n * 2));
      if (normal) fill_normal<<<512, 256, 0, s>>>(p, n, 17u * i + 1u + 1000u * sh.B);
      else fill<<<512, 256, 0, s>>>(p, n, 17u * i + 1u + 1000u * sh.B);
      sh.xs.push_back(p);
    }
  }
  float *lp, *lse;
  int32_t *id, *flags;
  CK(cudaMalloc(&lp, 8 * 15 * 64 * 4));
  CK(cudaMalloc(&id, 8 * 15 * 64 * 4));
  CK(cudaMalloc(&lse, 8 * 15 * 4));
  CK(cudaMalloc(&flags, 4));
  CK(cudaMemset(flags, 0, 4));
  size_t ws_bytes = ddtree_draft_topk_lse_workspace_size(8, 15, 163840, 64);
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  for (int i = 0; i < 3000; ++i) {  // clocks up (rewrites the 1x15 inputs: the same distribution as their first fill)
    if (normal) fill_normal<<<512, 256, 0, s>>>(shapes[0].xs[i % shapes[0].sets], 15 * 163840, i);
    else fill<<<512, 256, 0, s>>>(shapes[0].xs[i % shapes[0].sets], 15 * 163840, i);
  }
  CK(cudaStreamSynchronize(s));

  if (argc > 2 && std::string(argv[1]) == "calls") {
    // For an ncu source-level profile: 20 plain library calls at 1x15 K = argv[2] (profile one with
    // --launch-skip), no graphs, no other kernels after the fills.
    const int kk = std::atoi(argv[2]);
    for (int i = 0; i < 20; ++i)
      ddtree_draft_topk_lse(shapes[0].xs[i % shapes[0].sets], DDTREE_DTYPE_BFLOAT16, 1, 15, 163840, int64_t(15) * 163840,
                            163840, kk, lp, id, lse, ws, ws_bytes, flags, s);
    CK(cudaStreamSynchronize(s));
    std::printf("calls done\n");
    return 0;
  }
  std::printf("%-22s %-26s", "variant", "stage");
  for (const Shape& sh : shapes)
    for (int kk : ks) std::printf(" %3dx%d K%-2d", sh.B, sh.L, kk);
  std::printf("\n");
  std::printf("%-22s %-26s", "empty (cluster+PDL)", "-");
  for (Shape& sh : shapes)
    for (size_t j = 0; j < ks.size(); ++j)
      std::printf(" %8.2f", time_graph(s, 32, [&](int) {
                    launch(empty_kernel, sh, nullptr, 0, nullptr, nullptr, nullptr, nullptr, s);
                  }));
  std::printf("\n");
  std::printf("%-22s %-26s", "library C ABI", "default");
  for (Shape& sh : shapes)
    for (int kk : ks)
      std::printf(" %8.2f", time_graph(s, 32, [&](int i) {
                    ddtree_draft_topk_lse(sh.xs[i % sh.sets], DDTREE_DTYPE_BFLOAT16, sh.B, sh.L, sh.V,
                                          int64_t(sh.L) * sh.V, sh.V, kk, lp, id, lse, ws, ws_bytes, flags, s);
                  }));
  std::printf("\n");
  // (Sessions 4-6 timed v5b, v6, the v6 opt-ins, each v7 option, v7b and the v8 tries here: all in NOTES.)
  // Session 7 (NOTES "v9"): session 6's default (v8) and v9 (v8 + the per-round lane append + the all-to-all
  // merge) by stage, each v9 option alone on v8, then both once more (drift).
  constexpr unsigned V8 = k::kV4OptV8, V9 = k::kV4OptV9, V10 = k::kV4OptV10, V11 = k::kV4OptV11;
  constexpr unsigned V13 = k::kV4OptV13, V13r = k::kV4OptV13r, V13a = k::kV4OptV13a, V13s = k::kV4OptV13s;
  const bool v10 = argc > 1 && std::string(argv[1]) == "v10";
  const bool v11 = argc > 1 && std::string(argv[1]) == "v11";
  const bool v13 = mode == "v13", v13b = mode == "v13b";
  if (v13b) {
    // Session 9, second call (NOTES "v13"): the library default (v13r at 8-CTA clusters), v9, v11 and the two compact
    // builds of v11 (rare paths called / inline), whole kernel, alternating three times.
    for (int rep = 0; rep < 3; ++rep) {
      whole<V9>("v9", shapes, ks, lp, id, lse, flags, s);
      whole<V11>("v11", shapes, ks, lp, id, lse, flags, s);
      whole<V13r>("v13r (v11 compact)", shapes, ks, lp, id, lse, flags, s);
      whole<V13s>("v13s (inline rare)", shapes, ks, lp, id, lse, flags, s);
      std::printf("%-22s %-26s", "library C ABI", "default");
      for (Shape& sh : shapes)
        for (int kk : ks)
          std::printf(" %8.2f", time_graph(s, 32, [&](int i) {
                        ddtree_draft_topk_lse(sh.xs[i % sh.sets], DDTREE_DTYPE_BFLOAT16, sh.B, sh.L, sh.V,
                                              int64_t(sh.L) * sh.V, sh.V, kk, lp, id, lse, ws, ws_bytes, flags, s);
                      }));
      std::printf("\n");
    }
    // The same with cold instruction caches (each call right after icache_polluter), alternating twice.
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int pol_blocks = 2 * sms;
    const float pol_us = time_graph(s, 32, [&](int) { icache_polluter<<<pol_blocks, 32, 0, s>>>(lp, 1.0001f, 1e-7f); });
    std::printf("%-22s %-26s %8.2f\n", "icache polluter alone", "-", pol_us);
    for (int rep = 0; rep < 2; ++rep) {
      whole_cold<V9>("v9", shapes, ks, lp, id, lse, flags, s, pol_blocks, pol_us);
      whole_cold<V11>("v11", shapes, ks, lp, id, lse, flags, s, pol_blocks, pol_us);
      whole_cold<V13>("v13 (v9 compact)", shapes, ks, lp, id, lse, flags, s, pol_blocks, pol_us);
      whole_cold<V13r>("v13r (v11 compact)", shapes, ks, lp, id, lse, flags, s, pol_blocks, pol_us);
      whole_cold<V13s>("v13s (inline rare)", shapes, ks, lp, id, lse, flags, s, pol_blocks, pol_us);
      std::printf("%-22s %-26s", "library C ABI", "default, after polluter");
      for (Shape& sh : shapes)
        for (int kk : ks)
          std::printf(" %8.2f", time_graph(s, 32, [&](int i) {
                        icache_polluter<<<pol_blocks, 32, 0, s>>>(lp, 1.0001f, 1e-7f);
                        ddtree_draft_topk_lse(sh.xs[i % sh.sets], DDTREE_DTYPE_BFLOAT16, sh.B, sh.L, sh.V,
                                              int64_t(sh.L) * sh.V, sh.V, kk, lp, id, lse, ws, ws_bytes, flags, s);
                      }) - pol_us);
      std::printf("\n");
      std::fflush(stdout);
    }
  } else if (v13) {
    // Session 9, s9topk (NOTES "v13"): v9 and v11 (the default's two k > 1 instantiations at these clusters) against
    // their compact builds (v13 / v13r: rare passes called; v13a: v9 compact, rare passes inline), whole kernel,
    // alternating three times, then v9 and v13 by stage.
    for (int rep = 0; rep < 3; ++rep) {
      whole<V9>("v9", shapes, ks, lp, id, lse, flags, s);
      whole<V13>("v13 (v9 compact)", shapes, ks, lp, id, lse, flags, s);
      whole<V13a>("v13a (inline rare)", shapes, ks, lp, id, lse, flags, s);
      whole<V11>("v11", shapes, ks, lp, id, lse, flags, s);
      whole<V13r>("v13r (v11 compact)", shapes, ks, lp, id, lse, flags, s);
    }
    row<V9>("v9", shapes, ks, lp, id, lse, flags, s);
    row<V13>("v13 (v9 compact)", shapes, ks, lp, id, lse, flags, s);
  } else if (v11) {
    // Session 8, s8topk (NOTES "v11"): v9 (the default for these clusters) against v11 (v9 + the row bound), whole
    // kernel, alternating three times, then both by stage.
    for (int rep = 0; rep < 3; ++rep) {
      whole<V9>("v9", shapes, ks, lp, id, lse, flags, s);
      whole<V11>("v11", shapes, ks, lp, id, lse, flags, s);
    }
    row<V9>("v9", shapes, ks, lp, id, lse, flags, s);
    row<V11>("v11", shapes, ks, lp, id, lse, flags, s);
  } else if (v10) {
    // Session 7, s7topk2 (NOTES "v10"): v9 (the default for these clusters) against v10 (v9 + the spread puts),
    // whole kernel, alternating three times, then both by stage.
    for (int rep = 0; rep < 3; ++rep) {
      whole<V9>("v9", shapes, ks, lp, id, lse, flags, s);
      whole<V10>("v10", shapes, ks, lp, id, lse, flags, s);
    }
    row<V9>("v9", shapes, ks, lp, id, lse, flags, s);
    row<V10>("v10", shapes, ks, lp, id, lse, flags, s);
  } else if (argc > 1 && std::string(argv[1]) == "quick") {
    // v8 and v9 whole, twice, then v9's stages and one trace (session 7's second call also timed the first
    // v9 build there: NOTES).
    for (int rep = 0; rep < 2; ++rep) {
      whole<V8>("v8", shapes, ks, lp, id, lse, flags, s);
      whole<V9>("v9", shapes, ks, lp, id, lse, flags, s);
    }
    row<V9>("v9", shapes, ks, lp, id, lse, flags, s);
  } else {
  row<V8>("v8 (session 6)", shapes, ks, lp, id, lse, flags, s);
  row<V9>("v9", shapes, ks, lp, id, lse, flags, s);
  whole<V8 | k::kV4OptWarpAppend>("v8 + round append", shapes, ks, lp, id, lse, flags, s);
  whole<V8 | k::kV4OptA2AMerge>("v8 + all-to-all merge", shapes, ks, lp, id, lse, flags, s);
  whole<V8>("v8 (again)", shapes, ks, lp, id, lse, flags, s);
  whole<V9>("v9 (again)", shapes, ks, lp, id, lse, flags, s);
  }

  // Stage timeline of one call (trace build), after 4 untraced calls; slot deltas from mark 1 (after the
  // PDL wait) in ns at the clock the stamps measured.
  unsigned long long* d_trace;
  const size_t tr_n = size_t(8) * 15 * 8 * 16;
  CK(cudaMalloc(&d_trace, tr_n * 8));
  CK(cudaMemcpyToSymbol(g_trace, &d_trace, sizeof(d_trace)));
  const char* names[11] = {"entry", "pdl_wait", "sums", "barrier1", "bound/k1:partial", "cands/k1:cwait",
                           "ranks,put", "cta0 bar", "cta0 mbar", "end(cta0)", "v11 row bound in"};
  auto trace = [&](const char* label, auto kern, Shape& sh, int kk) {
    std::vector<unsigned long long> h(tr_n);
    for (int it = 0; it < 50; ++it) {
      for (int i = 0; i < 4; ++i)
        launch(k::draft_topk_lse_v4_kernel<bf16, true, 512, true, k::kV4OptDefault, 0>, sh, sh.xs[i % sh.sets], kk,
               lp, id, lse, flags, s);
      CK(cudaMemsetAsync(d_trace, 0, tr_n * 8, s));
      launch(kern, sh, sh.xs[it % sh.sets], kk, lp, id, lse, flags, s);
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h.data(), d_trace, tr_n * 8, cudaMemcpyDeviceToHost));
    const auto split = k::v4_split<bf16, 512>(sh.V, sh.max_cluster);
    const int ctas = split.cluster * sh.B * sh.L;
    double ghz_num = 0, ghz_den = 0;
    unsigned long long g0 = ~0ull, g1 = 0;
    for (int b = 0; b < ctas; ++b) {
      const unsigned long long* t = &h[size_t(b) * 16];
      unsigned long long last = 0;
      for (int i = 1; i < 11; ++i) last = std::max(last, t[i]);
      if (t[14] > t[15] && last > t[0]) {
        ghz_num += double(last - t[0]);
        ghz_den += double(t[14] - t[15]);
      }
      g0 = std::min(g0, t[15]);
      g1 = std::max(g1, t[14]);
    }
    const double ghz = ghz_den > 0 ? ghz_num / ghz_den : 1.98;
    std::printf("trace %-18s %dx%d K%-2d: clock %.2f GHz, first entry -> last mark %.2f us; per stage, us after "
                "the PDL wait (mean / max over CTAs; cta0 = the merging CTAs):\n",
                label, sh.B, sh.L, kk, ghz, double(g1 - g0) / 1000.0);
    for (int i = 0; i < 11; ++i) {
      double sum[2] = {0, 0}, mx[2] = {0, 0};
      int n[2] = {0, 0};
      for (int b = 0; b < ctas; ++b) {
        const unsigned long long* t = &h[size_t(b) * 16];
        const int z = (b % split.cluster) == 0 ? 1 : 0;
        if (t[i] == 0 || t[1] == 0) continue;
        const double d = (double(t[i]) - double(t[1])) / ghz / 1000.0;
        sum[z] += d;
        mx[z] = std::max(mx[z], d);
        ++n[z];
      }
      std::printf("  %-18s others %6.2f / %6.2f (%3d)   cta0 %6.2f / %6.2f (%3d)\n", names[i],
                  n[0] ? sum[0] / n[0] : 0.0, mx[0], n[0], n[1] ? sum[1] / n[1] : 0.0, mx[1], n[1]);
    }
    std::fflush(stdout);
  };
  // Two consecutive traced calls (the first into g_trace, the second into g_trace2, launched back to back with PDL):
  // per CTA the %globaltimer of its PDL release is its entry time plus (mark 1 - entry) SM clocks. Printed in µs from
  // the first call's earliest release: its latest mark, the second call's earliest entry, earliest and latest release
  // and latest mark (the call period is the difference of the two earliest releases).
  unsigned long long* d_trace2;
  CK(cudaMalloc(&d_trace2, tr_n * 8));
  CK(cudaMemcpyToSymbol(g_trace2, &d_trace2, sizeof(d_trace2)));
  auto pair_trace = [&](const char* label, auto kern_a, auto kern_b, Shape& sh, int kk) {
    std::vector<unsigned long long> ha(tr_n), hb(tr_n);
    for (int it = 0; it < 50; ++it) {
      for (int i = 0; i < 4; ++i)
        launch(k::draft_topk_lse_v4_kernel<bf16, true, 512, true, k::kV4OptDefault, 0>, sh, sh.xs[i % sh.sets], kk,
               lp, id, lse, flags, s);
      CK(cudaMemsetAsync(d_trace, 0, tr_n * 8, s));
      CK(cudaMemsetAsync(d_trace2, 0, tr_n * 8, s));
      launch(kern_a, sh, sh.xs[it % sh.sets], kk, lp, id, lse, flags, s);
      launch(kern_b, sh, sh.xs[(it + 1) % sh.sets], kk, lp, id, lse, flags, s);
    }
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(ha.data(), d_trace, tr_n * 8, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hb.data(), d_trace2, tr_n * 8, cudaMemcpyDeviceToHost));
    const auto split = k::v4_split<bf16, 512>(sh.V, sh.max_cluster);
    const int ctas = split.cluster * sh.B * sh.L;
    struct Sum { double entry_min = 1e300, rel_min = 1e300, rel_max = 0, last_max = 0; };
    auto sum = [&](const std::vector<unsigned long long>& h) {
      Sum r;
      for (int b = 0; b < ctas; ++b) {
        const unsigned long long* t = &h[size_t(b) * 16];
        if (t[1] == 0 || t[15] == 0) continue;
        const double rel = double(t[15]) + (double(t[1]) - double(t[0])) / 1.98;
        r.entry_min = std::min(r.entry_min, double(t[15]));
        r.rel_min = std::min(r.rel_min, rel);
        r.rel_max = std::max(r.rel_max, rel);
        r.last_max = std::max(r.last_max, double(t[14]));
      }
      return r;
    };
    const Sum a = sum(ha), b = sum(hb);
    const double z = a.rel_min;
    std::printf("pair trace %-6s %dx%d K%-2d (us from call 1's first PDL release; 1.98 GHz): call 1 release last %.2f, "
                "last mark %.2f | call 2 first entry %.2f, release first %.2f last %.2f, last mark %.2f\n",
                label, sh.B, sh.L, kk, (a.rel_max - z) / 1e3, (a.last_max - z) / 1e3, (b.entry_min - z) / 1e3,
                (b.rel_min - z) / 1e3, (b.rel_max - z) / 1e3, (b.last_max - z) / 1e3);
    std::fflush(stdout);
  };
  if (v11) {
    pair_trace("v7b", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, k::kV4OptV7b, 9>,
               k::draft_topk_lse_v4_kernel<bf16, true, 512, true, k::kV4OptV7b, 10>, shapes[0], 1);
    pair_trace("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 9>,
               k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 10>, shapes[0], 16);
    pair_trace("v11", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V11, 9>,
               k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V11, 10>, shapes[0], 16);
    pair_trace("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 9>,
               k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 10>, shapes[0], 64);
    pair_trace("v11", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V11, 9>,
               k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V11, 10>, shapes[0], 64);
    trace("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 9>, shapes[0], 16);
    trace("v11", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V11, 9>, shapes[0], 16);
    trace("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 9>, shapes[0], 64);
    trace("v11", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V11, 9>, shapes[0], 64);
    int hflags = 0;
    CK(cudaMemcpy(&hflags, flags, 4, cudaMemcpyDeviceToHost));
    CK(cudaGetLastError());
    std::printf("flags %d (0 expected)\n", hflags);
    return 0;
  }
  if (v13b) {
    trace("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 9>, shapes[0], 16);
    trace("v13r", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 9>, shapes[0], 16);
    trace("v13s", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13s, 9>, shapes[0], 16);
    int hflags = 0;
    CK(cudaMemcpy(&hflags, flags, 4, cudaMemcpyDeviceToHost));
    CK(cudaGetLastError());
    std::printf("flags %d (0 expected)\n", hflags);
    return 0;
  }
  if (v13) {
    trace("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 9>, shapes[0], 16);
    trace("v13", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13, 9>, shapes[0], 16);
    trace("v11", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V11, 9>, shapes[0], 64);
    trace("v13r", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 9>, shapes[0], 64);
    int hflags = 0;
    CK(cudaMemcpy(&hflags, flags, 4, cudaMemcpyDeviceToHost));
    CK(cudaGetLastError());
    std::printf("flags %d (0 expected)\n", hflags);
    return 0;
  }
  if (v10) {
    trace("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 9>, shapes[0], 16);
    trace("v10", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V10, 9>, shapes[0], 16);
    trace("v10", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V10, 9>, shapes[0], 64);
    int hflags = 0;
    CK(cudaMemcpy(&hflags, flags, 4, cudaMemcpyDeviceToHost));
    CK(cudaGetLastError());
    std::printf("flags %d (0 expected)\n", hflags);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "quick") {
    trace("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 9>, shapes[0], 16);
    std::printf("flags (not read in quick mode)\n");
    return 0;
  }
  trace("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 9>, shapes[0], 16);
  trace("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 9>, shapes[0], 64);
  trace("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 9>, shapes[1], 16);
  trace("v8", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V8, 9>, shapes[0], 16);

  int hflags = 0;
  CK(cudaMemcpy(&hflags, flags, 4, cudaMemcpyDeviceToHost));
  CK(cudaGetLastError());
  std::printf("flags %d (0 expected)\n", hflags);
  return 0;
}
