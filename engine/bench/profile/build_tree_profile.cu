// Phase profile of the build_tree kernel: clock64 at the DDTREE_BUILD_TREE_MARK points of block 0,
// thread 0 (each mark sits after a block barrier, so the deltas are phase wall times in SM cycles),
// plus the %globaltimer span (ns) and event time, cold and after a 100 ms warm-up load.
// Not part of the CMake build (a standalone tool):
//   nvcc -O3 -std=c++17 -arch=sm_90 -Iengine/include engine/bench/profile/build_tree_profile.cu -o bt_profile
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <string>
#include <iterator>
#include <algorithm>
#include <cmath>
#include <cstdint>

__device__ long long g_mark_clk[256];
__device__ int g_mark_tag[256];
__device__ int g_mark_n;
__device__ unsigned long long g_t0, g_t1;

__device__ __forceinline__ unsigned long long globaltimer() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The mark counter lives in shared memory (one per block: a function-scope __shared__), so a mark
// costs a shared-memory increment and two fire-and-forget global stores, not a global round trip
// (v4's first profile paid ~600 cycles per mark that way).
__device__ __forceinline__ int* mark_counter() {
  __shared__ int counter;
  return &counter;
}
#define DDTREE_BUILD_TREE_MARK(tag)                                          \
  do {                                                                       \
    if (blockIdx.x == 0 && threadIdx.x == 0) {                               \
      int* c_ = mark_counter();                                              \
      if ((tag) == 0) *c_ = 0;                                               \
      const int n_ = *c_;                                                    \
      if (n_ < 256) {                                                        \
        g_mark_clk[n_] = clock64();                                          \
        g_mark_tag[n_] = (tag);                                              \
        *c_ = n_ + 1;                                                        \
      }                                                                      \
      if ((tag) == 0) g_t0 = globaltimer();                                  \
      if ((tag) == 99) { g_t1 = globaltimer(); g_mark_n = n_ + 1; }          \
    }                                                                        \
  } while (0)

#include "ddtree/kernels/build_tree.cuh"
#include "ddtree/kernels/build_tree/warp_heap.cuh"

namespace bt = ddtree::build_tree_k;

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::printf("%s: %s\n", #x, cudaGetErrorString(e)); std::exit(1); } } while (0)

__global__ void spin(float* x, int iters) {
  float v = x[threadIdx.x];
  for (int i = 0; i < iters; ++i) v = v * 0.999f + 0.001f;
  x[threadIdx.x] = v;
}

// Calibration 1: what a block barrier costs at this kernel's block size with (almost) no work between
// barriers: every thread stores a word, barrier, loads a neighbour's word, barrier. Cycles per round
// = two barriers plus two shared-memory accesses.
template <int T>
__global__ void barrier_probe(long long* out, int iters) {
  __shared__ int buf[T];
  int acc = threadIdx.x;
  const long long t0 = clock64();
  for (int i = 0; i < iters; ++i) {
    buf[threadIdx.x] = acc;
    __syncthreads();
    acc += buf[(threadIdx.x + 1) % T];
    __syncthreads();
  }
  const long long t1 = clock64();
  if (threadIdx.x == 0) { out[0] = t1 - t0; out[1] = acc; }
}

// Calibration 2: the floor of a launch inside a CUDA graph for a kernel of this block size and
// shared-memory footprint that does nothing (per launch, 20 launches per graph).
__global__ void __launch_bounds__(bt::kThreads, 1) empty_kernel(int* x) {
  extern __shared__ unsigned char sm[];
  if (threadIdx.x == 0 && x[0] == 12345) sm[0] = 1;
}

// The same floor for the warp-heap kernel's launch shape (128 threads, its dynamic shared memory).
__global__ void __launch_bounds__(bt::kWhThreads) empty_small_kernel(int* x) {
  extern __shared__ unsigned char sm[];
  if (threadIdx.x == 0 && x[0] == 12345) sm[0] = 1;
}

// Calibration 3 (one warp, what a warp-heap pop is made of): cycles per step of a dependent chain of
// (0) __reduce_min_sync, (1) __shfl_sync from a lane named by the previous result, (2) a broadcast
// shared load whose address is the previous result, (3) the same load after a 16-byte store of equal
// values by all 32 lanes to one address, (4) the same with lane 0 alone storing, then __syncwarp.
__global__ void warp_probe(long long* out, int iters) {
  __shared__ __align__(16) unsigned buf[256];
  const int lane = threadIdx.x & 31;
  for (int i = lane; i < 256; i += 32) buf[i] = static_cast<unsigned>(i) & 3u;
  __syncwarp();
  unsigned x = 0;
  long long t[6];
  t[0] = clock64();
  for (int i = 0; i < iters; ++i) x = __reduce_min_sync(0xffffffffu, x + static_cast<unsigned>(lane)) & 3u;
  t[1] = clock64();
  for (int i = 0; i < iters; ++i) x = __shfl_sync(0xffffffffu, x + static_cast<unsigned>(lane), static_cast<int>(x)) & 3u;
  t[2] = clock64();
  for (int i = 0; i < iters; ++i) x = buf[x * 4] & 3u;
  t[3] = clock64();
  for (int i = 0; i < iters; ++i) {
    *reinterpret_cast<uint4*>(&buf[64]) = make_uint4(x, x, x, x);
    x = buf[64 + x] & 3u;
  }
  t[4] = clock64();
  for (int i = 0; i < iters; ++i) {
    if (lane == 0) *reinterpret_cast<uint4*>(&buf[128]) = make_uint4(x, x, x, x);
    __syncwarp();
    x = buf[128 + x] & 3u;
  }
  t[5] = clock64();
  if (threadIdx.x == 0) {
    for (int k = 0; k < 5; ++k) out[k] = t[k + 1] - t[k];
    out[5] = x;
  }
}

template <int T>
void run_barrier_probe() {
  long long* d;
  CK(cudaMalloc(&d, 16));
  barrier_probe<T><<<1, T>>>(d, 1000);
  CK(cudaDeviceSynchronize());
  long long h[2];
  CK(cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost));
  std::printf("barrier probe, %d threads: %.1f cycles per round (2 barriers + 2 shared accesses)\n", T, h[0] / 1000.0);
  cudaFree(d);
}

