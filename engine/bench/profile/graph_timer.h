// Shared pieces of the draft_topk_lse profilers (draft_topk_lse_phases.cu, _stages.cu, _period.cu): a fatal CUDA
// check, two bf16 fills that need no host data (uniform, randn x 4), and the CUDA-graph timer the Python benches
// mirror (median µs per call over 40 replays of one captured graph of `calls` calls).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

// The fills' per-element hash (its low 24 bits are used).
__device__ __forceinline__ uint32_t fill_hash(size_t i, uint32_t seed) {
  uint32_t h = uint32_t(i) * 0x9E3779B9u ^ seed;
  h ^= h >> 15;
  h *= 0x2C1B3C6Du;
  return h ^ (h >> 12);
}

// Hash-based logits in [-12, 12) (roughly the Python bench's randn * 4 range), bf16.
__global__ void fill(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = fill_hash(i, seed);
    x[i] = __float2bfloat16((float(h & 0xFFFFFF) / 16777216.f - 0.5f) * 24.f);
  }
}

// Normal logits x 4 in bf16, as bench_draft_topk_lse.py draws them (torch.randn * 4): the v11 mode's inputs. (The
// uniform fill's top bf16 value holds ~430 logits of a 163,840 row: every bound sits on that tie, which no row bound
// can tighten.) Box-Muller on two 24-bit hashes.
__global__ void fill_normal(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t h = fill_hash(i, seed);
    uint32_t g = h * 0x85EBCA6Bu ^ (seed * 0xC2B2AE35u + 0x27D4EB2Fu);
    g ^= g >> 13;
    g *= 0x2C1B3C6Du;
    g ^= g >> 16;
    const float u1 = (float(h & 0xFFFFFF) + 0.5f) / 16777216.f, u2 = float(g & 0xFFFFFF) / 16777216.f;
    x[i] = __float2bfloat16(4.f * sqrtf(-2.f * logf(u1)) * cospif(2.f * u2));
  }
}

// Median microseconds per call of `body(i)` for i in [0, calls), as replays of one captured graph. `before` (if set)
// queues work ahead of each replay's start event, e.g. a GPU spin that keeps the host's launch latency outside the
// events (topk_abi_timing.cu).
inline float time_graph(cudaStream_t s, int calls, const std::function<void(int)>& body,
                        const std::function<void()>& before = {}) {
  for (int i = 0; i < calls; ++i) body(i);
  CK(cudaStreamSynchronize(s));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < calls; ++i) body(i);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));  // warm-up replay
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int r = 0; r < 40; ++r) {
    if (before) before();
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
