// Is straight-line code fetched cold in every launch? (NOTES, "v7 (session 5)".) One warp per SM runs N
// independent-FFMA instructions of straight-line code (16 bytes each: N / 64 KB), R times in a rolled
// loop; median µs per launch of a CUDA graph of 32 launches. time(N, 2) - time(N, 1) is the warm cost of
// the block; time(N, 1) - that - empty is what the first pass costs on top: the instruction fetch.
// Build: nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a engine/bench/profile/icache_probe.cu -o probe
#include <cuda_runtime.h>

#include <cstdio>

#include "graph_timer.h"

template <int N>
__global__ void straight(float* out, float a, float b, int reps) {
  float x0 = threadIdx.x, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3, x4 = x0 + 4, x5 = x0 + 5, x6 = x0 + 6, x7 = x0 + 7;
#pragma unroll 1
  for (int r = 0; r < reps; ++r) {
#pragma unroll
    for (int i = 0; i < N / 8; ++i) {  // 8 independent chains: issue-bound once fetched
      asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x0) : "f"(a), "f"(b));
      asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x1) : "f"(a), "f"(b));
      asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x2) : "f"(a), "f"(b));
      asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x3) : "f"(a), "f"(b));
      asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x4) : "f"(a), "f"(b));
      asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x5) : "f"(a), "f"(b));
      asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x6) : "f"(a), "f"(b));
      asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x7) : "f"(a), "f"(b));
    }
  }
  const float s = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
  if (s == 1.2345e-30f) out[threadIdx.x] = s;
}

template <int N>
void row(float* out, cudaStream_t s, int warps) {
  float t[3];
  for (int reps = 0; reps <= 2; ++reps)
    t[reps] = time_graph(s, 32, [&](int) { straight<N><<<132, 32 * warps, 0, s>>>(out, 1.0001f, 0.5f, reps); });
  const float warm = t[2] - t[1], cold = t[1] - warm - t[0];
  std::printf("N %5d instr (%5.1f KB) warps/SM %2d: reps0 %6.2f reps1 %6.2f reps2 %6.2f  warm pass %5.2f  first-pass "
              "extra %5.2f us (%.2f us/KB)\n",
              N, N * 16 / 1024.0, warps, t[0], t[1], t[2], warm, cold, cold / (N * 16 / 1024.0));
  std::fflush(stdout);
}

int main() {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  float* out;
  CK(cudaMalloc(&out, 4096));
  for (int i = 0; i < 2000; ++i) straight<64><<<132, 32, 0, s>>>(out, 1.0001f, 0.5f, 100);  // clocks up
  CK(cudaStreamSynchronize(s));
  for (int w : {1, 16}) {
    row<64>(out, s, w);
    row<256>(out, s, w);
    row<1024>(out, s, w);
    row<4096>(out, s, w);
  }
  CK(cudaGetLastError());
  return 0;
}
