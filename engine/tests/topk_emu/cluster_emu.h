// A SIMT emulator with thread-block clusters, for running draft_topk_lse_v4.cuh on the CPU (CI has no GPU).
//
// Unlike build_tree_emu/simt_emu.h (one block at a time, globals for the block state), every CTA of a
// cluster runs at once here: one POSIX thread per CUDA thread, per-CTA shared memory, block barrier,
// warp barriers and shuffle slots reached through thread-locals, and one cluster barrier (split
// arrive/wait, as barrier.cluster.arrive/wait) across all threads of the cluster. Distributed shared
// memory is plain pointer arithmetic into another CTA's shared-memory buffer. Shared memory starts
// filled with 0xA5 bytes (the GPU's is uninitialized too). Only what the v4 kernel, common.cuh and
// block_select.cuh use is here; it is not a CUDA implementation.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

struct EmuIdx {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmuIdx threadIdx;
inline thread_local EmuIdx blockIdx;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)

namespace emu4 {
constexpr size_t kSmemBytes = 64 << 10;

struct Cta {
  explicit Cta(int threads) : block(threads), slots(size_t(threads), 0) {
    for (int w = 0; w < threads / 32; ++w) warps.push_back(std::make_unique<std::barrier<>>(32));
    std::memset(smem, 0xA5, sizeof(smem));
  }
  std::barrier<> block;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<uint64_t> slots;  // one per thread: shuffle / ballot exchange
  alignas(64) unsigned char smem[kSmemBytes];
};

struct Cluster {
  explicit Cluster(int threads) : bar(threads) {}
  std::barrier<> bar;
  std::vector<Cta*> ctas;
};

inline thread_local Cta* cta = nullptr;
inline thread_local Cluster* cluster = nullptr;
inline thread_local std::optional<std::barrier<>::arrival_token> token;
inline std::atomic<long> barrier_count{0};  // __syncthreads episodes (counted by thread 0 of each CTA)

inline uint64_t& slot(int lane) { return cta->slots[(threadIdx.x & ~31u) + unsigned(lane)]; }
inline void warp_sync() { cta->warps[threadIdx.x >> 5]->arrive_and_wait(); }

template <typename T>
inline T exchange(T v, int src_lane) {
  static_assert(sizeof(T) <= 8, "shuffles move up to 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  slot(int(threadIdx.x & 31)) = bits;
  warp_sync();
  const uint64_t got = slot(src_lane & 31);
  warp_sync();
  T out;
  std::memcpy(&out, &got, sizeof(T));
  return out;
}

struct Start {
  std::function<void()>* body;
  EmuIdx thread, block;
  Cta* cta;
  Cluster* cluster;
};
inline void* thread_main(void* arg) {
  const Start* s = static_cast<const Start*>(arg);
  threadIdx = s->thread;
  blockIdx = s->block;
  cta = s->cta;
  cluster = s->cluster;
  token.reset();
  (*s->body)();
  return nullptr;
}

// Runs kernel() on grid (cluster_size, rows) with cluster dims (cluster_size, 1, 1): the CTAs of one
// cluster together, clusters one after another.
inline void launch_clusters(int cluster_size, int rows, int threads, std::function<void()> kernel) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 << 10);
  for (int row = 0; row < rows; ++row) {
    Cluster cl(cluster_size * threads);
    std::vector<std::unique_ptr<Cta>> ctas;
    for (int c = 0; c < cluster_size; ++c) {
      ctas.push_back(std::make_unique<Cta>(threads));
      cl.ctas.push_back(ctas.back().get());
    }
    std::vector<Start> starts(size_t(cluster_size) * threads);
    std::vector<pthread_t> pool(starts.size());
    for (int c = 0; c < cluster_size; ++c)
      for (int t = 0; t < threads; ++t) {
        Start& s = starts[size_t(c) * threads + t];
        s = Start{&kernel, EmuIdx{unsigned(t), 0, 0}, EmuIdx{unsigned(c), unsigned(row), 0}, ctas[c].get(), &cl};
        if (pthread_create(&pool[size_t(c) * threads + t], &attr, thread_main, &s) != 0) {
          std::fprintf(stderr, "pthread_create failed\n");
          std::abort();
        }
      }
    for (pthread_t& th : pool) pthread_join(th, nullptr);
  }
  pthread_attr_destroy(&attr);
}
}  // namespace emu4

// ---- CUDA intrinsics used by the kernels -------------------------------------------------------------
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(16) ulonglong2 {
  unsigned long long x, y;
};
struct alignas(8) float2 {
  float x, y;
};
inline float2 make_float2(float a, float b) { return float2{a, b}; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __popcll(unsigned long long v) { return __builtin_popcountll(v); }
template <typename T>
inline T __ldg(const T* p) { return *p; }
using std::max;
using std::min;

inline void __syncthreads() {
  if (threadIdx.x == 0) ++emu4::barrier_count;
  emu4::cta->block.arrive_and_wait();
}
inline void __syncwarp(unsigned = 0xffffffffu) { emu4::warp_sync(); }

template <typename T>
inline T __shfl_sync(unsigned, T v, int src) { return emu4::exchange(v, src); }
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask) { return emu4::exchange(v, int(threadIdx.x & 31) ^ mask); }
template <typename T>
inline T __shfl_up_sync(unsigned, T v, int delta) {
  const int lane = int(threadIdx.x & 31);
  return emu4::exchange(v, lane >= delta ? lane - delta : lane);
}
inline unsigned __ballot_sync(unsigned, bool pred) {
  emu4::slot(int(threadIdx.x & 31)) = pred ? 1 : 0;
  emu4::warp_sync();
  unsigned m = 0;
  for (int l = 0; l < 32; ++l) m |= unsigned(emu4::slot(l)) << l;
  emu4::warp_sync();
  return m;
}
inline bool __any_sync(unsigned mask, bool pred) { return __ballot_sync(mask, pred) != 0u; }
inline unsigned __reduce_max_sync(unsigned, unsigned v) {
  emu4::slot(int(threadIdx.x & 31)) = v;
  emu4::warp_sync();
  unsigned m = 0;
  for (int l = 0; l < 32; ++l) m = std::max(m, unsigned(emu4::slot(l)));
  emu4::warp_sync();
  return m;
}

