// build_tree kernel, v8 small-M path (M <= 64, L <= 16): exact integer scores, chain closure in closed
// form, a threshold from 16 parallel warp probes, order by counting. bench/NOTES.md "### v8 (session 5)"
// has the design, the cycle estimate and the measurements.
//
// Why integers. Every log-prob x of a relevant rank (r < R = min(K, M + 1)) is a float, i.e. an integer
// multiple of 2^-q_x. With q = max q_x and sum_d |lp[d][R-1]| * 2^q < 2^52, every partial sum the heap
// forms (kappa of any candidate and its siblings' fl(fl(s - lp[r]) + lp[r+1])) is an integer multiple of
// 2^-q below 2^53 in magnitude, so fp64 computes all of them exactly: the heap's scores ARE the integer
// sums, and its pop order is (integer score desc, rank tuple asc). Rows that break this (unsorted,
// positive, NaN, +-inf, denormal, or too wide a range) go back to the older paths.
//
// Families. A candidate (r_1..r_l) is its deviation set D = {(i, r_i): r_i >= 1} plus its length l.
// With gap[i][r] = v_i(0) - v_i(r) >= 0 and H[l] = v_0(0) + .. + v_{l-1}(0) (non-increasing in l),
// score = H[l] - G(D), G(D) = sum of D's gaps. A family D (last deviation at position p, its leader of
// length p + 1) holds the lengths l in [p + 1, L]: the ones scoring >= theta are l <= dmax(theta + G)
// (one binary search over H: the whole chain of rank-0 extensions at once). Its children are
// D + (i, r) for p < i < dmax (position i is a rank-0 member's last position; r >= 1 with gap[i][r] <=
// H[i+1] - G - theta, a prefix of the sorted gap row) and each child's leader scores >= theta.
//
// Threshold. Warp w counts the candidates scoring >= theta_w (families by deviation rounds, all
// warp-synchronous: no block barrier, one shared list of families per warp, capped at 1.5 M + 32 <= kV8Cap)
// for a grid of 16 thresholds below the best score (2 octaves below a valid bound when K >= M, else a
// factor-2 grid over the whole score range; see stage 1); if the best threshold with >= M candidates
// overflowed the cap, 16 more probes split its bracket linearly. The winning warp's
// families (count in [M, kV8Cap]) are flattened to candidates and ranked by counting (candidates with
// a larger score, plus shorter members of the same family on an exact tie; an exact tie across families
// near the cut sends the request back to the older paths, which order ties by rank tuple).
#pragma once

#include "ddtree/kernels/build_tree/common.cuh"

