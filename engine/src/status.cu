// Last-error storage, status names, build info and the device/arch check of libddtree.
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common.h"
#include "ddtree/status.h"

#ifndef DDTREE_CUDA_ARCHS_STRING
#define DDTREE_CUDA_ARCHS_STRING "unknown"
#endif

namespace {
// Thread-local so that concurrent callers (one per GPU, say) never see each other's messages.
thread_local std::string g_last_error;

// A trivial kernel whose attributes exist only if the library holds code this device can run.
__global__ void probe_kernel(int* out) {
  if (out != nullptr) *out = 1;
}
}  // namespace

namespace ddtree {
namespace detail {

ddtree_status_t fail(ddtree_status_t status, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  g_last_error = buf;
  return status;
}

ddtree_status_t succeed() {
  g_last_error.clear();
  return DDTREE_STATUS_SUCCESS;
}

ddtree_status_t from_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return succeed();
  if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction) {
    return fail(DDTREE_STATUS_NO_KERNEL_IMAGE,
                "%s: %s (libddtree built for sm_%s; rebuild with -DDDTREE_CUDA_ARCHS=<this GPU's arch>)",
                what, cudaGetErrorString(err), DDTREE_CUDA_ARCHS_STRING);
  }
  return fail(DDTREE_STATUS_CUDA_ERROR, "%s: %s (%s)", what, cudaGetErrorName(err), cudaGetErrorString(err));
}

namespace {
// Attribute `a` of the current device, cached per device ordinal in `cache` (0 = not read yet; 64 devices is
// far past any host we run); `fallback` when it cannot be read.
int cached_attr(int (&cache)[64], cudaDeviceAttr a, int fallback) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return fallback;
  if (cache[dev] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, a, dev) != cudaSuccess || n <= 0) n = fallback;
    cache[dev] = n;
  }
  return cache[dev];
}
}  // namespace

int sm_count() {
  static int cache[64] = {0};
  return cached_attr(cache, cudaDevAttrMultiProcessorCount, 132);
}

int l2_cache_bytes() {
  static int cache[64] = {0};
  return cached_attr(cache, cudaDevAttrL2CacheSize, 50 << 20);
}

bool pdl_enabled() {
  static int cache[64] = {0};  // 0 unknown, 1 off, 2 on
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  if (cache[dev] == 0) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    const char* off = std::getenv("DDTREE_DISABLE_PDL");
    cache[dev] = (major >= 9 && !(off != nullptr && off[0] != '\0' && off[0] != '0')) ? 2 : 1;
  }
  return cache[dev] == 2;
}

}  // namespace detail
}  // namespace ddtree

extern "C" {

DDTREE_API const char* ddtree_last_error(void) { return g_last_error.c_str(); }

DDTREE_API const char* ddtree_status_string(ddtree_status_t status) {
  switch (status) {
    case DDTREE_STATUS_SUCCESS: return "DDTREE_STATUS_SUCCESS";
    case DDTREE_STATUS_INVALID_ARGUMENT: return "DDTREE_STATUS_INVALID_ARGUMENT";
    case DDTREE_STATUS_CUDA_ERROR: return "DDTREE_STATUS_CUDA_ERROR";
    case DDTREE_STATUS_NO_KERNEL_IMAGE: return "DDTREE_STATUS_NO_KERNEL_IMAGE";
    case DDTREE_STATUS_WORKSPACE_TOO_SMALL: return "DDTREE_STATUS_WORKSPACE_TOO_SMALL";
    case DDTREE_STATUS_UNSUPPORTED: return "DDTREE_STATUS_UNSUPPORTED";
    case DDTREE_STATUS_INTERNAL: return "DDTREE_STATUS_INTERNAL";
  }
  return "DDTREE_STATUS_UNKNOWN";
}

DDTREE_API const char* ddtree_build_info(void) { return "ddtree 0.1 archs=" DDTREE_CUDA_ARCHS_STRING; }

DDTREE_API ddtree_status_t ddtree_check_device(void) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return ddtree::detail::from_cuda(err, "cudaGetDevice");
  cudaFuncAttributes attr;
  err = cudaFuncGetAttributes(&attr, probe_kernel);
  if (err != cudaSuccess) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    cudaGetLastError();  // clear the sticky-free error so later launches start clean
    return ddtree::detail::fail(
        err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction
            ? DDTREE_STATUS_NO_KERNEL_IMAGE : DDTREE_STATUS_CUDA_ERROR,
        "device %d is sm_%d%d but libddtree holds code for archs %s only (%s); rebuild with "
        "-DDDTREE_CUDA_ARCHS=%d%d",
        dev, major, minor, DDTREE_CUDA_ARCHS_STRING, cudaGetErrorString(err), major, minor);
  }
  return ddtree::detail::succeed();
}

}  // extern "C"
