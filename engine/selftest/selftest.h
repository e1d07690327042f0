// Tiny self-test registry for ddtree-selftest (no dependencies beyond the CUDA runtime).
//
//   #include "selftest.h"
//   DDTREE_SELFTEST(draft_topk_lse_golden) {
//     st::DeviceBuffer<float> x(st::upload(host_vector));
//     ST_CHECK_STATUS(ddtree_draft_topk_lse(...));       // aborts this test on a non-success status
//     ST_CUDA(cudaDeviceSynchronize());                  // aborts this test on a CUDA error
//     ST_EXPECT(got == want, "row %d: got %d want %d", r, got, want);  // records, keeps going
//   }
//
// ddtree-selftest runs every registered test (or those whose name contains argv[1]), prints one line
// per test: "PASS name (n checks)" or "FAIL name: first failures...", and exits 1 if any failed,
// 2 if no CUDA device is usable.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "ddtree/status.h"

namespace st {

using TestFn = void (*)();

// Registers a test; used by DDTREE_SELFTEST at static-initialization time.
bool register_test(const char* name, TestFn fn);

// Records one check of the running test; a failed one keeps `message` (first few are printed).
void record(bool ok, const std::string& message);

// Thrown by ST_REQUIRE-style macros to abort the running test (the runner catches it).
struct Abort : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// splitmix64: a deterministic, seedable generator so failures reproduce.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
  float normal() {  // Irwin-Hall approximation: enough for test data
    float s = 0.f;
    for (int i = 0; i < 12; ++i) s += uniform();
    return s - 6.f;
  }
  int below(int n) { return int(next() % uint64_t(n)); }
};

// bf16 <-> fp32 on the host (round to nearest even), so tests need no cuda_bf16 host support.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // keep NaN a NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// RAII device buffer.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : count(n) {
    if (n && cudaMalloc(&ptr, n * sizeof(T)) != cudaSuccess) throw Abort(format("cudaMalloc(%zu) failed", n * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), count(o.count) { o.ptr = nullptr; o.count = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr) cudaFree(ptr);
      ptr = o.ptr;
      count = o.count;
      o.ptr = nullptr;
      o.count = 0;
    }
    return *this;
  }
  ~DeviceBuffer() { if (ptr) cudaFree(ptr); }
  void upload(const std::vector<T>& host) {
    if (host.size() != count) throw Abort("upload size mismatch");
    if (count && cudaMemcpy(ptr, host.data(), count * sizeof(T), cudaMemcpyHostToDevice) != cudaSuccess)
      throw Abort("cudaMemcpy H2D failed");
  }
  std::vector<T> download() const {
    std::vector<T> host(count);
    if (count && cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw Abort(format("cudaMemcpy D2H failed: %s", cudaGetErrorString(cudaGetLastError())));
    return host;
  }
  // Fills with a byte pattern so tests can see which outputs a kernel never wrote.
  void poison(int byte = 0xA5) {
    if (count && cudaMemset(ptr, byte, count * sizeof(T)) != cudaSuccess) throw Abort("cudaMemset failed");
  }
};

// Logits on the device as fp32 or bf16 (rounded from the fp32 host values), for the kernels that take
// either dtype; `ptr` is what the C ABI's `const void*` logits argument gets.
struct DeviceLogits {
  DeviceBuffer<float> f32;
  DeviceBuffer<uint16_t> bf16;
  const void* ptr = nullptr;
  DeviceLogits(const std::vector<float>& host, bool as_bf16) {
    if (as_bf16) {
      std::vector<uint16_t> h(host.size());
      for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(host[i]);
      bf16 = DeviceBuffer<uint16_t>(h);
      ptr = bf16.ptr;
    } else {
      f32 = DeviceBuffer<float>(host);
      ptr = f32.ptr;
    }
  }
};

// Sets an environment variable for the scope (e.g. a launcher option read on every call), then restores it.
// A null value leaves the variable as it is.
struct ScopedEnv {
  std::string name, old;
  bool had = false;
  ScopedEnv(const char* n, const char* value) : name(n) {
    const char* o = std::getenv(n);
    had = o != nullptr;
    if (had) old = o;
    if (value != nullptr) setenv(n, value, 1);
  }
  ~ScopedEnv() {
    if (had) setenv(name.c_str(), old.c_str(), 1);
    else unsetenv(name.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};

}  // namespace st

#define DDTREE_SELFTEST(name)                                                    \
  static void ddtree_selftest_##name();                                          \
  static const bool ddtree_selftest_registered_##name =                          \
      ::st::register_test(#name, ddtree_selftest_##name);                        \
  static void ddtree_selftest_##name()

#define ST_EXPECT(cond, ...)                                                     \
  do {                                                                           \
    bool st_ok_ = static_cast<bool>(cond);                                       \
    ::st::record(st_ok_, st_ok_ ? std::string() : ::st::format(__VA_ARGS__));    \
  } while (0)

#define ST_REQUIRE(cond, ...)                                                    \
  do {                                                                           \
    if (!(cond)) {                                                               \
      ::st::record(false, ::st::format(__VA_ARGS__));                            \
      throw ::st::Abort("required check failed");                                \
    }                                                                            \
  } while (0)

#define ST_CUDA(call)                                                            \
  do {                                                                           \
    cudaError_t st_err_ = (call);                                                \
    ST_REQUIRE(st_err_ == cudaSuccess, "%s:%d %s -> %s", __FILE__, __LINE__, #call, \
               cudaGetErrorString(st_err_));                                     \
  } while (0)

#define ST_CHECK_STATUS(call)                                                    \
  do {                                                                           \
    ddtree_status_t st_s_ = (call);                                              \
    ST_REQUIRE(st_s_ == DDTREE_STATUS_SUCCESS, "%s:%d %s -> %s: %s", __FILE__, __LINE__, #call, \
               ddtree_status_string(st_s_), ddtree_last_error());                \
  } while (0)
