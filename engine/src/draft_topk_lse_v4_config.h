// How draft_topk_lse v4's launch is shaped (host only): the device attributes (cluster launch, SM count) and the
// DDTREE_TOPK_V4_CONFIG / _OPT / _CLUSTER choices of CTA size, options and largest cluster. A helper of
// src/draft_topk_lse.cu, not part of the C ABI; separate so that the launcher holds the launches and this the policy.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ddtree/kernels/draft_topk_lse_v4.cuh"

namespace {

namespace k = ddtree::kernels;

// Whether the current device launches thread-block clusters (sm_90+), cached per device (an attribute
// read: no sync, fine during stream capture).
bool cluster_launch() {
  static int cache[64] = {0};  // 0 unknown, 1 no, 2 yes
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  if (cache[dev] == 0) {
    int yes = 0;
    if (cudaDeviceGetAttribute(&yes, cudaDevAttrClusterLaunch, dev) != cudaSuccess) yes = 0;
    cache[dev] = yes ? 2 : 1;
  }
  return cache[dev] == 2;
}

// Multiprocessors of the current device, cached per device (an attribute read: no sync, capturable).
int sm_count() {
  static int cache[64] = {0};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  if (cache[dev] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = -1;
    cache[dev] = n;
  }
  return cache[dev] > 0 ? cache[dev] : 0;
}

// v4's CTA size, largest cluster and exchange. Default (v5, engine/bench/NOTES.md): 512 threads, the
// st.async/mbarrier exchange, and the cluster size from the row count: 8 CTAs per row while the grid
// fits in one wave of 2 CTAs per SM, else 4 (fewer, longer CTAs: NOTES, v4.1 shape sweep); session 13: else 2 where
// that fits in one wave, for bf16 rows (v4_max_cluster).
// DDTREE_TOPK_V4_CONFIG="threads,cluster[,async]" (threads 256, 512 or 1024; cluster 1-8, fixed; async 1 =
// st.async, 0 = the closing cluster barrier, default 1 at 512 threads; read once per process) asks for
// another, for the bench's variant sweep.
struct V4Config {
  int threads, cluster;  // cluster 0: by row count
  bool async;
};
V4Config v4_config() {
  static const V4Config cfg = [] {
    V4Config c{k::kV4Threads, 0, true};
    const char* e = std::getenv("DDTREE_TOPK_V4_CONFIG");
    int t = 0, cl = 0, as = 1;
    const int got = e != nullptr ? std::sscanf(e, "%d,%d,%d", &t, &cl, &as) : 0;
    if (got >= 2 && (t == 256 || t == 512 || t == 1024) && cl >= 0 && cl <= k::kV4MaxCluster)
      c = V4Config{t, cl, as == 1 && t == 512};
    return c;
  }();
  return cfg;
}
// DDTREE_TOPK_V4_OPT (read per call) picks the st.async kernel's options for k > 1, for A/B runs:
// "v7b" session 5's (kV4OptV7b, then for every k), "v8" session 6's (v7b + the lane append), "v9" session 7's
// (v8 + the round append + the all-to-all merge; NOTES "v9 (session 7)"), "v10" v9 with eight lanes per candidate's
// rank and puts (opt-in only: measured slower than v9 on the H200, NOTES "v10"), "v11" v9 with a row bound before the
// candidate pass (session 8, NOTES "v11 (session 8"), "v13" the compact builds (session 9, NOTES "v13 (session 9": the
// same code as session 8's choice, v9 or v11, with one copy of each hot stage and the rare paths called; v8 where that
// runs v8), "v13r" / "v13s" the compact v11 with the rare paths called / inline for every k > 1, "s8" session 8's
// default, "s10" session 10's (v13r also at k <= 16 where the solo launch applies); unset or anything else: the default
// (v9 or v8 by cluster size, run_v4_async). k = 1 runs the kV4OptV7b instantiation in every case (the k > 1 options
// change nothing on its path, and that instantiation measured 0.1 µs faster at 1x15 K = 1).
// Read per call (session 9: one getenv, host side only), so that one process can capture the default and an option
// into separate CUDA graphs and compare them against the same torch peer (bench_topk_v13_ab.py).
enum class V4Opt { kDefault, kV7b, kV8, kV9, kV10, kV11, kV13, kV13r, kV13s, kS8, kS10 };
V4Opt env_v4_opt() {
  const char* e = std::getenv("DDTREE_TOPK_V4_OPT");
  if (e == nullptr) return V4Opt::kDefault;
  if (std::strcmp(e, "v7b") == 0) return V4Opt::kV7b;
  if (std::strcmp(e, "v8") == 0) return V4Opt::kV8;
  if (std::strcmp(e, "v9") == 0) return V4Opt::kV9;
  if (std::strcmp(e, "v10") == 0) return V4Opt::kV10;
  if (std::strcmp(e, "v11") == 0) return V4Opt::kV11;
  if (std::strcmp(e, "v13") == 0) return V4Opt::kV13;
  if (std::strcmp(e, "v13r") == 0) return V4Opt::kV13r;
  if (std::strcmp(e, "v13s") == 0) return V4Opt::kV13s;
  if (std::strcmp(e, "s8") == 0) return V4Opt::kS8;
  if (std::strcmp(e, "s10") == 0) return V4Opt::kS10;
  return V4Opt::kDefault;
}

// DDTREE_TOPK_V4_CLUSTER=1..8 (session 13, s13topk; read per call, unlike DDTREE_TOPK_V4_CONFIG): the largest cluster
// for this call, so that one process can capture each cluster size into its own graph (bench_topk_rows_ab.py); 0 or
// unset: the default below.
int env_v4_cluster() {
  const char* e = std::getenv("DDTREE_TOPK_V4_CLUSTER");
  const int c = e != nullptr ? std::atoi(e) : 0;
  return c >= 1 && c <= k::kV4MaxCluster ? c : 0;
}

// Whether `rows` rows are too many for one wave of 4-CTA clusters at 2 CTAs per SM but fit one of 2-CTA clusters
// (67..132 rows on 132 SMs): where bf16 rows take 2-CTA clusters by default (session 13, v4_max_cluster).
bool v4_rows_pair_wave(int64_t rows) {
  const int64_t slots = 2 * int64_t(sm_count());
  return slots > 0 && rows * (k::kV4MaxCluster / 2) > slots && rows * 2 <= slots;
}

// The largest cluster for `rows` rows (bf16: 2-byte logits). Before session 13: 8 CTAs per row while the grid fits in
// one wave at 2 CTAs per SM, else 4. Session 13 (NOTES "v17 (session 13"): bf16 rows that fit one wave only at 2 CTAs
// per row take 2 (8x15: 240 CTAs in one wave instead of 480 in ~1.8 waves; H200, one process, 8x15 x 163,840 / 151,936
// K = 1 / 16 / 32 / 64: -14 / -19 / -19 / -19% with v9 / v11). fp32 rows keep 4 (2 measured faster at K = 1 only,
// with v8 at k > 1).
int v4_max_cluster(int64_t rows, bool bf16) {
  const int per_call = env_v4_cluster();
  if (per_call > 0) return per_call;
  const int fixed = v4_config().cluster;
  if (fixed > 0) return fixed;
  const int sms = sm_count();
  if (sms > 0 && rows * k::kV4MaxCluster <= 2 * int64_t(sms)) return k::kV4MaxCluster;
  if (sms <= 0) return k::kV4MaxCluster;
  return bf16 && v4_rows_pair_wave(rows) ? 2 : k::kV4MaxCluster / 2;
}

}  // namespace
