// build_tree kernel, v10 large-M path (64 < M <= 1024, L <= 16): exact integer scores (v8's), a threshold
// from the closed-form count of the one-deviation candidates, one block-wide enumeration of the families
// above it, a histogram select of the M-th score, one bitonic sort of 64-bit keys. bench/NOTES.md
// "### v10 (session 6)" has the design, the cycle estimate and the measurements.
//
// Scores are v8's integers (v8.cuh says why fp64 sums are exact once the rows pass its checks): a
// candidate of length l with deviation set D scores H[l] - G(D), H = prefix sums of the row heads, G =
// sum of D's gaps. All arithmetic here is int64 in units of 2^-q.
//
// Threshold. count1(theta) = the candidates with at most one deviation scoring >= theta (ranks r with
// r + 1 <= M) = #{l: H[l] >= theta} + sum over depths j <= l of #{r >= 1: gap_j(r) <= H[l] - theta}: 136
// binary searches at L = 16, so 16 warps probe 16 thresholds at once with no block barrier inside. A theta
// with count1 >= M is a valid lower bound of the M-th score (count >= count1). 2-3 rounds (a log grid, then
// linear splits of the bracket) find the highest such grid point.
//
// Enumeration. Families D with leader >= theta, round k = families with k deviations: per family the
// member range [a, b] (b: one search over H); per (family, position j) item the children D + (j, r), a
// prefix of ranks (gallop + bisection in the row); two block scans place items and children, so no
// thread walks a family's positions or writes its children serially (v7's rounds were as slow as their
// longest walk). Children of one item get consecutive family indices: the rank r - 1 sibling of a
// leader is the family just before it.
//
// Order. Candidates (family, length) are flattened; a 1024-bin histogram of (best - score) finds the bin
// holding the M-th score; the candidates up to that bin (M <= C2 <= 2048) are ordered as 64-bit keys
// (best - score) << 12 | candidate: by counting up to 384 of them, else by a bitonic sort in registers
// (shuffles below stride 32, shared memory up to 256, registers above). Equal scores within the first
// M + 1 keep that order only between siblings; any other tie (the heap would compare rank tuples) sends
// the request to the older paths, as does every cap overflow and every row v8 would refuse.
//
// Measured on the H200 (bench/NOTES.md "### v10 measured"): slower than auto at most shapes (the bound and
// the enumeration cost 2-10x their estimates), so it is opt-in, not the default.
#pragma once

#include <cmath>

#include "ddtree/kernels/build_tree/common.cuh"
#include "ddtree/kernels/build_tree/v8.cuh"
#include "ddtree/kernels/build_tree/v10_helpers.cuh"

