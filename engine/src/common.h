// Internal helpers shared by the launchers in src/*.cu (not part of the installed C ABI).
//
// A launcher validates every argument with DDTREE_REQUIRE, launches on the caller's stream and ends
// with `return ddtree::detail::check_launch("kernel name");`. Nothing here synchronizes.
#pragma once

#include <cuda_runtime.h>

#include "ddtree/status.h"

namespace ddtree {
namespace detail {

// Records `fmt` as this thread's last error and returns `status`.
ddtree_status_t fail(ddtree_status_t status, const char* fmt, ...)
    __attribute__((format(printf, 2, 3)));

// Clears the last error and returns DDTREE_STATUS_SUCCESS.
ddtree_status_t succeed();

// Maps a CUDA error to a status with a message naming `what`.
ddtree_status_t from_cuda(cudaError_t err, const char* what);

// cudaGetLastError after a launch (catches bad configurations without waiting for the kernel).
inline ddtree_status_t check_launch(const char* what) { return from_cuda(cudaGetLastError(), what); }

// Multiprocessor count of the current device, cached per device (reading attributes never syncs).
int sm_count();
// L2 size in bytes of the current device, cached the same way.
int l2_cache_bytes();

// Whether launches may use programmatic dependent launch (sm_90+; DDTREE_DISABLE_PDL=1 turns it off).
bool pdl_enabled();

// Launches `kernel` on `stream`; with `pdl`, the kernel may start while the previous kernel in the
// stream finishes and must call pdl_wait() before reading that kernel's outputs. Checks the launch.
template <typename... Params, typename... Args>
ddtree_status_t launch(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                       bool pdl, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  const bool use_pdl = pdl && pdl_enabled();
  cfg.attrs = use_pdl ? attr : nullptr;
  cfg.numAttrs = use_pdl ? 1 : 0;
  cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
  if (err != cudaSuccess) return from_cuda(err, what);
  return check_launch(what);
}

// Rounds `bytes` up so that workspace sub-buffers stay 256-byte aligned.
constexpr size_t align_up(size_t bytes, size_t to = 256) { return (bytes + to - 1) / to * to; }

}  // namespace detail
}  // namespace ddtree

#define DDTREE_REQUIRE(cond, ...)                                                         \
  do {                                                                                    \
    if (!(cond)) return ::ddtree::detail::fail(DDTREE_STATUS_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

#define DDTREE_CUDA_TRY(call)                                                         \
  do {                                                                                \
    cudaError_t ddtree_err_ = (call);                                                 \
    if (ddtree_err_ != cudaSuccess) return ::ddtree::detail::from_cuda(ddtree_err_, #call); \
  } while (0)
