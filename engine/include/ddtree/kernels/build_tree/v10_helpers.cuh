// build_tree v10, part 1: the large-M path's constants, shared-memory layout (V10Smem, V10Rows) and the
// device helpers v10_select calls (threshold searches, block scan, bitonic sort, count1, parent lookup).
// Separate from v10.cuh (the header comment there has the design) so that each file stays under 500 lines;
// v10.cuh includes this file where these lines used to be, so the translation units see the same code.
#pragma once

#include <cmath>

#include "ddtree/kernels/build_tree/common.cuh"
#include "ddtree/kernels/build_tree/v8.cuh"

namespace ddtree {
namespace build_tree_k {

constexpr int kV10MinM = kV8MaxM + 1;  // M > 64: below that v8 / auto decide (s6small's branch)
constexpr int kV10MaxL = 16;
constexpr int kV10Lps = 4096;   // row floats kept in shared memory (rs = min(R, kV10Lps / L))
constexpr int kV10CC = 3072;    // candidates above the enumeration threshold (12-bit index in the key)
constexpr int kV10FC = 1536;    // families (11-bit parent index)
constexpr int kV10Sort = 2048;  // candidates sorted at most
constexpr int kV10Bins = 1024;  // select histogram
constexpr int kV10Items = 6656;
constexpr int kV10CountSort = 384;  // up to this many kept candidates: rank by counting, else bitonic // (family, position) items per enumeration round
static_assert(kV10CC <= 4096 && kV10FC <= 2048, "key and meta field widths");

struct V10Smem {
  union {
    float lps[kV10Lps];             // rows (stages 1-3); the sort's exchange buffer; Nodes at the very end
    uint64_t xbuf[kV10Sort];
  };
  union {
    struct {                       // enumeration, per (family, position) item:
      uint32_t items[kV10Items];    // its children, then their offsets
      uint16_t itemfam[kV10Items];  // its family
    };
    struct {
      uint64_t sk[kV10Sort];        // kept keys, then sorted keys
      uint16_t cf[kV10CC];          // candidate -> family
      uint8_t cl[kV10CC];           // candidate -> length
      int16_t node_of[kV10CC];      // candidate -> node index (-1 outside the top M)
    } c;
  };
  long long G[kV10FC];
  uint32_t meta[kV10FC];   // parent family (11 bits) | p << 11 (5 bits: depth of the last deviation) | r << 16
  uint16_t pi[kV10FC];     // prod (r_i + 1)
  uint8_t fa[kV10FC], fb[kV10FC];  // members [fa, fb]
  uint32_t foff[kV10FC];   // item offsets (enumeration), then the first candidate of each family
  uint32_t hist[kV10Bins];
  long long H[kV10MaxL + 1];
  long long hv[kV10MaxL];
  long long pth[kWarps];
  int pcnt[kWarps];
  double vsum;
  int qneg, bad, cnt, c1, kept;
};
static_assert(sizeof(Nodes) <= sizeof(float) * kV10Lps, "Nodes overlay the rows only");
static_assert(sizeof(V10Smem) <= offsetof(Smem, warp_sum), "block_exclusive_scan's words stay clear");

struct V10Rows {
  const float* s;
  const float* g;
  int rs, K;
  __device__ __forceinline__ float at(int d, int r) const {
    return r < rs ? s[d * rs + r] : __ldg(g + static_cast<size_t>(d) * K + r);
  }
};

// Ranks r in [1, rmax] of row d with lp[d][r] * 2^q >= need (a prefix: rows are sorted). Gallop from
// rank 1 so that a short answer costs few loads (and ranks beyond the shared copy are rarely touched).
// The float threshold x >= need * 2^-q as a double (sc = 2^-q; exact: |need| is clamped to 2^53, and only
// needs in (-2^52, 0] can split a validated row).
// Then rounded up to a float: for a float x, x >= t iff x >= the smallest float >= t, so every search
// compares floats (the second GPU run spent most of the bound's time converting row floats to fp64, a
// conversion the H200 issues at a fraction of the fp32 rate).
__device__ __forceinline__ float v10_thr(long long need, double sc) {
  if (need > 1) need = 1;
  const long long lim = -(1ll << 53);
  if (need < lim) need = lim;
  const double t = static_cast<double>(need) * sc;
#ifdef __CUDA_ARCH__
  return __double2float_ru(t);
#else
  float f = static_cast<float>(t);
  if (static_cast<double>(f) < t) f = std::nextafter(f, __builtin_huge_valf());
  return f;
#endif
}

__device__ __forceinline__ int v10_kids(const V10Rows& rw, int d, int rmax, long long need, double sc) {
  if (rmax < 1) return 0;
  const float t = v10_thr(need, sc);
  if (rw.at(d, 1) < t) return 0;
  int lo = 1, p = 2;
  while (p <= rmax && rw.at(d, p) >= t) {
    lo = p;
    p <<= 1;
  }
  int hi = p <= rmax ? p : rmax + 1;  // lo passes, hi fails (or is past rmax)
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (rw.at(d, mid) >= t) lo = mid; else hi = mid;
  }
  return lo;
}

// The same count for a higher threshold t, knowing that ranks 1..r passed a lower one: gallop down from r.
__device__ __forceinline__ int v10_down(const V10Rows& rw, int d, int r, float t) {
  if (r < 1 || rw.at(d, r) >= t) return r;
  int hi = r, lo = 0, step = 1;  // hi fails
  while (true) {
    const int p = hi - step;
    if (p < 1) break;
    if (rw.at(d, p) >= t) {
      lo = p;
      break;
    }
    hi = p;
    step <<= 1;
  }
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (rw.at(d, mid) >= t) lo = mid; else hi = mid;
  }
  return lo;
}