namespace ddtree {
namespace build_tree_k {

constexpr int kV8MaxM = 64;
constexpr int kV8MaxL = 16;
constexpr int kV8R = kV8MaxM + 1;  // ranks kept per row (R <= M + 1)
constexpr int kV8Cap = 192;        // families and candidates per probe (parent index fits 8 bits)
constexpr int kV8Slots = (kV8MaxL * kV8R + kThreads - 1) / kThreads;
static_assert(kV8Cap <= 255, "parent family index is 8 bits");

struct V8Region {
  long long G[kV8Cap];      // gap sum of the family's deviations
  uint32_t meta[kV8Cap];    // parent family (8 bits) | (p + 1) << 8 (5 bits) | r << 13 (7) | pi << 20 (7)
  uint8_t a[kV8Cap], b[kV8Cap];  // member lengths [a, b] at the probe's theta
  uint16_t base[kV8Cap];    // first candidate index (winner only)
};

struct V8Smem {
  long long gap[kV8MaxL * kV8R];  // gap[d * R + r], fixed point
  long long hv[kV8MaxL];          // v_d(0), fixed point
  long long H[kWarps][kV8MaxL + 1];  // per-warp copy of the chain prefix sums
  V8Region reg[kWarps];
  long long cs[kV8Cap];           // winner's candidates: score, family, length
  uint8_t cf[kV8Cap], cl[kV8Cap];
  int16_t node_of[kV8Cap];
  long long theta1[kWarps], theta2[kWarps];
  int cnt1[kWarps], cnt2[kWarps], nfam1[kWarps], nfam2[kWarps];
  double vsum;
  int qneg, bad, C;
  int done1, done2;  // lowest probe index that finished with a usable count (atomics only)
};
// The v8 block lives after `lex` (which holds the Nodes it fills at the end) inside the kernel's Smem.
constexpr size_t kV8Offset = sizeof(uint64_t) * kCap;
static_assert(sizeof(Nodes) <= kV8Offset, "node arrays stay clear of the v8 block");

__device__ __forceinline__ long long v8_fix(float x, int q) {
  // x <= 0, zero or normal (checked): -(mantissa * 2^(e - 150 + q)), exact (q >= every q_x).
  const unsigned bits = __float_as_uint(x);
  const int e = static_cast<int>((bits >> 23) & 0xFFu);
  if (e == 0) return 0;
  const long long m = static_cast<long long>((bits & 0x7FFFFFu) | 0x800000u);
  const int s = e - 150 + q;
  return -(s >= 0 ? (m << s) : (m >> (-s)));
}

// Lengths l in [1, L] with H[l] >= x (H non-increasing): a branchless binary search.
__device__ __forceinline__ int v8_dmax(const long long* H, int L, long long x) {
  int b = 0;
#pragma unroll
  for (int s = 16; s >= 1; s >>= 1)
    if (b + s <= L && H[b + s] >= x) b += s;
  return b;
}

// Ranks r in [1, rlim] with gap[r] <= bud (a prefix: the gap row is non-decreasing).
__device__ __forceinline__ int v8_kids(const long long* gaprow, int rlim, long long bud) {
  if (rlim < 1 || gaprow[1] > bud) return 0;
  int lo = 1, hi = rlim;  // gap[lo] <= bud
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (gaprow[mid] <= bud) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp counts the candidates scoring >= theta (ranks r < R with prod(r_i + 1) <= M), writing the
// families into `rg`. Returns the count, or cap + 1 once it is certain to pass cap (every family
// allocated so far has at least its leader >= theta). Round 0 (the chain family alone) spreads its
// positions over the lanes; later rounds take a family per lane. A lane with more than a few children
// has them written by the whole warp (the first GPU run showed lane-serial writes of ~100 children
// setting the pace of a probe).
// Probe w also stops (as an overflow) once a probe with a higher threshold (index < w) has finished
// with a usable count (M..cap, recorded in *done): its result can no longer win.
__device__ int v8_probe(V8Smem& V, V8Region& rg, const long long* H, int L, int R, int M, int cap,
                        long long theta, int* nfam, int w, int* done) {
  const int lane = threadIdx.x & 31;
  int count = 0, lo = 0, hi = 1;
  bool over = false;
  for (int round = 0; lo < hi && !over; ++round) {
    int next = hi;
#pragma unroll 1
    for (int base = lo; base < hi; base += 32) {
      if (__shfl_sync(0xffffffffu, lane == 0 ? atomicAdd(done, 0) : 0, 0) < w) {
        over = true;
        break;
      }
      // This lane's family f and its positions [i0, i1) whose children it counts.
      const int f = round == 0 ? 0 : base + lane;
      const bool act = round == 0 || f < hi;
      const long long G = round == 0 ? 0 : act ? rg.G[f] : 0;
      const uint32_t mt = round == 0 ? 0xFFu | (1u << 20) : act ? rg.meta[f] : 0u;
      const int p = static_cast<int>((mt >> 8) & 31u) - 1;
      const int pi = static_cast<int>((mt >> 20) & 127u);
      const int a = p < 0 ? 1 : p + 1;
      const int b = act ? v8_dmax(H, L, theta + G) : 0;
      const bool owner = act && (round > 0 || lane == 0);  // writes the family's record
      if (owner) {
        rg.a[f] = static_cast<uint8_t>(a);
        rg.b[f] = static_cast<uint8_t>(b);
        if (round == 0) { rg.G[0] = 0; rg.meta[0] = mt; }  // the chain family: no parent, p = -1, pi = 1
      }
      count += warp_sum_i(owner && b >= a ? b - a + 1 : 0);
      const int i0 = round == 0 ? lane : p + 1;
      const int i1 = round == 0 ? min(lane + 1, b) : b;
      const int rlim = act ? min(R - 1, M / pi - 1) : 0;
      unsigned long long pk0 = 0, pk1 = 0;
      int tot = 0;
      // Unrolled: the first gap load of each position is independent of the others (most positions
      // stop there), so several are in flight at once.
#pragma unroll 4
      for (int i = i0; i < i1; ++i) {
        const int c = v8_kids(V.gap + i * R, rlim, H[i + 1] - G - theta);
        tot += c;
        if (i < 9) pk0 |= static_cast<unsigned long long>(c) << (7 * i);
        else pk1 |= static_cast<unsigned long long>(c) << (7 * (i - 9));
      }
      int inc = tot;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
      }
      const int wtot = __shfl_sync(0xffffffffu, inc, 31);
      const int done = round == 0 ? 1 : min(base + 32, hi);  // families processed so far
      if (count + (next + wtot - done) > cap || next + wtot > cap) {
        over = true;
        break;
      }
      int off = next + inc - tot;
      const bool big = tot > 4;
      if (!big) {
#pragma unroll 1
        for (int i = i0; i < i1; ++i) {
          const int c = static_cast<int>(i < 9 ? (pk0 >> (7 * i)) & 127u : (pk1 >> (7 * (i - 9))) & 127u);
#pragma unroll 1
          for (int r = 1; r <= c; ++r, ++off) {
            rg.G[off] = G + V.gap[i * R + r];
            rg.meta[off] = static_cast<uint32_t>(f) | (static_cast<uint32_t>(i + 1) << 8) |
                           (static_cast<uint32_t>(r) << 13) | (static_cast<uint32_t>(pi * (r + 1)) << 20);
          }
        }
      }
      unsigned bm = __ballot_sync(0xffffffffu, big);
      while (bm) {
        const int src = __ffs(static_cast<int>(bm)) - 1;
        bm &= bm - 1u;
        const long long sG = __shfl_sync(0xffffffffu, G, src);
        const unsigned long long s0 = __shfl_sync(0xffffffffu, pk0, src), s1 = __shfl_sync(0xffffffffu, pk1, src);
        const int sf = __shfl_sync(0xffffffffu, f, src), spi = __shfl_sync(0xffffffffu, pi, src);
        const int si0 = __shfl_sync(0xffffffffu, i0, src), si1 = __shfl_sync(0xffffffffu, i1, src);
        int soff = __shfl_sync(0xffffffffu, off, src);
#pragma unroll 1
        for (int i = si0; i < si1; ++i) {
          const int c = static_cast<int>(i < 9 ? (s0 >> (7 * i)) & 127u : (s1 >> (7 * (i - 9))) & 127u);
#pragma unroll 1
          for (int r = 1 + lane; r <= c; r += 32) {
            rg.G[soff + r - 1] = sG + V.gap[i * R + r];
            rg.meta[soff + r - 1] = static_cast<uint32_t>(sf) | (static_cast<uint32_t>(i + 1) << 8) |
                                    (static_cast<uint32_t>(r) << 13) | (static_cast<uint32_t>(spi * (r + 1)) << 20);
          }
          soff += c;
        }
      }
      next += wtot;
    }
    __syncwarp();
    lo = hi;
    hi = next;
  }
  *nfam = hi;
  if (!over && count >= M && lane == 0) atomicMin(done, w);
  return over ? cap + 1 : count;
}

// Block-uniform; P (<= kWarps, a power of two) warps probe. Returns the node count (root included) with N.par / rank / dep / prev filled (sibling
// lists not built), or -1: the older paths decide (every thread returns after a barrier).
__device__ int v8_select(Smem& S, Nodes& N, const float* lp, int L, int K, int M, int P) {
  V8Smem& V = *reinterpret_cast<V8Smem*>(reinterpret_cast<unsigned char*>(&S) + kV8Offset);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int R = min(K, M + 1);
  // Probe cap: enough for the <= ~1.5 M candidates a probe 2^(1/8) below the M-th score finds, small
  // enough that probes far below it stop early (they are the most expensive ones).
  const int cap = min(kV8Cap, (3 * M) / 2 + 32);
  if (tid == 0) {
    V.qneg = 0;
    V.bad = 0;
    V.done1 = kWarps;
    V.done2 = kWarps;
  }
  __syncthreads();
  // Pass 1: load and validate the rows (ranks < R), the scale q (max over q_x).
  float xs[kV8Slots], hs[kV8Slots];
  {
    int bad = 0, qmax = 0;
#pragma unroll
    for (int u = 0; u < kV8Slots; ++u) {
      const int idx = tid + u * kThreads;
      xs[u] = 0.f;
      hs[u] = 0.f;
      if (idx >= L * R) continue;
      const int d = idx / R, r = idx - d * R;
      const float* row = lp + static_cast<size_t>(d) * K;
      const float x = __ldg(row + r), prev = r > 0 ? __ldg(row + r - 1) : x;
      xs[u] = x;
      hs[u] = __ldg(row);
      const unsigned bits = __float_as_uint(x);
      const int e = static_cast<int>((bits >> 23) & 0xFFu);
      const unsigned mant = bits & 0x7FFFFFu;
      if (!(x <= 0.f) || x > prev || e == 0xFF || (e == 0 && mant != 0u)) bad = 1;
      if (e != 0 && e != 0xFF) {
        const int qx = 150 - e - (__ffs(static_cast<int>(mant | 0x800000u)) - 1);
        qmax = qx > qmax ? qx : qmax;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const int y = __shfl_xor_sync(0xffffffffu, qmax, o);
      qmax = y > qmax ? y : qmax;
    }
    if (lane == 0) atomicMin(&V.qneg, -qmax);
    if (bad) V.bad = 1;
    if (warp == 0) {
      double w = lane < L ? -static_cast<double>(__ldg(lp + static_cast<size_t>(lane) * K + (R - 1))) : 0.0;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) w += __shfl_xor_sync(0xffffffffu, w, o);
      if (lane == 0) V.vsum = w;
    }
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(100);
  const int q = -V.qneg;
  // Every partial sum must stay below 2^53 units of 2^-q (2x margin for the fp64 estimate of the sum).
  if (V.bad || !(V.vsum < ldexp(1.0, 52 - q))) {
    __syncthreads();
    return -1;
  }
  // Pass 2: fixed-point gaps and row heads.
#pragma unroll
  for (int u = 0; u < kV8Slots; ++u) {
    const int idx = tid + u * kThreads;
    if (idx >= L * R) continue;
    const int d = idx / R, r = idx - d * R;
    const long long h = v8_fix(hs[u], q);
    V.gap[idx] = h - v8_fix(xs[u], q);
    if (r == 0) V.hv[d] = h;
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(101);
  // Each warp: its own copy of H (prefix sums of the heads) and the worst score.
  long long* H = V.H[warp];
  long long h1, worst;
  {
    long long inc = lane < L ? V.hv[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const long long y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
    }
    if (lane < L) H[lane + 1] = inc;
    if (lane == 0) H[0] = 0;
    long long g = lane < L ? V.gap[lane * R + (R - 1)] : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) g += __shfl_xor_sync(0xffffffffu, g, o);
    h1 = __shfl_sync(0xffffffffu, inc, 0);
    worst = __shfl_sync(0xffffffffu, inc, L - 1) - g;
  }
  __syncwarp();
  // Stage 1: warps w < P probe theta_w = best - dub * 2^(-(P - 1 - w) * step). With K >= M the M
  // depth-1 ranks all score >= lp[0][M-1], so the distance from the best score to the M-th is at most
  // dub = gap[0][M-1] and the last probe is a valid bound; the grid then spans ~2 octaves below it
  // (step 2 / P octaves: on the bench's rows the M-th score sat 0.3-0.6 dub from the best, and the
  // count roughly doubled per quarter octave). Otherwise dub = the whole score range, step 16 / P.
  const bool dep1 = R - 1 >= M - 1;
  const long long dub = dep1 ? V.gap[M - 1] : h1 - worst;
  const double step = (dep1 ? 2.0 : 16.0) / P;
  if (warp < P) {
    const long long th = h1 - static_cast<long long>(static_cast<double>(dub) * exp2(-(P - 1 - warp) * step));
    int nf = 0;
    const int c = v8_probe(V, V.reg[warp], H, L, R, M, cap, th, &nf, warp, &V.done1);
    if (lane == 0) {
      V.cnt1[warp] = c;
      V.nfam1[warp] = nf;
      V.theta1[warp] = th;
    }
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(102);
  int jst = P;
  for (int j = P - 1; j >= 0; --j)
    if (V.cnt1[j] >= M) jst = j;
  int win, C;
  if (jst == P) {  // fewer than M candidates in all: every one of them is a node
    win = P - 1;
    C = V.cnt1[win];
  } else if (V.cnt1[jst] <= cap) {
    win = jst;
    C = V.cnt1[win];
  } else {
    // Stage 2: P thresholds splitting (theta_b, theta_a] linearly; the last one is theta_a itself.
    const long long ta = V.theta1[jst], tb = jst > 0 ? V.theta1[jst - 1] : h1 + 1;
    if (warp < P) {
      const long long th = tb - ((tb - ta) * (warp + 1)) / P;
      int nf = 0;
      const int c = v8_probe(V, V.reg[warp], H, L, R, M, cap, th, &nf, warp, &V.done2);
      if (lane == 0) {
        V.cnt2[warp] = c;
        V.nfam2[warp] = nf;
      }
    }
    __syncthreads();
    DDTREE_BUILD_TREE_MARK(103);
    win = P - 1;
    for (int j = P - 1; j >= 0; --j)
      if (V.cnt2[j] >= M) win = j;
    C = V.cnt2[win];
    if (C > cap) {
      if (tid == 0) DDTREE_BUILD_TREE_EVENT(v8_overflow);
      __syncthreads();
      return -1;
    }
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(v8_stage2);
  }
  const bool second = jst < P && V.cnt1[jst] > cap;
  V8Region& rg = V.reg[win];
  // Flatten the winner's families into candidates (score, family, length).
  if (warp == win) {
    const int nf = second ? V.nfam2[win] : V.nfam1[win];
    int base = 0;
#pragma unroll 1
    for (int f0 = 0; f0 < nf; f0 += 32) {
      const int f = f0 + lane;
      const int a = f < nf ? rg.a[f] : 1, b = f < nf ? rg.b[f] : 0;
      const int mem = b >= a ? b - a + 1 : 0;
      int inc = mem;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += y;
      }
      int off = base + inc - mem;
      if (f < nf) {
        rg.base[f] = static_cast<uint16_t>(off);
        const long long G = rg.G[f];
#pragma unroll 1
        for (int l = a; l <= b; ++l, ++off) {
          V.cs[off] = H[l] - G;
          V.cf[off] = static_cast<uint8_t>(f);
          V.cl[off] = static_cast<uint8_t>(l);
        }
      }
      base += __shfl_sync(0xffffffffu, inc, 31);
    }
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(104);
  // Order by counting: P threads per candidate (adjacent lanes, P * C <= kThreads), each over a 1/P
  // share of the others.
  const int n = min(C, M);
  {
    int lp2 = 0;
    while (lp2 < 4 && (C << (lp2 + 1)) <= kThreads) ++lp2;  // P = 2^lp2 <= 16
    const int P = 1 << lp2, Q = (C + P - 1) >> lp2;
    int tie_bad = 0;
#pragma unroll 1
    for (int it0 = 0; it0 < P * C; it0 += kThreads) {
      const int it = it0 + tid, i = it >> lp2, part = it & (P - 1);
      const bool act = it < P * C;
      int rank = 0, tie = 0;
      long long s = 0;
      int fi = 0, li = 0;
      if (act) {
        s = V.cs[i];
        fi = V.cf[i];
        li = V.cl[i];
        const int j1 = min(C, (part + 1) * Q);
#pragma unroll 4
        for (int j = part * Q; j < j1; ++j) {
          const long long sj = V.cs[j];
          if (sj > s) {
            ++rank;
          } else if (sj == s && j != i) {
            if (V.cf[j] != fi) tie = 1;
            else if (V.cl[j] < li) ++rank;
          }
        }
      }
      for (int o = 1; o < P; o <<= 1) {
        rank += __shfl_xor_sync(0xffffffffu, rank, o);
        tie |= __shfl_xor_sync(0xffffffffu, tie, o);
      }
      if (act && part == 0) {
        V.node_of[i] = static_cast<int16_t>(rank < n ? rank + 1 : -1);
        if (tie && rank < n) tie_bad = 1;
      }
    }
    if (tie_bad) V.bad = 1;
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(105);
  if (V.bad) {
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(v8_tie);
    __syncthreads();
    return -1;
  }
  // Node arrays: parent, rank of the last position, depth, previous sibling.
  int bad = 0;
#pragma unroll 1
  for (int i = tid; i < C; i += kThreads) {
    const int node = V.node_of[i];
    if (node < 0) continue;
    const int f = V.cf[i], l = V.cl[i], a = rg.a[f];
    const uint32_t mt = rg.meta[f];
    const int pf = static_cast<int>(mt & 0xFFu), p = static_cast<int>((mt >> 8) & 31u) - 1;
    const int rf = static_cast<int>((mt >> 13) & 127u);
    const bool leader = l == a && f != 0;
    int par = 0, prev = -1;
    if (!leader) {
      par = l > 1 ? V.node_of[i - 1] : 0;  // the previous member (the chain family's first: the root)
    } else {
      par = p > 0 ? V.node_of[rg.base[pf] + (p - rg.a[pf])] : 0;
      prev = rf >= 2 ? V.node_of[rg.base[f - 1]] : V.node_of[rg.base[pf] + (l - rg.a[pf])];
      if (prev < 0) bad = 1;
    }
    if (par < 0) bad = 1;
    N.par[node] = static_cast<int16_t>(par);
    N.rank[node] = static_cast<uint16_t>(leader ? rf : 0);
    N.dep[node] = static_cast<uint8_t>(l);
    N.prev[node] = static_cast<int16_t>(prev);
  }
  if (tid == 0) {
    N.par[0] = -1; N.rank[0] = 0; N.dep[0] = 0; N.prev[0] = -1;
  }
  if (bad) V.bad = 1;
  __syncthreads();
  if (V.bad) {
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(v8_inconsistent);
    __syncthreads();
    return -1;
  }
  if (tid == 0) DDTREE_BUILD_TREE_EVENT(v8);
  DDTREE_BUILD_TREE_MARK(106);
  return n + 1;
}

}  // namespace build_tree_k
}  // namespace ddtree
