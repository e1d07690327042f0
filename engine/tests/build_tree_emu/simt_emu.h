// A tiny SIMT emulator that runs a CUDA kernel's source on the CPU: one std::thread per CUDA thread,
// std::barrier for __syncthreads, per-warp barriers for the shuffle/ballot intrinsics, GCC atomics.
// It exists so that CI (no GPU) executes the real build_tree kernel code, barriers and all, against the
// reference. It is not a CUDA implementation: only what build_tree.cuh uses is here.
#pragma once

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct EmuIdx {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmuIdx threadIdx;
inline EmuIdx blockIdx;

namespace emu {
inline std::unique_ptr<std::barrier<>> block_barrier;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline std::vector<uint64_t> warp_slots;  // [warps][32]
}  // namespace emu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__
#define __align__(n)

namespace emu {
inline long barrier_count = 0;  // __syncthreads episodes (counted by thread 0): a cost proxy
}
inline void __syncthreads() {
  if (threadIdx.x == 0) ++emu::barrier_count;
  emu::block_barrier->arrive_and_wait();
}

template <typename T>
inline T __ldg(const T* p) { return *p; }

inline double __dadd_rn(double a, double b) { volatile double r = a + b; return r; }
inline double __dsub_rn(double a, double b) { volatile double r = a - b; return r; }
inline double __ddiv_rn(double a, double b) { volatile double r = a / b; return r; }
inline long long __double_as_longlong(double d) { long long u; std::memcpy(&u, &d, 8); return u; }
inline double __longlong_as_double(long long u) { double d; std::memcpy(&d, &u, 8); return d; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline int __clz(unsigned v) { return v ? __builtin_clz(v) : 32; }
struct alignas(16) double2 { double x, y; };  // CUDA's vector type (16-byte loads of two doubles)
inline int __ffs(unsigned v) { return __builtin_ffs(static_cast<int>(v)); }

using std::max;
using std::min;

inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
template <typename T>
inline T emu_atomic_minmax(T* p, T v, bool want_min) {
  T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while ((want_min ? v < old : v > old) &&
         !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
inline int atomicMin(int* p, int v) { return emu_atomic_minmax(p, v, true); }
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) { return emu_atomic_minmax(p, v, true); }
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) { return emu_atomic_minmax(p, v, false); }

namespace emu {
inline uint64_t& slot(int lane) { return warp_slots[(threadIdx.x >> 5) * 32 + lane]; }
inline void warp_sync() { warp_barriers[threadIdx.x >> 5]->arrive_and_wait(); }
}  // namespace emu

template <typename T>
inline T __shfl_up_sync(unsigned, T v, int delta) {
  const int lane = threadIdx.x & 31;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  emu::slot(lane) = bits;
  emu::warp_sync();
  const uint64_t got = emu::slot(lane >= delta ? lane - delta : lane);
  emu::warp_sync();
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask) {
  const int lane = threadIdx.x & 31;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  emu::slot(lane) = bits;
  emu::warp_sync();
  const uint64_t got = emu::slot(lane ^ mask);
  emu::warp_sync();
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

template <typename T>
inline T __shfl_sync(unsigned, T v, int src) {
  const int lane = threadIdx.x & 31;
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  emu::slot(lane) = bits;
  emu::warp_sync();
  const uint64_t got = emu::slot(src & 31);
  emu::warp_sync();
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

inline double __dmul_rn(double a, double b) { volatile double r = a * b; return r; }
inline double __drcp_rn(double a) { volatile double r = 1.0 / a; return r; }

inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_sync(); }

inline unsigned __ballot_sync(unsigned, bool pred) {
  const int lane = threadIdx.x & 31;
  emu::slot(lane) = pred ? 1 : 0;
  emu::warp_sync();
  unsigned m = 0;
  for (int l = 0; l < 32; ++l) m |= static_cast<unsigned>(emu::slot(l)) << l;
  emu::warp_sync();
  return m;
}

// Runs kernel(args...) for `blocks` blocks of `threads` threads, blocks one after another.
template <typename F>
void emu_launch(int blocks, int threads, F&& kernel) {
  for (int b = 0; b < blocks; ++b) {
    blockIdx.x = static_cast<unsigned>(b);
    emu::block_barrier = std::make_unique<std::barrier<>>(threads);
    emu::warp_barriers.clear();
    for (int w = 0; w < (threads + 31) / 32; ++w) emu::warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
    emu::warp_slots.assign(static_cast<size_t>((threads + 31) / 32) * 32, 0);
    std::vector<std::thread> pool;
    pool.reserve(threads);
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([t, &kernel] {
        threadIdx.x = static_cast<unsigned>(t);
        kernel();
      });
    for (auto& th : pool) th.join();
  }
}
