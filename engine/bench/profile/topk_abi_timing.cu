// Issue #3 clue 1 (session 12, NOTES "v16 (session 12"): the library's draft_topk_lse C ABI timed the way the C
// profilers time it (graph_timer.h time_graph: event, graph launch, event, sync) against the same graph behind a
// GPU spin ("fenced": a one-thread %globaltimer spin of FENCE_US is queued before the start event, so the host's
// event record and graph launch overlap the spin and the events bracket the graph alone, as bench_e2e.py's
// fenced() does). A per-replay cost (the GPU idling between the start event and the graph's first kernel while the
// host is still launching) shows as plain - fenced, divided over the calls in a graph: larger at 16 calls than at 64.
// 1x15 x 163,840 bf16, randn x 4 (graph_timer.h fill_normal), 16 input sets (> L2), K = 1 / 16 / 32 / 64, graphs
// of 16 and 64 calls, three alternating passes; warm-up as topk_period (3,000 fills).
// Build (repo root, after the library in engine/build-topk):
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -Iengine/include \
//     engine/bench/profile/topk_abi_timing.cu -Lengine/build-topk -lddtree -Xlinker -rpath='$ORIGIN' \
//     -o engine/build-topk/topk_abi_timing
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "ddtree/draft_topk_lse.h"
#include "graph_timer.h"

constexpr int kL = 15, kV = 163840, kSets = 16;
constexpr double kFenceUs = 60.0;

// One thread spins until %globaltimer has moved `ns` nanoseconds (independent of the SM clock).
__global__ void spin_ns(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

// Median µs per call of `calls` calls of body(i) captured in one graph; fenced: each replay behind the spin.
float time_graph_mode(cudaStream_t s, int calls, bool fenced, const std::function<void(int)>& body) {
  if (!fenced) return time_graph(s, calls, body);
  return time_graph(s, calls, body, [s] { spin_ns<<<1, 1, 0, s>>>((unsigned long long)(kFenceUs * 1000)); });
}

int main() {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  const size_t n = size_t(kL) * kV;
  std::vector<__nv_bfloat16*> xs;
  for (int i = 0; i < kSets; ++i) {
    __nv_bfloat16* p;
    CK(cudaMalloc(&p, n * 2));
    fill_normal<<<512, 256, 0, s>>>(p, n, 17u * i + 1u);
    xs.push_back(p);
  }
  float *lp, *lse;
  int32_t *id, *flags;
  CK(cudaMalloc(&lp, kL * 64 * 4));
  CK(cudaMalloc(&id, kL * 64 * 4));
  CK(cudaMalloc(&lse, kL * 4));
  CK(cudaMalloc(&flags, 4));
  CK(cudaMemset(flags, 0, 4));
  const size_t ws_bytes = ddtree_draft_topk_lse_workspace_size(1, kL, kV, 64);
  void* ws;
  CK(cudaMalloc(&ws, ws_bytes));
  for (int i = 0; i < 3000; ++i) fill_normal<<<512, 256, 0, s>>>(xs[i % kSets], n, 1000u + i);  // clocks up
  CK(cudaStreamSynchronize(s));
  const int ks[4] = {1, 16, 32, 64};
  const int lens[2] = {16, 64};
  // acc[k][len][fenced] over passes
  std::vector<float> acc[4][2][2];
  for (int pass = 0; pass < 3; ++pass)
    for (int ki = 0; ki < 4; ++ki)
      for (int li = 0; li < 2; ++li)
        for (int f = 0; f < 2; ++f) {
          const int kk = ks[ki];
          acc[ki][li][f].push_back(time_graph_mode(s, lens[li], f == 1, [&](int i) {
            ddtree_draft_topk_lse(xs[i % kSets], DDTREE_DTYPE_BFLOAT16, 1, kL, kV, int64_t(kL) * kV, kV, kk, lp, id,
                                  lse, ws, ws_bytes, flags, s);
          }));
        }
  std::printf("C ABI, 1x15x163840, us per call (median of 40 replays; medians of 3 passes; passes in brackets)\n");
  std::printf("K   plain16                 fenced16                plain64                 fenced64\n");
  for (int ki = 0; ki < 4; ++ki) {
    std::printf("%-3d", ks[ki]);
    for (int li = 0; li < 2; ++li)
      for (int f = 0; f < 2; ++f) {
        std::vector<float> v = acc[ki][li][f];
        std::sort(v.begin(), v.end());
        std::printf(" %5.2f (%4.2f/%4.2f/%4.2f)", v[1], acc[ki][li][f][0], acc[ki][li][f][1], acc[ki][li][f][2]);
      }
    std::printf("\n");
  }
  int hf = 0;
  CK(cudaMemcpy(&hf, flags, 4, cudaMemcpyDeviceToHost));
  CK(cudaGetLastError());
  std::printf("flags %d (0 expected)\n", hf);
  return 0;
}
