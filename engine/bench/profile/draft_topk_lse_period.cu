// What sets draft_topk_lse's call period in a CUDA graph of identical calls (session 10, NOTES "v14 (session 10").
// Session 9 saw the graph median at 1x15 K = 16 stay put while the kernel's traced span shrank; those traces were
// of one call after other kernels (cold instruction caches). This traces EVERY call of a graph of 32 identical PDL
// calls, as the benches time them: each call passes its own `flags` pointer (an array of 32 flags), so the trace
// macro finds its call index from the pointer and writes its own rows. Per CTA and call: %globaltimer and clock64
// at entry (thread 0), at the PDL release (thread 0) and at every later stage mark (latest warp), and the SM id.
// Per call n: release = the earliest CTA's PDL release, end = the latest mark of any CTA; period = release(n+1) -
// release(n) = span (end - release) + gap (release(n+1) - end(n)). Also: the untraced graph period at 16 / 32 / 64
// calls per graph (a fixed cost per graph shows as a period that falls with the graph's length), and without PDL.
// Build (repo root, after the library in engine/build-topk):
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a -Iengine/include \
//     engine/bench/profile/draft_topk_lse_period.cu -Lengine/build-topk -lddtree \
//     -Xlinker -rpath='$ORIGIN' -o engine/build-topk/topk_period
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ddtree/draft_topk_lse.h"

constexpr int kCalls = 32;  // calls per traced graph
constexpr int kSlots = 32;  // per (call, CTA): [0, 16) %globaltimer, [16, 32) clock64; slot 31 the SM id
__device__ unsigned long long* g_ptrace;
__device__ const int32_t* g_pflags;
__device__ __forceinline__ void period_mark(int i, const int32_t* fl) {
  if ((threadIdx.x & 31) != 0) return;
  const int call = int(fl - g_pflags);
  if (call < 0 || call >= kCalls) return;
  unsigned long long* t =
      g_ptrace + (size_t(call) * gridDim.x * gridDim.y + size_t(blockIdx.y) * gridDim.x + blockIdx.x) * kSlots;
  const unsigned long long c = clock64();
  unsigned long long g;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
  if (i <= 1) {  // entry and PDL release: thread 0's
    if (threadIdx.x == 0) {
      t[i] = g;
      t[16 + i] = c;
      if (i == 0) {
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        t[31] = sm;
      }
    }
    return;
  }
  atomicMax(t + i, g);
  atomicMax(t + 16 + i, c);
}
// STOP = 12: only the SM id at entry (thread 0, one store): where each call's CTAs land, barely perturbed.
__device__ __forceinline__ void place_mark(const int32_t* fl) {
  const int call = int(fl - g_pflags);
  if (threadIdx.x != 0 || call < 0 || call >= kCalls) return;
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  g_ptrace[(size_t(call) * gridDim.x * gridDim.y + size_t(blockIdx.y) * gridDim.x + blockIdx.x) * kSlots + 31] = sm;
}
#define DDTREE_V4_MARK(i)                          \
  do {                                             \
    if (STOP == 11) period_mark((i), flags);       \
    if (STOP == 12 && (i) == 0) place_mark(flags); \
  } while (0)
#include "graph_timer.h"
#include "ddtree/kernels/draft_topk_lse_v4.cuh"

namespace k = ddtree::kernels;
using bf16 = __nv_bfloat16;

// The launch floor (clusters + PDL), traced like the kernel: entry, release, end.
template <int STOP>
__global__ void __launch_bounds__(512, 2) empty_kernel(const bf16*, int, int, int64_t, int64_t, int, int, int, float*,
                                                       int32_t*, float*, int32_t* flags) {
  DDTREE_V4_MARK(0);
  k::pdl_launch_dependents();
  k::pdl_wait();
  DDTREE_V4_MARK(1);
  DDTREE_V4_MARK(9);
}

// %globaltimer's tick: the smallest nonzero step one thread sees in 20,000 reads.
__global__ void gt_tick(unsigned long long* out) {
  unsigned long long prev, g, best = ~0ull;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(prev));
  const unsigned long long first = prev;
  for (int i = 0; i < 20000; ++i) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
    if (g != prev) {
      best = g - prev < best ? g - prev : best;
      prev = g;
    }
  }
  out[0] = best;
  out[1] = g - first;
}


