// Where draft_topk_lse's time goes: the whole op (C ABI, two launches with PDL) vs each phase launched
// alone, and an empty kernel for the launch floor, all as CUDA-graph replays of 32 back-to-back calls
// over 16 rotating inputs (15 x 163,840 bf16, 78 MB > L2). Build (from the repo root, after libddtree):
//   nvcc -O3 -std=c++17 -arch=sm_90 -Iengine/include engine/bench/profile/draft_topk_lse_phases.cu \
//        -Lengine/build-e1 -lddtree -Xlinker -rpath=$PWD/engine/build-e1 -o /tmp/topk_phases
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <vector>

#include "ddtree/draft_topk_lse.h"
#include "graph_timer.h"
#include "ddtree/kernels/draft_topk_lse.cuh"

namespace k = ddtree::kernels;

__global__ void empty_kernel() {}

// Phase 1's loads, max and sum-exp only (no selection): the memory part of phase 1.
__global__ void __launch_bounds__(256, 2) loads_only(const __nv_bfloat16* __restrict__ logits, int V, float2* out) {
  __shared__ float red[8];
  const int row = blockIdx.y, start = blockIdx.x * k::kTopkChunk;
  const __nv_bfloat16* x = logits + size_t(row) * V;
  uint4 raw[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int base = start + (j * 256 + int(threadIdx.x)) * 8;
    raw[j] = base + 8 <= V ? __ldg(reinterpret_cast<const uint4*>(x + base)) : make_uint4(0, 0, 0, 0);
  }
  float m = -INFINITY, sum = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&raw[j]);
#pragma unroll
    for (int q = 0; q < 8; ++q) m = fmaxf(m, __bfloat162float(e[q]));
  }
  m = k::warp_max(m);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
  __syncthreads();
  float cm = red[0];
  for (int w = 1; w < 8; ++w) cm = fmaxf(cm, red[w]);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&raw[j]);
#pragma unroll
    for (int q = 0; q < 8; ++q) sum += __expf(__bfloat162float(e[q]) - cm);
  }
  sum = k::warp_sum(sum);
  if (threadIdx.x == 0) out[row * gridDim.x + blockIdx.x] = make_float2(cm, sum);
}

int main() {
  const int B = 1, L = 15, V = 163840, SETS = 16, CALLS = 32;
  const size_t n = size_t(B) * L * V;
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  std::vector<__nv_bfloat16*> xs(SETS);
  for (int i = 0; i < SETS; ++i) {
    CK(cudaMalloc(&xs[i], n * 2));
    fill<<<512, 256, 0, s>>>(xs[i], n, 17u * i + 1);
  }
  float *lp, *lse;
  int32_t* id;
  CK(cudaMalloc(&lp, size_t(B) * L * 1024 * 4));
  CK(cudaMalloc(&id, size_t(B) * L * 1024 * 4));
  CK(cudaMalloc(&lse, size_t(B) * L * 4));
  // Warm the clocks.
  for (int i = 0; i < 2000; ++i) fill<<<512, 256, 0, s>>>(xs[i % SETS], n, i);
  CK(cudaStreamSynchronize(s));
  std::printf("empty kernel: %.2f us/launch\n", time_graph(s, CALLS, [&](int) { empty_kernel<<<1, 32, 0, s>>>(); }));
  const int chunks = (V + k::kTopkChunk - 1) / k::kTopkChunk;
  for (int topk : {1, 16, 1024}) {
    const size_t ws_bytes = ddtree_draft_topk_lse_workspace_size(B, L, V, topk);
    void* ws;
    CK(cudaMalloc(&ws, ws_bytes));
    auto* cand = static_cast<uint64_t*>(ws);
    auto* partial = reinterpret_cast<float2*>(static_cast<char*>(ws) +
                                              ((size_t(L) * chunks * topk * 8 + 255) / 256) * 256);
    const float full = time_graph(s, CALLS, [&](int i) {
      ddtree_draft_topk_lse(xs[i % SETS], DDTREE_DTYPE_BFLOAT16, B, L, V, int64_t(L) * V, V, topk, lp, id, lse, ws,
                            ws_bytes, nullptr, s);
    });
    const float p1 = time_graph(s, CALLS, [&](int i) {
      k::draft_topk_partial_kernel<__nv_bfloat16, true><<<dim3(chunks, L), k::kTopkThreads, 0, s>>>(
          xs[i % SETS], L, V, int64_t(L) * V, V, topk, chunks, cand, partial, nullptr);
    });
    const float p2 = time_graph(s, CALLS, [&](int) {
      k::draft_topk_merge_kernel<<<L, k::kTopkMergeThreads, 0, s>>>(cand, partial, chunks, topk, V, lp, id, lse);
    });
    const float lo = time_graph(s, CALLS, [&](int i) {
      loads_only<<<dim3(chunks, L), 256, 0, s>>>(xs[i % SETS], V, partial);
    });
    std::printf("k=%4d  loads-only %.2f us  ", topk, lo);
    std::printf("k=%4d  full op %.2f us   phase1 alone %.2f us   phase2 alone %.2f us\n", topk, full, p1, p2);
    CK(cudaFree(ws));
  }
  CK(cudaGetLastError());
  return 0;
}