// Last index f in [lo, hi) with off[f] <= t (offsets non-decreasing; the owner of slot t).
__device__ __forceinline__ int v10_owner(const uint32_t* off, int lo, int hi, uint32_t t) {
  int a = lo, b = hi;  // first index with off > t
  while (a < b) {
    const int mid = (a + b) >> 1;
    if (off[mid] <= t) a = mid + 1; else b = mid;
  }
  return a - 1;
}

// Exclusive scan of values v[lo..hi) in place (each thread a contiguous chunk); returns the total.
__device__ __forceinline__ uint32_t v10_scan(Smem& S, uint32_t* v, int lo, int hi) {
  const int n = hi - lo;
  const int chunk = (n + kThreads - 1) / kThreads;
  const int beg = lo + min(n, static_cast<int>(threadIdx.x) * chunk), end = min(hi, beg + chunk);
  unsigned sum = 0;
  for (int j = beg; j < end; ++j) sum += v[j];
  unsigned total;
  unsigned base = block_exclusive_scan(S, sum, &total);
  for (int j = beg; j < end; ++j) {
    const unsigned c = v[j];
    v[j] = base;
    base += c;
  }
  __syncthreads();
  return total;
}

__device__ __forceinline__ void v10_cx(uint64_t& x, uint64_t y, bool take_min) {
  x = take_min ? (y < x ? y : x) : (y > x ? y : x);
}

// Bitonic sort ascending of P = E * kThreads keys; element i = e * kThreads + tid lives in x[e].
template <int E>
__device__ __forceinline__ void v10_sort(uint64_t (&x)[E], uint64_t* buf) {
  const int tid = threadIdx.x;
  constexpr int P = E * kThreads;
#pragma unroll 1
  for (int k = 2; k <= P; k <<= 1) {
#pragma unroll 1
    for (int j = k >> 1; j > 0; j >>= 1) {
      if (j >= kThreads) {
        const int es = j / kThreads;
#pragma unroll
        for (int e = 0; e < E; ++e) {
#pragma unroll
          for (int e2 = 0; e2 < E; ++e2) {
            if (e2 != (e ^ es) || e2 < e) continue;
            const int i = e * kThreads + tid;
            const bool asc = (i & k) == 0;
            const uint64_t a = x[e], b = x[e2];
            const bool sw = asc ? a > b : a < b;
            x[e] = sw ? b : a;
            x[e2] = sw ? a : b;
          }
        }
      } else if (j >= 32) {
#pragma unroll
        for (int e = 0; e < E; ++e) buf[e * kThreads + tid] = x[e];
        __syncthreads();
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int i = e * kThreads + tid;
          const uint64_t y = buf[i ^ j];
          v10_cx(x[e], y, ((i & j) == 0) == ((i & k) == 0));
        }
        __syncthreads();
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int i = e * kThreads + tid;
          const uint64_t y = __shfl_xor_sync(0xffffffffu, x[e], j);
          v10_cx(x[e], y, ((i & j) == 0) == ((i & k) == 0));
        }
      }
    }
  }
}

// count1(theta) for this warp's theta (see the header); the whole warp returns the same value. Lane
// (j, half) takes deviation depth j and half of the lengths l > j: one gallop for its first length, then
// (the budget H[l] - theta shrinks as l grows) a short downward search per further length.
__device__ __forceinline__ int v10_count1(const V10Smem& V, const V10Rows& rw, int L, int Rm, long long theta, double sc) {
  const int lane = threadIdx.x & 31;
  int c = lane < L && V.H[lane + 1] >= theta ? 1 : 0;
  const int j = lane & 15, half = lane >> 4;
  if (j < L && Rm > 1) {
    const int n = L - j;                 // lengths j + 1 .. L
    const int n0 = (n + 1) >> 1;         // the first half's share
    const int l0 = half ? j + 1 + n0 : j + 1, l1 = half ? L : j + n0;
    int r = 0;
#pragma unroll 1
    for (int l = l0; l <= l1; ++l) {
      const long long need = theta - V.H[l] + V.hv[j];
      r = l == l0 ? v10_kids(rw, j, Rm - 1, need, sc) : v10_down(rw, j, r, v10_thr(need, sc));
      c += r;
    }
  }
  return warp_sum_i(c);
}

// The candidate index of candidate c's parent (-1: the root), from the flattened families.
__device__ __forceinline__ int v10_parent_cand(const V10Smem& V, int c) {
  const int f = V.c.cf[c], l = V.c.cl[c];
  if (l == 1) return -1;
  const uint32_t mt = V.meta[f];
  const int pf = static_cast<int>(mt & 0x7FFu), p = static_cast<int>((mt >> 11) & 31u);
  if (f == 0 || l != p) return c - 1;  // a rank-0 member: the member one shorter
  return static_cast<int>(V.foff[pf]) + (l - 1) - V.fa[pf];
}

}  // namespace build_tree_k
}  // namespace ddtree