constexpr int kL = 15, kV = 163840, kSets = 16;  // 1x15 x 163,840: 16 sets of 4.9 MB (> L2)

template <typename Kernel>
void launch(Kernel kern, const bf16* x, int topk, float* lp, int32_t* id, float* lse, int32_t* flags, cudaStream_t s,
            bool pdl = true, int pad = 0) {
  const auto split = k::v4_split<bf16, 512>(kV, k::kV4MaxCluster);
  cudaLaunchAttribute attr[2] = {};
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim = {unsigned(split.cluster), 1u, 1u};
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {dim3(unsigned(split.cluster), unsigned(kL), 1u), dim3(512), size_t(pad), s, attr,
                            pdl ? 2u : 1u};
  CK(cudaLaunchKernelEx(&cfg, kern, x, kL, kV, int64_t(kL) * kV, int64_t(kV), topk, split.cluster, split.pv, lp, id,
                        lse, flags));
}

struct Bufs {
  std::vector<bf16*> xs;
  float *lp, *lse;
  int32_t *id, *flags;  // flags: kCalls of them (call i passes flags + i)
  unsigned long long* trace;
  size_t trace_n;
  void* ws;
  size_t ws_bytes;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Untraced period (graph of `calls` calls, median of replays) at 16 / 32 / 64 calls, with and without PDL; then the
// traced graph of 32: its period, and per call the release / span / gap decomposition and each stage's time after
// the call's earliest release (mean over CTAs; medians over calls 1..30 of 5 replays).
// pad > 0 (session 10's second call): the traced graph with one CTA per SM (solo_pad of the traced instantiation).
template <typename KU, typename KT>
void study(const char* name, KU untraced, KT traced, int topk, Bufs& b, cudaStream_t s, int pad = 0, int tpad = 0) {
  auto body = [&](auto kern, bool pdl) {
    const int p = reinterpret_cast<const void*>(kern) == reinterpret_cast<const void*>(traced) && tpad > 0 ? tpad : pad;
    return [&, kern, pdl, p](int i) {
      launch(kern, b.xs[i % kSets], topk, b.lp, b.id, b.lse, b.flags + (i % kCalls), s, pdl, p);
    };
  };
  const float p16 = time_graph(s, 16, body(untraced, true)), p32 = time_graph(s, 32, body(untraced, true)),
              p64 = time_graph(s, 64, body(untraced, true));
  const float np32 = time_graph(s, 32, body(untraced, false));
  const float tr32 = time_graph(s, kCalls, body(traced, true));
  // Traced replays.
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < kCalls; ++i) body(traced, true)(i);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, s));
  const int ctas = k::v4_split<bf16, 512>(kV, k::kV4MaxCluster).cluster * kL;
  std::vector<unsigned long long> h(b.trace_n);
  std::vector<double> period, span, gap, rel_spread, lead, same_sm, ghz;
  std::vector<std::vector<double>> stage_mean(16), stage_max(16), stage_clk(16);
  for (int rep = 0; rep < 5; ++rep) {
    CK(cudaMemsetAsync(b.trace, 0, b.trace_n * 8, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(h.data(), b.trace, b.trace_n * 8, cudaMemcpyDeviceToHost));
    auto T = [&](int n, int cta) { return &h[(size_t(n) * ctas + cta) * kSlots]; };
    std::vector<double> rel(kCalls, 1e300), end(kCalls, 0), entry(kCalls, 1e300);
    for (int n = 0; n < kCalls; ++n)
      for (int c = 0; c < ctas; ++c) {
        const unsigned long long* t = T(n, c);
        if (t[1] == 0) continue;
        rel[n] = std::min(rel[n], double(t[1]));
        entry[n] = std::min(entry[n], double(t[0]));
        for (int i = 1; i < 16; ++i)
          if (t[i] != 0) end[n] = std::max(end[n], double(t[i]));
      }
    for (int n = 1; n + 1 < kCalls; ++n) {
      period.push_back((rel[n + 1] - rel[n]) / 1e3);
      span.push_back((end[n] - rel[n]) / 1e3);
      gap.push_back((rel[n + 1] - end[n]) / 1e3);
      lead.push_back((rel[n + 1] - entry[n + 1]) / 1e3);  // how long call n+1's first CTA waited for its release
      double rmax = 0;
      int same = 0, cnt = 0;
      std::vector<char> used(1024, 0);
      for (int c = 0; c < ctas; ++c) used[T(n, c)[31] & 1023] = 1;
      for (int c = 0; c < ctas; ++c) {
        const unsigned long long* t = T(n, c);
        rmax = std::max(rmax, double(t[1]));
        same += used[T(n + 1, c)[31] & 1023];
        ++cnt;
        unsigned long long glast = 0, clast = 0;
        for (int i = 2; i < 16; ++i)
          if (t[i] > glast) glast = t[i], clast = t[16 + i];
        if (glast > t[0] && clast > t[16]) ghz.push_back(double(clast - t[16]) / double(glast - t[0]));
      }
      rel_spread.push_back((rmax - rel[n]) / 1e3);
      same_sm.push_back(double(same) / cnt);
      for (int i = 0; i < 16; ++i) {
        double sum = 0, mx = 0, csum = 0;
        int m = 0;
        for (int c = 0; c < ctas; ++c) {
          const unsigned long long* t = T(n, c);
          if (t[i] == 0 || t[1] == 0) continue;
          const double d = (double(t[i]) - rel[n]) / 1e3;
          sum += d;
          mx = std::max(mx, d);
          csum += (double(t[16 + i]) - double(t[17])) / 1.98e3;  // this CTA's clocks after its own release
          ++m;
        }
        if (m) {
          stage_mean[i].push_back(sum / m);
          stage_max[i].push_back(mx);
          stage_clk[i].push_back(csum / m);
        }
      }
    }
  }
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  std::printf("%-16s K%-2d untraced period 16/32/64 calls %.2f / %.2f / %.2f, no PDL (32) %.2f | traced (32) %.2f: "
              "period %.2f = span %.2f + gap %.2f; release spread %.2f, next call's first entry %.2f before its release, "
              "next call on the same SMs %.0f%%, SM clock %.2f GHz\n",
              name, topk, p16, p32, p64, np32, tr32, median(period), median(span), median(gap), median(rel_spread),
              median(lead), 100 * median(same_sm), median(ghz));
  const char* names[16] = {"entry", "pdl_wait", "sums", "barrier1", "bound/k1:partial", "cands/k1:cwait", "ranks,put",
                           "cta bar", "mbar", "end", "v11 row bound", "", "", "", "", ""};
  std::printf("  stage (us after the call's earliest release; mean over CTAs / max; clock-based mean after each CTA's own "
              "release at 1.98 GHz):");
  for (int i = 0; i < 11; ++i)
    if (!stage_mean[i].empty())
      std::printf(" %s %.2f/%.2f/%.2f;", names[i], median(stage_mean[i]), median(stage_max[i]), median(stage_clk[i]));
  std::printf("\n");
  std::fflush(stdout);
}

