// How draft_topk_lse v4 is launched beside the calls before and after it (session 10, engine/bench/NOTES.md "v14
// (session 10"): a helper of src/draft_topk_lse.cu, not part of the C ABI.
//
// A one-wave grid at one CTA per SM (1x15 x 163,840: 15 rows x 8-CTA clusters = 120 CTAs on 132 SMs) fits two CTAs
// per SM by registers (64 x 512) and shared memory (~26 KB), so with PDL (griddepcontrol.launch_dependents at entry)
// the NEXT call's CTAs are placed while this call runs, into whatever slots are free then: the second slot of busy
// SMs and both slots of the idle ones, so some SMs can get two CTAs of the same call, which then share the SM's
// issue, MUFU and load bandwidth, and the cluster waits for its slowest CTA. "Solo" reserves enough dynamic shared
// memory (unused by the kernel) that only one CTA of ANY call fits on an SM: each call's CTAs land one per SM, and
// the next call's CTA takes an SM only as this call's CTA leaves it (PDL still hides that launch).
// DDTREE_TOPK_V4_LAUNCH (read per call, for same-process A/B): "pair" the launch before session 10 (two CTAs per SM
// allowed, PDL), "solo" (one per SM, PDL), "nopdl" (pair without PDL), "solo_nopdl"; unset: the default (solo where
// it applies: solo_applies).
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

namespace ddtree {
namespace detail {

enum class V4Launch { kDefault, kPair, kSolo, kNoPdl, kSoloNoPdl };

inline V4Launch env_v4_launch() {
  const char* e = std::getenv("DDTREE_TOPK_V4_LAUNCH");
  if (e == nullptr) return V4Launch::kDefault;
  if (std::strcmp(e, "pair") == 0) return V4Launch::kPair;
  if (std::strcmp(e, "solo") == 0) return V4Launch::kSolo;
  if (std::strcmp(e, "nopdl") == 0) return V4Launch::kNoPdl;
  if (std::strcmp(e, "solo_nopdl") == 0) return V4Launch::kSoloNoPdl;
  return V4Launch::kDefault;
}

// The dynamic shared memory that leaves room for one CTA of KERNEL per SM on the current device (0: none can do
// it, e.g. the opt-in per-block limit is too small), with the kernel's limit raised to it; cached per kernel and
// device. Host-side attribute reads and one cudaFuncSetAttribute (not stream work: fine during capture).
template <auto KERNEL>
int v4_solo_pad() {
  static int cache[64] = {0};  // 0 unknown, -1 none, else the pad in bytes
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  if (cache[dev] == 0) {
    int per_sm = 0, per_block = 0, reserved = 0;
    cudaFuncAttributes fa = {};
    int pad = -1;
    if (cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev) == cudaSuccess &&
        cudaFuncGetAttributes(&fa, KERNEL) == cudaSuccess) {
      // Two CTAs need 2 * (static + pad + reserved) > per_sm; 1 KB above the edge.
      const int need = per_sm / 2 - int(fa.sharedSizeBytes) - reserved + 1024;
      if (need > 0 && int(fa.sharedSizeBytes) + need <= per_block &&
          cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, need) == cudaSuccess)
        pad = need;
    }
    (void)cudaGetLastError();
    cache[dev] = pad;
  }
  return cache[dev] > 0 ? cache[dev] : 0;
}

// Whether all `clusters` clusters of `cfg` (its cluster dims and dynamic shared memory set) can be resident at once
// (cudaOccupancyMaxActiveClusters; cached per kernel, device and cluster size: the pad is fixed per kernel and device).
template <auto KERNEL>
bool v4_clusters_fit(const cudaLaunchConfig_t& cfg, int clusters) {
  static int cache[64][9] = {};  // per device and cluster size: 0 unknown, else max active clusters + 1
  int dev = 0, size = 0;
  for (unsigned i = 0; i < cfg.numAttrs; ++i)
    if (cfg.attrs[i].id == cudaLaunchAttributeClusterDimension) size = int(cfg.attrs[i].val.clusterDim.x);
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64 || size < 1 || size > 8) return false;
  if (cache[dev][size] == 0) {
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, KERNEL, &cfg) != cudaSuccess) n = 0;
    (void)cudaGetLastError();
    cache[dev][size] = n + 1;
  }
  return cache[dev][size] - 1 >= clusters;
}

}  // namespace detail
}  // namespace ddtree