inline unsigned __reduce_min_sync(unsigned, unsigned v) {
  emu4::slot(int(threadIdx.x & 31)) = v;
  emu4::warp_sync();
  unsigned m = ~0u;
  for (int l = 0; l < 32; ++l) m = std::min(m, unsigned(emu4::slot(l)));
  emu4::warp_sync();
  return m;
}

inline unsigned __reduce_add_sync(unsigned, unsigned v) {
  emu4::slot(int(threadIdx.x & 31)) = v;
  emu4::warp_sync();
  unsigned s = 0;
  for (int l = 0; l < 32; ++l) s += unsigned(emu4::slot(l));
  emu4::warp_sync();
  return s;
}

inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline int atomicOr(int* p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }

// ---- the v4 kernel's primitives (draft_topk_lse_v4.cuh leaves them to us under DDTREE_V4_EMULATED) --
#define DDTREE_V4_EMULATED 1
#define DDTREE_V4_SHARED(type, name)                                                     \
  static_assert(sizeof(type) <= emu4::kSmemBytes, "emulated shared memory too small"); \
  type& name = *reinterpret_cast<type*>(emu4::cta->smem)

inline void v4_cluster_arrive_relaxed() { emu4::token.emplace(emu4::cluster->bar.arrive()); }
inline void v4_cluster_arrive_release() { emu4::token.emplace(emu4::cluster->bar.arrive()); }
inline void v4_cluster_wait() {
  emu4::cluster->bar.wait(std::move(*emu4::token));
  emu4::token.reset();
}
template <typename P>
inline P* v4_map_rank(P* p, unsigned rank) {
  const auto* base = emu4::cta->smem;
  const auto off = reinterpret_cast<const unsigned char*>(p) - base;
  if (off < 0 || size_t(off) >= emu4::kSmemBytes || rank >= emu4::cluster->ctas.size()) {
    std::fprintf(stderr, "v4_map_rank: %p is not this CTA's shared memory, or rank %u out of range\n",
                 static_cast<const void*>(p), rank);
    std::abort();
  }
  return reinterpret_cast<P*>(emu4::cluster->ctas[rank]->smem + off);
}
inline int v4_atomic_add_shared(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float v4_ex2(float x) { return std::exp2(x); }
inline int v4_lane_again() { return int(threadIdx.x & 31u); }
inline uint32_t v4_bf16x2_max(uint32_t a, uint32_t b) {
  const float alo = __uint_as_float(a << 16), blo = __uint_as_float(b << 16);
  const float ahi = __uint_as_float(a & 0xffff0000u), bhi = __uint_as_float(b & 0xffff0000u);
  // max.bf16x2 without .NaN: a NaN input yields the other one (std::fmax does the same).
  return (__float_as_uint(std::fmax(alo, blo)) >> 16) | (__float_as_uint(std::fmax(ahi, bhi)) & 0xffff0000u);
}
// 16-byte loads of logits (float or bf16 storage) without type punning through pointers.
inline uint4 __ldg(const uint4* p) {
  uint4 v;
  std::memcpy(&v, static_cast<const void*>(p), sizeof v);
  return v;
}
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
  unsigned long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
inline int __ffs(int v) { return __builtin_ffs(v); }
// The opt-in asynchronous exchange (ASYNC): an mbarrier is a byte count that st.async decrements after its
// store; CTA 0 waits for zero. (One arrival, armed at initialization, as the kernel uses it.)
inline void v4_mbar_init_expect(uint64_t* mbar, unsigned bytes) { __atomic_store_n(mbar, uint64_t(bytes), __ATOMIC_SEQ_CST); }
// v11's second mbarrier: initialized with its one arrival pending (2^40), armed later by that arrival with its bytes;
// bytes that land first take the count below the pending value (unsigned wrap-around), as the tx-count goes negative.
inline void v4_mbar_init(uint64_t* mbar) { __atomic_store_n(mbar, uint64_t(1) << 40, __ATOMIC_SEQ_CST); }
inline void v4_mbar_arrive_expect(uint64_t* mbar, unsigned bytes) {
  __atomic_fetch_add(mbar, uint64_t(bytes) - (uint64_t(1) << 40), __ATOMIC_SEQ_CST);
}
inline void v4_mbar_wait0(uint64_t* mbar) {
  while (__atomic_load_n(mbar, __ATOMIC_SEQ_CST) != 0) sched_yield();
}
inline void v4_st_async(uint64_t* p, unsigned rank, uint64_t v, uint64_t* mbar) {
  *v4_map_rank(p, rank) = v;
  __atomic_fetch_sub(v4_map_rank(mbar, rank), uint64_t(8), __ATOMIC_SEQ_CST);
}
inline void v4_st_async(uint32_t* p, unsigned rank, uint32_t v, uint64_t* mbar) {
  *v4_map_rank(p, rank) = v;
  __atomic_fetch_sub(v4_map_rank(mbar, rank), uint64_t(4), __ATOMIC_SEQ_CST);
}
inline void v4_st_async(float2* p, unsigned rank, float2 v, uint64_t* mbar) {
  *v4_map_rank(p, rank) = v;
  __atomic_fetch_sub(v4_map_rank(mbar, rank), uint64_t(8), __ATOMIC_SEQ_CST);
}