// Session 10, second call: the launch modes of draft_topk_lse_v4_launch.h on one kernel instantiation. The pad that
// leaves one CTA per SM (the library's computation), with the kernel's dynamic limit raised to it.
template <typename Kernel>
int solo_pad(Kernel kern) {
  int per_sm = 0, per_block = 0, reserved = 0;
  cudaFuncAttributes fa = {};
  CK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
  CK(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  CK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, 0));
  CK(cudaFuncGetAttributes(&fa, kern));
  const int pad = per_sm / 2 - int(fa.sharedSizeBytes) - reserved + 1024;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, pad));
  return pad;
}

template <typename Kernel>
int max_clusters(Kernel kern, int pad) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(8u, unsigned(kL), 1u);
  cfg.blockDim = dim3(512);
  cfg.dynamicSmemBytes = size_t(pad);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 8;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int n = 0;
  CK(cudaOccupancyMaxActiveClusters(&n, kern, &cfg));
  return n;
}

// Untraced period (graph of 32) of one instantiation in the four modes: pair (PDL, two CTAs per SM allowed: the
// launch before session 10), solo (PDL, one per SM), nopdl, solo_nopdl.
template <typename Kernel>
void modes(const char* name, Kernel kern, int topk, Bufs& b, cudaStream_t s, std::vector<std::vector<float>>& acc) {
  const int pad = solo_pad(kern);
  const bool pdl[4] = {true, true, false, false};
  const int pads[4] = {0, pad, 0, pad};
  std::printf("%-16s K%-2d", name, topk);
  acc.resize(4);
  for (int m = 0; m < 4; ++m) {
    const float t = time_graph(s, 32, [&](int i) {
      launch(kern, b.xs[i % kSets], topk, b.lp, b.id, b.lse, b.flags + (i % kCalls), s, pdl[m], pads[m]);
    });
    acc[m].push_back(t);
    std::printf(" %8.2f", t);
  }
  std::printf("\n");
  std::fflush(stdout);
}