namespace ddtree {
namespace build_tree_k {

// Block-uniform. Returns the node count (root included) with N filled and the sibling lists built, or -1:
// the older paths decide (every thread returns after a barrier).
__device__ int v10_select(Smem& S, Nodes& N, const float* lp, const int32_t* ids, int L, int K, int M, int n_max) {
  V10Smem& V = *reinterpret_cast<V10Smem*>(&S);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int R = min(K, M + 1);       // ranks validated (a popped rank < M, its sibling <= M)
  const int Rm = min(K, M);          // candidate ranks
  const int rs = min(R, kV10Lps / L);
  const V10Rows rw{V.lps, lp, rs, K};
  static_assert(kV10MaxL <= 16, "count1 maps a depth to each half-warp lane");
  if (tid == 0) {
    V.qneg = 0;
    V.bad = 0;
    V.cnt = 0;
    V.c1 = 0;
    V.kept = 0;
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(120);
  // Stage 1: load and validate the rows (v8's checks), the scale q, the heads.
  {
    int bad = 0, qmax = 0;
    // 8 loads per thread in flight; the previous rank comes from the lane before (one extra load for
    // lane 0 of each warp), so each element is loaded once.
    constexpr int kU = 8;
#pragma unroll 1
    for (int base0 = 0; base0 < L * R; base0 += kU * kThreads) {  // block-uniform trip count (shuffles)
      const int base = base0 + tid;
      float x[kU], y[kU];
      int dd[kU], rr[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int idx = base + u * kThreads;
        dd[u] = idx / R;
        rr[u] = idx - dd[u] * R;
        const bool in = idx < L * R;
        const float* g = lp + static_cast<size_t>(dd[u]) * K + rr[u];
        x[u] = in ? __ldg(g) : -1.f;
        y[u] = in && rr[u] > 0 && lane == 0 ? __ldg(g - 1) : x[u];
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const float up = __shfl_up_sync(0xffffffffu, x[u], 1);
        if (lane > 0 && rr[u] > 0) y[u] = up;  // idx - 1 is the lane before's element, same row
        if (base + u * kThreads >= L * R) continue;
        const unsigned bits = __float_as_uint(x[u]);
        const int e = static_cast<int>((bits >> 23) & 0xFFu);
        const unsigned mant = bits & 0x7FFFFFu;
        // v8's rows plus strictly negative heads (a zero head ties two members of one family)
        if (!(x[u] <= 0.f) || x[u] > y[u] || e == 0xFF || (e == 0 && mant != 0u) || (rr[u] == 0 && !(x[u] < 0.f)))
          bad = 1;
        if (e != 0 && e != 0xFF) {
          const int qx = 150 - e - (__ffs(static_cast<int>(mant | 0x800000u)) - 1);
          qmax = qx > qmax ? qx : qmax;
        }
        if (rr[u] < rs) V.lps[dd[u] * rs + rr[u]] = x[u];
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
  const int q = -V.qneg;
  const double sc = ldexp(1.0, -q);
  if (V.bad || !(V.vsum < ldexp(1.0, 52 - q))) {
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(v10_rows);
    __syncthreads();
    return -1;
  }
  // Heads and their prefix sums (warp 0), the worst candidate score.
  if (warp == 0) {
    const long long h = lane < L ? v8_fix(rw.at(lane, 0), q) : 0;
    long long inc = h;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const long long y = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += y;
    }
    if (lane < L) {
      V.hv[lane] = h;
      V.H[lane + 1] = inc;
    }
    if (lane == 0) V.H[0] = 0;
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(121);
  // Stage 2: the threshold. Round 1: a log grid below the best score over dub (K >= M: the M depth-1
  // ranks bound the M-th score by gap_0(M - 1); else the whole range), rounds 2-3 split the bracket.
  const long long best = V.H[1];
  long long dub;
  const bool dep1 = Rm >= M;
  if (dep1) {
    dub = V.hv[0] - v8_fix(rw.at(0, M - 1), q);
  } else {
    long long worst = 0;
    for (int d = 0; d < L; ++d) worst += v8_fix(rw.at(d, Rm - 1), q);
    dub = best - worst;
  }
  if (dub < 1) dub = 1;
  long long lo_t, hi_t;  // count1(lo_t) >= M, count1(hi_t) < M (hi_t = best + 1 if none above)
  {
    const double step = dep1 ? 0.5 : 1.0;
    const long long th = best - static_cast<long long>(static_cast<double>(dub) * exp2(-(kWarps - 1 - warp) * step));
    const int c = v10_count1(V, rw, L, Rm, warp == kWarps - 1 ? best - dub : th, sc);
    if (lane == 0) {
      V.pth[warp] = warp == kWarps - 1 ? best - dub : th;
      V.pcnt[warp] = c;
    }
    __syncthreads();
    int w0 = kWarps;
    for (int w = kWarps - 1; w >= 0; --w)
      if (V.pcnt[w] >= M) w0 = w;
    if (w0 == kWarps) {  // fewer than M one-deviation candidates above the lowest probe
      if (tid == 0) DDTREE_BUILD_TREE_EVENT(v10_count1);
      __syncthreads();
      return -1;
    }
    lo_t = V.pth[w0];
    hi_t = w0 > 0 ? V.pth[w0 - 1] : best + 1;
    __syncthreads();
  }
  const int rounds = dep1 ? 1 : 2;
  for (int rd = 0; rd < rounds && hi_t - lo_t > 1; ++rd) {
    const long long th = lo_t + (hi_t - lo_t) * (warp + 1) / (kWarps + 1);
    const int c = v10_count1(V, rw, L, Rm, th, sc);
    if (lane == 0) {
      V.pth[warp] = th;
      V.pcnt[warp] = c;
    }
    __syncthreads();
    for (int w = 0; w < kWarps; ++w) {
      if (V.pcnt[w] >= M) {
        if (V.pth[w] > lo_t) lo_t = V.pth[w];
      } else if (V.pth[w] < hi_t) {
        hi_t = V.pth[w];
      }
    }
    __syncthreads();
  }
  const long long theta = lo_t;
  DDTREE_BUILD_TREE_MARK(122);
  // Stage 3: families above theta, one round per deviation count.
  if (tid == 0) {
    V.G[0] = 0;
    V.meta[0] = 0;
    V.pi[0] = 1;
  }
  __syncthreads();
  int flo = 0, fhi = 1;
  while (true) {
    // (a) member ranges and item counts
    unsigned mem = 0;
#pragma unroll 1
    for (int f = flo + tid; f < fhi; f += kThreads) {
      const long long G = V.G[f];
      const int p = static_cast<int>((V.meta[f] >> 11) & 31u);
      const int a = p < 1 ? 1 : p;
      const int b = v8_dmax(V.H, L, theta + G);
      V.fa[f] = static_cast<uint8_t>(a);
      V.fb[f] = static_cast<uint8_t>(b);
      mem += b >= a ? static_cast<unsigned>(b - a + 1) : 0u;
      const int jl = min(b + 1, L);
      V.foff[f] = 2 * V.pi[f] <= M && jl > p ? static_cast<uint32_t>(jl - p) : 0u;
    }
    mem = static_cast<unsigned>(warp_sum_i(static_cast<int>(mem)));
    if (lane == 0 && mem) atomicAdd(&V.c1, static_cast<int>(mem));
    __syncthreads();
    const uint32_t T = v10_scan(S, V.foff, flo, fhi);
    if (T > kV10Items) {
      if (tid == 0) V.bad = 1;
      break;
    }
    if (T == 0) break;
    // each family marks its items (<= 16), so that (b) and (c) need no search for it
#pragma unroll 1
    for (int f = flo + tid; f < fhi; f += kThreads) {
      const uint32_t e = f + 1 < fhi ? V.foff[f + 1] : T;
      for (uint32_t t = V.foff[f]; t < e; ++t) V.itemfam[t] = static_cast<uint16_t>(f);
    }
    __syncthreads();
    // (b) children per item: position j = p + 1 + (t - off)
#pragma unroll 1
    for (int t = tid; t < static_cast<int>(T); t += kThreads) {
      const int f = V.itemfam[t];
      const int p = static_cast<int>((V.meta[f] >> 11) & 31u);
      const int j = p + 1 + (t - static_cast<int>(V.foff[f]));
      const int rmax = min(Rm - 1, M / V.pi[f] - 1);
      V.items[t] = static_cast<uint32_t>(v10_kids(rw, j - 1, rmax, theta + V.G[f] - V.H[j] + V.hv[j - 1], sc));
    }
    __syncthreads();
    const uint32_t nk = v10_scan(S, V.items, 0, static_cast<int>(T));
    if (fhi + static_cast<int>(nk) > kV10FC) {
      if (tid == 0) V.bad = 1;
      break;
    }
    if (nk == 0) break;
    // (c) write the children
#pragma unroll 1
    for (int c = tid; c < static_cast<int>(nk); c += kThreads) {
      const int t = v10_owner(V.items, 0, static_cast<int>(T), static_cast<uint32_t>(c));
      const int f = V.itemfam[t];
      const int p = static_cast<int>((V.meta[f] >> 11) & 31u);
      const int j = p + 1 + (t - static_cast<int>(V.foff[f]));
      const int r = c - static_cast<int>(V.items[t]) + 1;
      const int nf = fhi + c;
      V.G[nf] = V.G[f] + (V.hv[j - 1] - v8_fix(rw.at(j - 1, r), q));
      V.meta[nf] = static_cast<uint32_t>(f) | (static_cast<uint32_t>(j) << 11) | (static_cast<uint32_t>(r) << 16);
      V.pi[nf] = static_cast<uint16_t>(V.pi[f] * (r + 1));
    }
    __syncthreads();
    flo = fhi;
    fhi += static_cast<int>(nk);
  }
  __syncthreads();
  const int nfam = fhi;
  const int C1 = V.c1;
  if (V.bad || C1 > kV10CC || C1 < M) {
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(v10_cap);
    __syncthreads();
    return -1;
  }
  DDTREE_BUILD_TREE_MARK(123);
  // Stage 4: flatten (candidate bases), histogram of best - score.
#pragma unroll 1
  for (int f = tid; f < nfam; f += kThreads) V.foff[f] = static_cast<uint32_t>(V.fb[f] - V.fa[f] + 1);
#pragma unroll 1
  for (int i = tid; i < kV10Bins; i += kThreads) V.hist[i] = 0u;
  __syncthreads();
  v10_scan(S, V.foff, 0, nfam);
  const long long span = best - theta;  // >= every candidate's best - score
  int shift = 0;
  while ((span >> shift) >= kV10Bins) ++shift;
  // A thread per family writes its (<= 16) members: no search for the owner of a candidate.
#pragma unroll 1
  for (int f = tid; f < nfam; f += kThreads) {
    const int a = V.fa[f], b = V.fb[f], c0 = static_cast<int>(V.foff[f]) - a;
    const long long G = V.G[f];
#pragma unroll 1
    for (int l = a; l <= b; ++l) {
      V.c.cf[c0 + l] = static_cast<uint16_t>(f);
      V.c.cl[c0 + l] = static_cast<uint8_t>(l);
      V.c.node_of[c0 + l] = -1;
      atomicAdd(&V.hist[(best - (V.H[l] - G)) >> shift], 1u);
    }
  }
  __syncthreads();
  // The bin holding the M-th score: each thread owns two bins.
  int cut;
  {
    const int b0 = 2 * tid;
    const unsigned h0 = V.hist[b0], h1 = V.hist[b0 + 1];
    unsigned total;
    const unsigned before = block_exclusive_scan(S, h0 + h1, &total);
    if (tid == 0) V.cnt = kV10Bins;
    __syncthreads();
    if (before < static_cast<unsigned>(M) && before + h0 + h1 >= static_cast<unsigned>(M)) {
      const bool first = before + h0 >= static_cast<unsigned>(M);
      V.cnt = first ? b0 : b0 + 1;
      V.c1 = static_cast<int>(first ? before + h0 : before + h0 + h1);  // C2: candidates up to that bin
    }
    __syncthreads();
    cut = V.cnt;
  }
  const int C2 = V.c1;
  if (C2 > kV10Sort) {
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(v10_sort_cap);
    __syncthreads();
    return -1;
  }
  DDTREE_BUILD_TREE_MARK(124);
  // Stage 5: keep the candidates up to the cut bin (any order), sort their keys.
#pragma unroll 1
  for (int base = 0; base < C1; base += kThreads) {
    const int c = base + tid;
    uint64_t key = 0;
    bool keep = false;
    if (c < C1) {
      const int f = V.c.cf[c], l = V.c.cl[c];
      const long long dist = best - (V.H[l] - V.G[f]);
      keep = (dist >> shift) <= cut;
      key = (static_cast<uint64_t>(dist) << 12) | static_cast<uint64_t>(c);
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, keep);
    int off = 0;
    if (lane == 0 && ballot) off = atomicAdd(&V.kept, popc32(ballot));
    off = __shfl_sync(0xffffffffu, off, 0);
    if (keep) V.c.sk[off + popc32(ballot & ((1u << lane) - 1u))] = key;
  }
  __syncthreads();
  int P = kThreads;
  while (P < C2) P <<= 1;
  if (C2 <= kV10CountSort) {
    // Rank by counting (the keys are distinct: the candidate index is part of each): only the warps that
    // hold a key loop, and every load is a broadcast. Cheaper than the 45-stage network for small C2.
    const uint64_t mine = tid < C2 ? V.c.sk[tid] : 0ull;
    int rank = 0;
    if (tid < ((C2 + 31) & ~31)) {
#pragma unroll 8
      for (int j = 0; j < C2; ++j) rank += V.c.sk[j] < mine ? 1 : 0;
    }
    __syncthreads();
    if (tid < C2) V.c.sk[rank] = mine;
  } else {
    if (P == kThreads) {
      uint64_t x[1];
      x[0] = tid < C2 ? V.c.sk[tid] : ~0ull;
      v10_sort<1>(x, V.xbuf);
      V.c.sk[tid] = x[0];
    } else if (P == 2 * kThreads) {
      uint64_t x[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) x[e] = e * kThreads + tid < C2 ? V.c.sk[e * kThreads + tid] : ~0ull;
      v10_sort<2>(x, V.xbuf);
#pragma unroll
      for (int e = 0; e < 2; ++e) V.c.sk[e * kThreads + tid] = x[e];
    } else {
      uint64_t x[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = e * kThreads + tid < C2 ? V.c.sk[e * kThreads + tid] : ~0ull;
      v10_sort<4>(x, V.xbuf);
#pragma unroll
      for (int e = 0; e < 4; ++e) V.c.sk[e * kThreads + tid] = x[e];
    }
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(125);
  // Stage 6: node indices. An exact score tie within the first M + 1 is ordered right by the key's
  // candidate index only between siblings (ranks ascend with the index); any other goes back to the
  // older paths.
  {
    int bad = 0;
#pragma unroll 1
    for (int i = tid; i < M; i += kThreads) {
      const uint64_t k = V.c.sk[i];
      if (i + 1 < C2 && (V.c.sk[i + 1] >> 12) == (k >> 12) &&
          v10_parent_cand(V, static_cast<int>(k & 0xFFFu)) != v10_parent_cand(V, static_cast<int>(V.c.sk[i + 1] & 0xFFFu)))
        bad = 1;
      V.c.node_of[k & 0xFFFu] = static_cast<int16_t>(i + 1);
    }
    if (bad) V.bad = 1;
  }
  // The rows are dead: their storage holds N from here.
#pragma unroll 1
  for (int i = tid; i < n_max; i += kThreads) {
    N.fc[i] = -1;
    N.ns[i] = -1;
  }
  __syncthreads();
  if (V.bad) {
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(v10_tie);
    __syncthreads();
    return -1;
  }
  {
    int bad = 0;
#pragma unroll 1
    for (int i = tid; i < M; i += kThreads) {
      const int c = static_cast<int>(V.c.sk[i] & 0xFFFu);
      const int f = V.c.cf[c], l = V.c.cl[c];
      const uint32_t mt = V.meta[f];
      const int pf = static_cast<int>(mt & 0x7FFu), p = static_cast<int>((mt >> 11) & 31u);
      const int rank = f != 0 && l == p ? static_cast<int>(mt >> 16) : 0;
      int par, prev = -1;
      if (rank == 0) {
        par = l == 1 ? 0 : V.c.node_of[c - 1];  // the member one shorter (chain family: the root at l = 1)
      } else {
        par = l == 1 ? 0 : V.c.node_of[V.foff[pf] + (l - 1) - V.fa[pf]];
        prev = rank >= 2 ? V.c.node_of[V.foff[f - 1]] : V.c.node_of[V.foff[pf] + l - V.fa[pf]];
      }
      if (par < 0 || (rank > 0 && prev < 0)) bad = 1;
      const int n = i + 1;
      N.par[n] = static_cast<int16_t>(par);
      N.rank[n] = static_cast<uint16_t>(rank);
      N.dep[n] = static_cast<uint8_t>(l);
      N.prev[n] = static_cast<int16_t>(prev);
      N.tok[n] = __ldg(ids + static_cast<size_t>(l - 1) * K + rank);
      if (par >= 0 && (rank == 0 || prev >= 0)) {
        if (rank == 0) N.fc[par] = static_cast<int16_t>(n);
        else N.ns[prev] = static_cast<int16_t>(n);
      }
    }
    if (bad) V.bad = 1;
    if (tid == 0) {
      N.par[0] = -1;
      N.rank[0] = 0;
      N.dep[0] = 0;
      N.prev[0] = -1;
    }
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(126);
  const int failed = V.bad;
  if (tid == 0) {
    if (failed) DDTREE_BUILD_TREE_EVENT(v10_links);
    else DDTREE_BUILD_TREE_EVENT(v10);
  }
  __syncthreads();
  return failed ? -1 : M + 1;
}

}  // namespace build_tree_k
}  // namespace ddtree
