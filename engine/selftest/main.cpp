// ddtree-selftest: runs every DDTREE_SELFTEST registered by selftest/*_selftest.cu on the current GPU.
// Usage: ddtree-selftest [--list] [name-substring...]
#include <cstdarg>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "selftest.h"

namespace st {
namespace {

struct Test {
  const char* name;
  TestFn fn;
};

std::vector<Test>& registry() {
  static std::vector<Test> tests;  // function-local: safe against static-initialization order
  return tests;
}

struct Current {
  int checks = 0;
  int failures = 0;
  std::vector<std::string> messages;
} g_current;

constexpr size_t kMaxMessages = 5;

}  // namespace

bool register_test(const char* name, TestFn fn) {
  registry().push_back({name, fn});
  return true;
}

void record(bool ok, const std::string& message) {
  ++g_current.checks;
  if (!ok) {
    ++g_current.failures;
    if (g_current.messages.size() < kMaxMessages) g_current.messages.push_back(message);
  }
}

std::string format(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

}  // namespace st

int main(int argc, char** argv) {
  bool list_only = false;
  std::vector<std::string> filters;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--list") list_only = true;
    else if (a == "-h" || a == "--help") {
      std::printf("usage: %s [--list] [name-substring...]\n", argv[0]);
      return 0;
    } else filters.push_back(a);
  }
  auto selected = [&](const char* name) {
    if (filters.empty()) return true;
    for (const auto& f : filters)
      if (std::string(name).find(f) != std::string::npos) return true;
    return false;
  };
  if (list_only) {
    for (const auto& t : st::registry())
      if (selected(t.name)) std::printf("%s\n", t.name);
    return 0;
  }

  int device = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    std::printf("ERROR no usable CUDA device\n");
    return 2;
  }
  std::printf("# %s on %s (sm_%d%d, %d SMs)\n", ddtree_build_info(), prop.name, prop.major, prop.minor,
              prop.multiProcessorCount);
  if (ddtree_check_device() != DDTREE_STATUS_SUCCESS) {
    std::printf("ERROR %s\n", ddtree_last_error());
    return 2;
  }

  int run = 0, failed = 0;
  for (const auto& t : st::registry()) {
    if (!selected(t.name)) continue;
    st::g_current = st::Current{};
    ++run;
    std::string aborted;
    try {
      t.fn();
    } catch (const std::exception& e) {
      aborted = e.what();
    }
    // A test that leaves a CUDA error behind (an illegal access, say) fails, and the error is
    // reported here rather than blamed on the next test.
    cudaError_t err = cudaDeviceSynchronize();
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err != cudaSuccess) st::record(false, st::format("CUDA error after test: %s", cudaGetErrorString(err)));
    bool ok = st::g_current.failures == 0 && aborted.empty();
    if (!aborted.empty() && st::g_current.failures == 0) st::record(false, "aborted: " + aborted);
    if (ok) {
      std::printf("PASS %s (%d checks)\n", t.name, st::g_current.checks);
    } else {
      ++failed;
      std::printf("FAIL %s (%d of %d checks failed)", t.name, st::g_current.failures, st::g_current.checks);
      for (const auto& m : st::g_current.messages) std::printf("\n     %s", m.c_str());
      std::printf("\n");
    }
    std::fflush(stdout);
    if (err == cudaErrorIllegalAddress || err == cudaErrorLaunchFailure) {
      std::printf("ERROR the CUDA context is lost; stopping\n");
      return 1;
    }
  }
  std::printf("# %d tests, %d failed\n", run, failed);
  if (run == 0) {
    std::printf("ERROR no test matched\n");
    return 1;
  }
  return failed == 0 ? 0 : 1;
}