// Where each call's CTAs land (STOP = 12 instantiation), pair vs solo: per call the SMs holding two or more of its
// CTAs, medians over calls 1..30 of 5 replays of a graph of 32.
template <typename Kernel>
void placement(const char* name, Kernel kern, int topk, Bufs& b, cudaStream_t s) {
  const int pad = solo_pad(kern);
  const int ctas = 8 * kL;
  for (int solo = 0; solo < 2; ++solo) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < kCalls; ++i)
      launch(kern, b.xs[i % kSets], topk, b.lp, b.id, b.lse, b.flags + i, s, true, solo ? pad : 0);
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, s));
    std::vector<unsigned long long> h(b.trace_n);
    std::vector<double> doubled, distinct;
    for (int rep = 0; rep < 5; ++rep) {
      CK(cudaMemsetAsync(b.trace, 0xff, b.trace_n * 8, s));
      CK(cudaGraphLaunch(ge, s));
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(h.data(), b.trace, b.trace_n * 8, cudaMemcpyDeviceToHost));
      for (int n = 1; n + 1 < kCalls; ++n) {
        std::vector<int> per(1024, 0);
        int dbl = 0, dst = 0;
        for (int c = 0; c < ctas; ++c) {
          const unsigned long long sm = h[(size_t(n) * ctas + c) * kSlots + 31];
          if (sm < 1024 && per[sm]++ == 1) ++dbl;
          if (sm < 1024 && per[sm] == 1) ++dst;
        }
        doubled.push_back(dbl);
        distinct.push_back(dst);
      }
    }
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    std::printf("placement %-14s K%-2d %s: SMs with 2+ CTAs of one call median %.0f (max %.0f), distinct SMs %.0f of %d CTAs\n",
                name, topk, solo ? "solo" : "pair", median(doubled), *std::max_element(doubled.begin(), doubled.end()),
                median(distinct), ctas);
  }
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  Bufs b;
  const size_t n = size_t(kL) * kV;
  for (int i = 0; i < kSets; ++i) {
    bf16* p;
    CK(cudaMalloc(&p, n * 2));
    fill_normal<<<512, 256, 0, s>>>(p, n, 17u * i + 1u);
    b.xs.push_back(p);
  }
  CK(cudaMalloc(&b.lp, kL * 64 * 4));
  CK(cudaMalloc(&b.id, kL * 64 * 4));
  CK(cudaMalloc(&b.lse, kL * 4));
  CK(cudaMalloc(&b.flags, kCalls * 4));
  CK(cudaMemset(b.flags, 0, kCalls * 4));
  b.trace_n = size_t(kCalls) * 8 * kL * kSlots;
  CK(cudaMalloc(&b.trace, b.trace_n * 8));
  CK(cudaMemcpyToSymbol(g_ptrace, &b.trace, sizeof(b.trace)));
  const int32_t* fbase = b.flags;
  CK(cudaMemcpyToSymbol(g_pflags, &fbase, sizeof(fbase)));
  b.ws_bytes = ddtree_draft_topk_lse_workspace_size(1, kL, kV, 64);
  CK(cudaMalloc(&b.ws, b.ws_bytes));
  unsigned long long* d_tick;
  CK(cudaMalloc(&d_tick, 16));
  gt_tick<<<1, 1, 0, s>>>(d_tick);
  unsigned long long tick[2];
  CK(cudaMemcpy(tick, d_tick, 16, cudaMemcpyDeviceToHost));
  std::printf("globaltimer: smallest step %llu ns (20,000 reads over %llu ns)\n", tick[0], tick[1]);
  for (int i = 0; i < 3000; ++i) fill_normal<<<512, 256, 0, s>>>(b.xs[i % kSets], n, 1000u + i);  // clocks up
  CK(cudaStreamSynchronize(s));

  // The library's C ABI (the default's dispatch), untraced, at 16 / 32 / 64 calls per graph.
  for (int kk : {1, 16, 32, 64}) {
    float t[3];
    int j = 0;
    for (int calls : {16, 32, 64})
      t[j++] = time_graph(s, calls, [&](int i) {
        ddtree_draft_topk_lse(b.xs[i % kSets], DDTREE_DTYPE_BFLOAT16, 1, kL, kV, int64_t(kL) * kV, kV, kk, b.lp, b.id,
                              b.lse, b.ws, b.ws_bytes, b.flags, s);
      });
    std::printf("library C ABI     K%-2d period at 16 / 32 / 64 calls per graph: %.2f / %.2f / %.2f us\n", kk, t[0], t[1],
                t[2]);
  }
  constexpr unsigned V7b = k::kV4OptV7b, V9 = k::kV4OptV9, V13r = k::kV4OptV13r;
  if (argc > 1 && std::string(argv[1]) == "launch") {
    std::printf("max active 8-CTA clusters (v13r): pair %d, solo %d (pad %d bytes); 15 needed\n",
                max_clusters(k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 0>, 0),
                max_clusters(k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 0>,
                             solo_pad(k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 0>)),
                solo_pad(k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 0>));
    std::printf("%-20s     pair     solo    nopdl solo_nopdl (us per call, graph of 32)\n", "kernel");
    std::vector<std::vector<float>> a[7];
    for (int rep = 0; rep < 3; ++rep) {
      modes("empty", empty_kernel<0>, 16, b, s, a[0]);
      modes("v7b (K=1 lib)", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V7b, 0>, 1, b, s, a[1]);
      modes("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 0>, 16, b, s, a[2]);
      modes("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 0>, 32, b, s, a[3]);
      modes("v13r (K>1 lib)", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 0>, 16, b, s, a[4]);
      modes("v13r (K>1 lib)", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 0>, 32, b, s, a[5]);
      modes("v13r (K>1 lib)", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 0>, 64, b, s, a[6]);
    }
    const char* rn[7] = {"empty", "v7b K1", "v9 K16", "v9 K32", "v13r K16", "v13r K32", "v13r K64"};
    std::printf("medians of 3 passes      pair     solo    nopdl solo_nopdl\n");
    for (int r = 0; r < 7; ++r) {
      std::printf("%-20s", rn[r]);
      for (int m = 0; m < 4; ++m) {
        std::vector<double> v(a[r][m].begin(), a[r][m].end());
        std::printf(" %8.2f", median(v));
      }
      std::printf("\n");
    }
    // Traced (every call, as the first call's study) with one CTA per SM, against pair in the same process.
    for (int kk : {1, 16}) {
      auto ku = kk == 1 ? k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V7b, 0>
                        : k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 0>;
      auto kt = kk == 1 ? k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V7b, 11>
                        : k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 11>;
      study(kk == 1 ? "pair v7b" : "pair v13r", ku, kt, kk, b, s);
      study(kk == 1 ? "solo v7b" : "solo v13r", ku, kt, kk, b, s, solo_pad(ku), solo_pad(kt));
    }
    placement("v7b (K=1 lib)", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V7b, 12>, 1, b, s);
    placement("v13r (K>1 lib)", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 12>, 16, b, s);
    CK(cudaGetLastError());
    return 0;
  }
  study("empty", empty_kernel<0>, empty_kernel<11>, 16, b, s);
  study("v7b (K=1 lib)", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V7b, 0>,
        k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V7b, 11>, 1, b, s);
  for (int kk : {16, 32, 64})
    study("v13r (K>1 lib)", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 0>,
          k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 11>, kk, b, s);
  study("v9", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 0>,
        k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V9, 11>, 16, b, s);
  study("v7b (K=1 lib)", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V7b, 0>,
        k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V7b, 11>, 1, b, s);
  study("v13r (K>1 lib)", k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 0>,
        k::draft_topk_lse_v4_kernel<bf16, true, 512, true, V13r, 11>, 16, b, s);
  int hflags[kCalls];
  CK(cudaMemcpy(hflags, b.flags, sizeof(hflags), cudaMemcpyDeviceToHost));
  CK(cudaGetLastError());
  int any = 0;
  for (int f : hflags) any |= f;
  std::printf("flags %d (0 expected)\n", any);
  return 0;
}
