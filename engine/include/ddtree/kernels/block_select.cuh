// Block-wide exact top-k selection (radix select over packed 64-bit items) and a block bitonic sort.
//
// Items are the u64s of pack_item(): larger = better, all distinct, 0 = "no item". Selecting the k
// largest therefore never needs a tie rule: ties between equal keys are already ordered by id.
#pragma once

#include <cstdint>

#include "ddtree/kernels/common.cuh"

namespace ddtree {
namespace kernels {

constexpr int kSelectBins = 4096;  // widest digit: 12 bits

struct SelectSmem {
  uint32_t hist[kSelectBins];
  int scan[33];
  int digit;
  int krem;
  int count;
};

// Finds (prefix, mask) such that exactly k nonzero items of the block satisfy (item & mask) >= prefix:
// they are the block's k largest. for_each(f) must call f(item) for every item this thread owns (the
// same items on every call). Requires 1 <= k <= number of nonzero items. Digits are 12+10+10 bits of
// the key, then 12+10+10 of the id; it stops as soon as the boundary digit holds exactly the items
// still needed, so distinct keys usually finish in two or three passes.
template <int THREADS, class ForEach>
__device__ __forceinline__ void block_select_top(ForEach for_each, int k, SelectSmem& sm, uint64_t& prefix_out,
                                                 uint64_t& mask_out) {
  uint64_t prefix = 0, mask = 0;
  int krem = k;
  for (int p = 0; p < 6; ++p) {
    const int bits = (p % 3 == 0) ? 12 : 10;
    const int shift = (p == 0) ? 52 : (p == 1) ? 42 : (p == 2) ? 32 : (p == 3) ? 20 : (p == 4) ? 10 : 0;
    const int nb = 1 << bits;
    for (int i = threadIdx.x; i < nb; i += THREADS) sm.hist[i] = 0;
    __syncthreads();
    const uint64_t m = mask, pre = prefix;
    for_each([&](uint64_t it) {
      if (it != 0 && (it & m) == pre) atomicAdd(&sm.hist[uint32_t(it >> shift) & uint32_t(nb - 1)], 1u);
    });
    __syncthreads();
    // Thread t owns bins [t*per, t*per + per); "above" = items in higher bins (higher threads).
    const int per = (nb + THREADS - 1) / THREADS;
    const int lo = threadIdx.x * per;
    int local = 0;
    for (int i = 0; i < per; ++i)
      if (lo + i < nb) local += int(sm.hist[lo + i]);
    int total;
    const int incl = block_inclusive_scan<THREADS>(local, sm.scan, &total);
    const int above = total - incl;
    if (local > 0 && above < krem && krem <= above + local) {
      int acc = above;
      for (int i = per - 1; i >= 0; --i) {
        const int bin = lo + i;
        if (bin >= nb) continue;
        const int c = int(sm.hist[bin]);
        if (acc + c >= krem) {
          sm.digit = bin;
          sm.krem = krem - acc;
          sm.count = c;
          break;
        }
        acc += c;
      }
    }
    __syncthreads();
    const int digit = sm.digit, count = sm.count;
    krem = sm.krem;
    prefix |= uint64_t(digit) << shift;
    mask |= uint64_t(nb - 1) << shift;
    __syncthreads();  // sm.digit/krem/count and hist are rewritten by the next pass
    if (count == krem) break;
  }
  prefix_out = prefix;
  mask_out = mask;
}

// Sorts a[0..P) descending in shared memory; P a power of two >= 2. Stages whose pairs stay inside one
// warp's 64-element block (j <= 32) need only __syncwarp.
template <int THREADS>
__device__ __forceinline__ void block_bitonic_sort_desc(uint64_t* a, int P) {
  for (int k = 2; k <= P; k <<= 1) {
    __syncthreads();
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < (P >> 1); i += THREADS) {
        const int lo = 2 * i - (i & (j - 1));
        const int hi = lo + j;
        const bool desc = (lo & k) == 0;
        const uint64_t x = a[lo], y = a[hi];
        if ((x < y) == desc) {
          a[lo] = y;
          a[hi] = x;
        }
      }
      if (j >= 64) __syncthreads();
      else __syncwarp();
    }
  }
  __syncthreads();
}

}  // namespace kernels
}  // namespace ddtree