int main(int argc, char** argv) {
  const int L = 15;
  // Argument "small": the M <= 64 rows (auto, v8, v9); "large": v10's rows (M > 64; auto and v10 only).
  // "v11": the bench's M = 64 / 256 / 1024 rows under v8auto (the default there) and v11 (build_tree/v11.cuh,
  // marks 130 rows checked, 131 search done, 132 ranked).
  // "m256": the bench's six M = 256 rows (K = 64 / 1024, sharpness 8 / 4 / 1) under auto (the default's path
  // there) with the tighten and the survivor sorts ("auto/bitonic", marks 60-64), the tighten and the bucketed
  // rank ("auto/rankt", marks 65-67) and the rank alone ("auto": build_tree/rank.cuh, the default since session 13).
  const bool v11 = argc > 1 && std::string(argv[1]) == "v11";
  const bool m256 = argc > 1 && std::string(argv[1]) == "m256";
  const bool large = argc > 1 && (std::string(argv[1]) == "large" || v11 || m256);
  const bool small_rows = argc > 1 && !large;
  std::printf("kThreads = %d, shared memory %zu bytes\n", bt::kThreads, bt::kSmemBytes);
  run_barrier_probe<128>();
  run_barrier_probe<256>();
  run_barrier_probe<512>();
  {
    long long* d;
    CK(cudaMalloc(&d, 64));
    warp_probe<<<1, 32>>>(d, 1000);
    CK(cudaDeviceSynchronize());
    warp_probe<<<1, 32>>>(d, 1000);
    CK(cudaDeviceSynchronize());
    long long h[6];
    CK(cudaMemcpy(h, d, 48, cudaMemcpyDeviceToHost));
    std::printf("warp probe, cycles per dependent step: redux.min %.1f, shfl.idx %.1f, broadcast lds %.1f, "
                "32-lane sts.128 + lds %.1f, lane-0 sts.128 + syncwarp + lds %.1f\n", h[0] / 1000.0, h[1] / 1000.0,
                h[2] / 1000.0, h[3] / 1000.0, h[4] / 1000.0);
    cudaFree(d);
  }
  {
    CK(cudaFuncSetAttribute(reinterpret_cast<const void*>(&empty_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, int(bt::kSmemBytes)));
    int* dx;
    CK(cudaMalloc(&dx, 4));
    CK(cudaMemset(dx, 0, 4));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 20; ++i) {
      if (small_rows) empty_small_kernel<<<1, bt::kWhThreads, sizeof(bt::WhSmem), st>>>(dx);
      else empty_kernel<<<1, bt::kThreads, bt::kSmemBytes, st>>>(dx);
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, st));
    CK(cudaStreamSynchronize(st));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int r = 0; r < 25; ++r) {
      CK(cudaEventRecord(e0, st));
      CK(cudaGraphLaunch(ge, st));
      CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms * 1e3f / 20);
    }
    std::sort(t.begin(), t.end());
    std::printf("empty kernel (%s block size and shared memory) in a 20-launch graph: %.2f us per launch\n",
                small_rows ? "the warp heap's" : "the big kernel's", t[t.size() / 2]);
  }
  struct Cfg { int M, K; float sharp; };
  // v8's shapes (M <= 64: the bench's and the end-to-end decoder's) first, then one M = 256 row.
  const Cfg base_cfgs[] = {{64, 64, 8.f}, {64, 64, 4.f}, {64, 64, 1.f}, {64, 1024, 8.f}, {16, 16, 8.f}, {16, 16, 4.f}, {16, 16, 1.f}, {256, 64, 4.f}};
  const Cfg large_cfgs[] = {{256, 64, 8.f}, {256, 64, 4.f}, {256, 64, 1.f}, {256, 1024, 8.f}, {256, 1024, 1.f},
                            {512, 1024, 4.f}, {1024, 1024, 1.f}, {1024, 64, 4.f}};
  const Cfg v11_cfgs[] = {{64, 64, 8.f}, {64, 64, 4.f}, {64, 64, 1.f}, {256, 64, 8.f}, {256, 64, 4.f}, {256, 64, 1.f},
                          {256, 1024, 8.f}, {256, 1024, 4.f}, {256, 1024, 1.f}, {1024, 64, 4.f}, {1024, 1024, 4.f}};
  const Cfg m256_cfgs[] = {{256, 64, 8.f}, {256, 64, 4.f}, {256, 64, 1.f}, {256, 1024, 8.f}, {256, 1024, 4.f},
                           {256, 1024, 1.f}};
  const std::vector<Cfg> cfgs = m256 ? std::vector<Cfg>(std::begin(m256_cfgs), std::end(m256_cfgs))
                                : v11 ? std::vector<Cfg>(std::begin(v11_cfgs), std::end(v11_cfgs))
                                : large ? std::vector<Cfg>(std::begin(large_cfgs), std::end(large_cfgs))
                                      : std::vector<Cfg>(std::begin(base_cfgs), std::end(base_cfgs));
  constexpr int kAutoBitonic = -1, kAutoRankT = -2;  // m256: auto with p.order = kOrderBitonic / kOrderRankTighten
  const std::vector<int> impls = m256 ? std::vector<int>{kAutoBitonic, kAutoRankT, bt::kImplAuto}
                                 : v11 ? std::vector<int>{bt::kImplV8Auto, bt::kImplV11}
                                 : large ? std::vector<int>{bt::kImplAuto, bt::kImplV10}
                                       : std::vector<int>{bt::kImplAuto, bt::kImplV8, bt::kImplV8P8, bt::kImplV9,
                                                          bt::kImplV9S6};
  CK(cudaFuncSetAttribute(reinterpret_cast<const void*>(&bt::build_tree_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, int(bt::kSmemBytes)));
  CK(cudaFuncSetAttribute(reinterpret_cast<const void*>(&bt::build_tree_v10_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, int(bt::kSmemBytes)));
  CK(cudaFuncSetAttribute(reinterpret_cast<const void*>(&bt::build_tree_v11_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, int(bt::kSmemBytes)));
  float* d_spin;
  CK(cudaMalloc(&d_spin, 1 << 20));
  for (const Cfg& c : cfgs) {
    if (small_rows && c.M > 64) continue;
    std::mt19937 rng(c.M + c.K);
    std::normal_distribution<float> nd(0.f, 1.f);
    const int V = 32000;
    std::vector<float> lp(size_t(L) * c.K);
    std::vector<int> ids(size_t(L) * c.K);
    for (int d = 0; d < L; ++d) {
      std::vector<float> x(V);
      for (auto& v : x) v = nd(rng) * c.sharp;
      float mx = *std::max_element(x.begin(), x.end());
      double s = 0; for (float v : x) s += std::exp(double(v - mx));
      float lse = mx + float(std::log(s));
      std::partial_sort(x.begin(), x.begin() + c.K, x.end(), [](float a, float b) { return a > b; });
      for (int k = 0; k < c.K; ++k) { lp[size_t(d) * c.K + k] = x[k] - lse; ids[size_t(d) * c.K + k] = k; }
    }
    const int n_max = c.M + 1, W = (n_max + 31) / 32;
    float* d_lp; int32_t *d_ids, *d_small, *d_out; uint32_t* d_anc;
    CK(cudaMalloc(&d_lp, lp.size() * 4)); CK(cudaMalloc(&d_ids, ids.size() * 4));
    CK(cudaMemcpy(d_lp, lp.data(), lp.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_ids, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    std::vector<int32_t> small = {7, 100, c.M};
    CK(cudaMalloc(&d_small, 12)); CK(cudaMemcpy(d_small, small.data(), 12, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&d_out, size_t(n_max) * 4 * 8)); CK(cudaMalloc(&d_anc, size_t(n_max) * W * 4));
    bt::Params p{d_lp, d_ids, d_small, d_small + 1, d_small + 2, L, c.K, n_max, W,
                 d_out, d_out + n_max, d_out + 2 * n_max, d_out + 3 * n_max, d_anc, d_out + 4 * n_max,
                 d_out + 5 * n_max, d_out + 6 * n_max};
    // Each selection (auto = the session-4 default, v8: common.cuh; v9: the warp-heap kernel of
    // build_tree/warp_heap.cuh, v9s6 session 6's (warp_heap_s6.cuh), marks 110 rows loaded, 112 fast pass
    // done, 113 exact pass done, 111 heap done; v10: build_tree/v10.cuh, marks 120-126) on the same inputs.
    for (int impl : impls)
    for (int warm = 1; warm < 2; ++warm) {
      p.impl = impl < 0 ? bt::kImplAuto : impl;
      p.order = impl == kAutoBitonic ? bt::kOrderBitonic : impl == kAutoRankT ? bt::kOrderRankTighten : bt::kOrderRank;
      if (warm) { spin<<<132 * 4, 256>>>(d_spin, 2000000); }  // load the GPU so its clocks rise
      const int zero = 0;
      CK(cudaMemcpyToSymbol(g_mark_n, &zero, 4));
      cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
      CK(cudaEventRecord(e0));
      if (impl == bt::kImplV9) {
        if (c.M > bt::kWhMaxM) continue;
        bt::build_tree_warp_heap_kernel<<<1, bt::kWhThreads, sizeof(bt::WhSmem)>>>(p);
      } else if (impl == bt::kImplV9S6) {  // session 6's pop (build_tree/warp_heap_s6.cuh), same marks
        if (c.M > bt::kWhMaxM) continue;
        bt::build_tree_warp_heap_s6_kernel<<<1, bt::kWhThreads, sizeof(bt::WhSmemS6)>>>(p);
      } else {
        if (small_rows && impl == bt::kImplV8P8) continue;
        if (impl == bt::kImplV10) bt::build_tree_v10_kernel<<<1, bt::kThreads, bt::kSmemBytes>>>(p);
        else if (impl == bt::kImplV11) bt::build_tree_v11_kernel<<<1, bt::kThreads, bt::kSmemBytes>>>(p);
        else bt::build_tree_kernel<<<1, bt::kThreads, bt::kSmemBytes>>>(p);
      }
      CK(cudaEventRecord(e1));
      CK(cudaDeviceSynchronize());
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
      int n; long long clk[256]; int tag[256]; unsigned long long t0, t1;
      CK(cudaMemcpyFromSymbol(&n, g_mark_n, 4));
      CK(cudaMemcpyFromSymbol(clk, g_mark_clk, sizeof clk)); CK(cudaMemcpyFromSymbol(tag, g_mark_tag, sizeof tag));
      CK(cudaMemcpyFromSymbol(&t0, g_t0, 8)); CK(cudaMemcpyFromSymbol(&t1, g_t1, 8));
      const long long total = clk[n - 1] - clk[0];
      std::printf("[%s] M=%d K=%d sharp=%.0f %s: event %.2f us, globaltimer %.2f us, %lld cycles (%.0f MHz)\n  ", impl == bt::kImplV8 ? "v8" : impl == bt::kImplV8P8 ? "v8p8" : impl == bt::kImplV9 ? "v9" : impl == bt::kImplV9S6 ? "v9s6" : impl == bt::kImplV10 ? "v10" : impl == bt::kImplV11 ? "v11" : impl == bt::kImplV8Auto ? "v8auto" : impl == bt::kImplV6 ? "v6" : impl == kAutoBitonic ? "auto/bitonic" : impl == kAutoRankT ? "auto/rankt" : "auto", c.M, c.K,
                  c.sharp, warm ? "after warm-up" : "cold", ms * 1e3, (t1 - t0) / 1e3, total, total / ((t1 - t0) / 1e3));
      for (int i = 1; i < n; ++i) std::printf("%d:%lld ", tag[i], clk[i] - clk[i - 1]);
      std::printf("\n");
    }
    cudaFree(d_lp); cudaFree(d_ids); cudaFree(d_small); cudaFree(d_out); cudaFree(d_anc);
  }
  return 0;
}
