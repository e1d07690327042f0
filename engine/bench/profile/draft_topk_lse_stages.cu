// Stage-truncation profile of draft_topk_lse v4 (NOTES, "v6 (session 4)"): the kernel instantiated with
// STOP = 1..5 exits after a stage (1 loads + maxima, 2 sums + first barrier, 3 bound / CTA partial,
// 4 candidates, 5 all but CTA 0's merge; 0 = whole), for the v5b paths (OPT 0), v5b + fast loads and the
// v6 default (fast loads + the k = 1 warp path), at 1x15 (8 CTAs per row) and 8x15 (4) x 163,840 bf16,
// k = 1, 16, 64; plus an empty kernel with the same launch (clusters + PDL) and the library's C ABI call.
// Each figure: median µs per call of 40 replays of a CUDA graph of 32 calls over rotating inputs (> L2),
// as the Python bench measures. Build (repo root, after the library in engine/build-topk):
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -Iengine/include \
//     engine/bench/profile/draft_topk_lse_stages.cu -Lengine/build-topk -lddtree \
//     -Xlinker -rpath='$ORIGIN' -o engine/build-topk/topk_stages
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "ddtree/draft_topk_lse.h"
#include "ddtree/kernels/draft_topk_lse_v4.cuh"

namespace k = ddtree::kernels;
using bf16 = __nv_bfloat16;

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

__global__ void fill(bf16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B9u ^ seed;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    // roughly the bench's randn * 4 range, bf16
    x[i] = __float2bfloat16((float(h & 0xFFFFFF) / 16777216.f - 0.5f) * 24.f);
  }
}
// Same signature and launch as the kernel: the floor of a call (launch, cluster scheduling, PDL wait).
__global__ void __launch_bounds__(512, 2) empty_kernel(const bf16*, int, int, int64_t, int64_t, int, int, int, float*,
                                                       int32_t*, float*, int32_t*) {
  k::pdl_launch_dependents();
  k::pdl_wait();
}

float time_graph(cudaStream_t s, int calls, const std::function<void(int)>& body) {
  for (int i = 0; i < calls; ++i) body(i);
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) body(i);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < 40; ++r) {
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms * 1000.f / calls);
  }
  std::sort(t.begin(), t.end());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return t[t.size() / 2];
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

int main() {
  std::vector<Shape> shapes = {{1, 15, 163840, 8, 16, {}}, {8, 15, 163840, 4, 4, {}}};
  const std::vector<int> ks = {1, 16, 64};
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  for (Shape& sh : shapes) {
    const size_t n = size_t(sh.B) * sh.L * sh.V;
    for (int i = 0; i < sh.sets; ++i) {
      bf16* p;
      CK(cudaMalloc(&p, n * 2));
      fill<<<512, 256, 0, s>>>(p, n, 17u * i + 1u + 1000u * sh.B);
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
  for (int i = 0; i < 3000; ++i) fill<<<512, 256, 0, s>>>(shapes[0].xs[i % shapes[0].sets], 15 * 163840, i);  // clocks up
  CK(cudaStreamSynchronize(s));

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
  row<0u>("v5b (OPT 0)", shapes, ks, lp, id, lse, flags, s);
  row<k::kV4OptFastLoad>("v5b + fast loads", shapes, ks, lp, id, lse, flags, s);
  row<k::kV4OptDefault>("v6 default", shapes, ks, lp, id, lse, flags, s);
  int hflags = 0;
  CK(cudaMemcpy(&hflags, flags, 4, cudaMemcpyDeviceToHost));
  CK(cudaGetLastError());
  std::printf("flags %d (0 expected)\n", hflags);
  return 0;
}
