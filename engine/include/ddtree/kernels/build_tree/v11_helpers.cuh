// build_tree v11, part 1: the path's constants, shared-memory layout (V11Smem behind the node arrays,
// V11Rows), entry-meta accessors, the rank-tuple compare and the raise's histogram passes (v11_raise).
// Separate from v11.cuh (the header comment there has the design; v11_select, the one-warp band loop and
// the final ranking, stays there) so that each file stays under 500 lines; v11.cuh includes this file
// where these lines used to be, so the translation units see the same code.
#pragma once

#include <cmath>

#include "ddtree/kernels/build_tree/common.cuh"

namespace ddtree {
namespace build_tree_k {

constexpr int kImplV11 = 10;
constexpr int kV11MaxL = 16;
constexpr int kV11ECap = 2304;  // popped + queued entries (node index <= 1024; 16-bit links)
constexpr int kV11DCap = 1536;  // deferred entries
constexpr int kV11MaxBands = 32;
constexpr int kV11Bins = 64;    // the raise's histogram
constexpr int kV11Lps = 4096;   // row floats in shared memory (rs = min(R, kV11Lps / L)); the rest via __ldg
constexpr int kV11RunBudget = 512;  // run members written per round at most (a lane's cap: 512 / lanes, >= 16)
constexpr uint32_t kV11Pend = 1u << 16;  // meta: the next sibling is not pushed yet
constexpr uint32_t kV11Root = 0xFFFFu;   // tree parent "root"
static_assert(kV11ECap <= 0xFFFF, "16-bit entry links");

// Entry meta: rank (bits 0-10) | depth << 11 (5 bits) | kV11Pend; link: tree parent | heap parent << 16.
struct V11Smem {
  double es[kV11ECap];
  uint32_t em[kV11ECap];
  uint32_t el[kV11ECap];
  double ds[kV11DCap];
  uint32_t dm[kV11DCap];
  uint32_t dl[kV11DCap];
  int16_t node[kV11ECap];  // entry -> node index (0: not a node)
  uint32_t hist[kV11Bins];
  int bstart[kV11MaxBands + 1];
  int nb, qt, bad, hand;  // bad: the rows check; hand: the search's hand-back reasons
  float lp[kV11Lps];
};
// V11Smem lives behind the Nodes (at the start of Smem::lex) that the output stage reads.
constexpr size_t kV11Off = (sizeof(Nodes) + 15) / 16 * 16;
static_assert(kV11Off + sizeof(V11Smem) <= kSmemBytes, "v11's layout fits behind the node arrays");
static_assert(sizeof(Nodes) <= kV11Off, "node arrays stay clear of v11's layout");

__device__ __forceinline__ V11Smem& v11_smem(Smem& S) {
  return *reinterpret_cast<V11Smem*>(reinterpret_cast<unsigned char*>(&S) + kV11Off);
}

// lp[d][r] of depth row d (0-based), r < R.
struct V11Rows {
  const float* s;
  const float* g;
  int rs, K;
  __device__ __forceinline__ float at(int d, int r) const {
    return r < rs ? s[d * rs + r] : __ldg(g + static_cast<size_t>(d) * K + r);
  }
};

__device__ __forceinline__ int v11_rank(uint32_t m) { return static_cast<int>(m & 2047u); }
__device__ __forceinline__ int v11_depth(uint32_t m) { return static_cast<int>((m >> 11) & 31u); }

// Rank tuple of entry a < that of entry b (only for exact score ties; walks the tree-parent links).
__device__ __noinline__ bool v11_tuple_less(const V11Smem& V, int a, int b) {
  int ra[kV11MaxL], rb[kV11MaxL];
  const int da = v11_depth(V.em[a]), db = v11_depth(V.em[b]);
  for (int e = a, k = da - 1; k >= 0; --k) {
    ra[k] = v11_rank(V.em[e]);
    e = static_cast<int>(V.el[e] & 0xFFFFu);
  }
  for (int e = b, k = db - 1; k >= 0; --k) {
    rb[k] = v11_rank(V.em[e]);
    e = static_cast<int>(V.el[e] & 0xFFFFu);
  }
  const int dm = min(da, db);
  for (int k = 0; k < dm; ++k)
    if (ra[k] != rb[k]) return ra[k] < rb[k];
  return da < db;
}

__device__ __forceinline__ unsigned v11_lanes_below(int lane) { return (1u << lane) - 1u; }

// One histogram pass of the raise (warp 0): entries of E[b0, qt) that are >= floor; `above` = those > top,
// bins of width w below top (64 of them). Returns the first bin where above + the bins up to it reach
// `need` (-1: none), with *cum the count before that bin.
__device__ int v11_hist_pass(V11Smem& V, int b0, int qt, int need, double floor, double top, double w, unsigned* cum) {
  const int lane = threadIdx.x & 31;
  V.hist[lane] = 0u;
  V.hist[lane + 32] = 0u;
  __syncwarp();
  const double scale = 1.0 / w;
  unsigned above = 0u;
  for (int i = b0 + lane; i < qt; i += 32) {
    const double s = V.es[i];
    if (s > top) {
      ++above;
    } else if (s >= floor) {
      const int bin = static_cast<int>((top - s) * scale);
      if (bin < kV11Bins) atomicAdd(&V.hist[bin], 1u);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) above += __shfl_xor_sync(0xffffffffu, above, o);
  __syncwarp();
  const unsigned h0 = V.hist[2 * lane], h1 = V.hist[2 * lane + 1];
  unsigned inc = h0 + h1;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  inc += above;
  const unsigned excl = inc - h0 - h1;
  const unsigned ball = __ballot_sync(0xffffffffu, inc >= static_cast<unsigned>(need));
  __syncwarp();  // every lane has read the bins before the next pass clears them
  if (ball == 0u) return -1;
  const int src = __ffs(static_cast<int>(ball)) - 1;
  const bool first_half = excl + h0 >= static_cast<unsigned>(need);
  const int bin = __shfl_sync(0xffffffffu, first_half ? 2 * lane : 2 * lane + 1, src);
  *cum = __shfl_sync(0xffffffffu, first_half ? excl : excl + h0, src);
  return bin;
}

// The raise: a lower bound theta of the need-th best score among E[b0, qt) (entries >= tau), from a 64-bin
// histogram of [tau, hi] refined by a second one inside the crossing bin; returns tau when fewer than `need`
// entries are >= tau. Every entry counted up to the chosen bin is >= its lower edge less a margin for the
// rounding of (top - s) / w, so at least `need` entries are >= theta. Warp 0 only.
__device__ double v11_raise(V11Smem& V, int b0, int qt, int need, double tau, double hi) {
  unsigned cum = 0u;
  const double w = (hi - tau) / kV11Bins;
  const int bin = v11_hist_pass(V, b0, qt, need, tau, hi, w, &cum);
  if (bin < 0) return tau;
  double theta = hi - (bin + 1) * w - w * 0x1p-20;
  const double w2 = w / kV11Bins, top2 = hi - bin * w;
  const int bin2 = v11_hist_pass(V, b0, qt, need, theta, top2, w2, &cum);
  if (bin2 >= 0) theta = fmax(theta, top2 - (bin2 + 1) * w2 - w2 * 0x1p-20);
  return theta > tau ? theta : tau;
}

}  // namespace build_tree_k
}  // namespace ddtree
