// Stand-in for <cuda_runtime.h> when build_tree.cuh is compiled for the CPU emulator (simt_emu.h).
#pragma once
#include "../simt_emu.h"

// What build_tree/warp_heap.cuh uses on top of simt_emu.h (here, not in simt_emu.h: the top-k emulator's
// own stand-in header includes simt_emu.h and defines uint4 and __any_sync itself).
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline double2 make_double2(double x, double y) { return double2{x, y}; }
inline int __double2hiint(double d) {
  return static_cast<int>(static_cast<unsigned long long>(__double_as_longlong(d)) >> 32);
}
inline int __double2loint(double d) {
  return static_cast<int>(static_cast<unsigned long long>(__double_as_longlong(d)) & 0xFFFFFFFFull);
}
inline double __hiloint2double(int hi, int lo) {
  return __longlong_as_double(static_cast<long long>((static_cast<unsigned long long>(static_cast<unsigned>(hi)) << 32) |
                                                     static_cast<unsigned>(lo)));
}
inline unsigned __reduce_min_sync(unsigned, unsigned v) {
  const int lane = threadIdx.x & 31;
  emu::slot(lane) = v;
  emu::warp_sync();
  unsigned m = ~0u;
  for (int l = 0; l < 32; ++l) m = std::min(m, static_cast<unsigned>(emu::slot(l)));
  emu::warp_sync();
  return m;
}
inline unsigned __reduce_add_sync(unsigned, unsigned v) {
  const int lane = threadIdx.x & 31;
  emu::slot(lane) = v;
  emu::warp_sync();
  unsigned a = 0u;
  for (int l = 0; l < 32; ++l) a += static_cast<unsigned>(emu::slot(l));
  emu::warp_sync();
  return a;
}
inline bool __any_sync(unsigned mask, bool pred) { return __ballot_sync(mask, pred) != 0u; }
