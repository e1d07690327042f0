// build_tree, v11: one warp's batched threshold search with an exact final order, for requests with
// L <= 16 (any M, any K). Compiled only into build_tree_v11_kernel (build_tree.cuh); anything it cannot
// decide returns -1 and the request takes the v8auto choice in the same launch, as v10 does.
// bench/NOTES.md "### v11 (session 7, s7tree)" has the design and the cycle estimate, "### v11 measured
// (session 7" the H200 figures: correct everywhere, but slower than the default at every measured shape
// except M = 256, K = 1024, sharpness 8 (1.09x), so it is opt-in (DDTREE_BUILD_TREE_IMPL=v11). A round of
// the one-warp loop below costs ~2-2.8k cycles however few lanes work (issue-bound, as v9's pop), runs cost
// ~150 cycles per member on one lane, and ranking by counting is issue-bound above ~300 entries.
//
// Why a threshold search gives the heap's order. Every candidate except (0,) has one heap parent (its
// previous sibling if its rank is > 0, else its tree parent) and is scored from it exactly as the
// reference heap scores it (sibling fl(fl(s - x[r]) + x[r+1]), child fl(s + y[0]); fp64). When no heap
// edge increases the order (score desc, rank tuple asc) -- rows <= 0, sorted, no NaN, checked below, and
// the first sibling step checked per run -- the heap pops exactly the candidates sorted by that order, so
// its first M pops are the top M. Popping in ANY order every entry whose score is >= tau, pushing its heap
// children (those below tau wait in a deferred list D), makes the popped set P = every candidate >= tau
// (each one's heap ancestors are >= it, so none waits in D). Once |P| >= M, P holds the top M.
//
// Bands. tau is lowered in bands: band k pops the candidates in [tau_k, tau_{k-1}); each next tau comes
// from a log-linear fit of count(tau) over the last two bands, aimed a little under M, clamped to at most
// twice the last step (an overshoot in rows with many near-equal families, e.g. K = 64 at sharpness 1,
// would otherwise pop thousands). Since every band's scores lie below the previous band's, the final
// order is the band order, then (score desc, tuple asc) inside a band: rank by counting, band by band.
// Raise. Once E (popped + queued) holds >= M candidates, theta = a lower bound of its M-th best score
// (64-bin histogram, the lower edge of the crossing bin) is a valid lower bound of the true M-th score;
// tau rises to theta. Entries already queued below it are popped without expanding (never nodes: at least
// M entries are >= theta), so an overshooting band is cut short.
//
// Runs. Popping (d, r) with its next sibling pending pushes the whole run of siblings r+1.. that stay
// >= tau at once (one lane, serial, scores fl(t + x[j]) with t = fl(s - x[r])), the first one below tau
// going to D. The reference scores sibling j+1 as fl(fl(s_j - x[j]) + x[j+1]); that equals fl(t + x[j+1])
// when fl(s_j - x[j]) == t, which is checked for every run member whose successor is scored this way (a
// failure hands the request back: "inexact"). Without runs, a flat row is a chain of M sequential pops.
//
// Per round (warp 0): 32 queued entries at most, one per lane: child (one push), run (count, then write),
// one packed warp scan places every lane's E and D pushes. Bands end when the queue empties; tau moves
// and D is compacted (one pass). The other warps wait at a barrier; all 512 threads rank the entries and
// fill the node arrays; build_tree.cuh's output stage writes the outputs.
#pragma once

#include <cmath>

#include "ddtree/kernels/build_tree/common.cuh"
#include "ddtree/kernels/build_tree/v11_helpers.cuh"

namespace ddtree {
namespace build_tree_k {

// Returns the node count (root included) with N.par / rank / dep / prev filled, or -1 (hand back).
__device__ int v11_select(Smem& S, Nodes& N, const float* lp, int L, int K, int M) {
  V11Smem& V = v11_smem(S);
  const int tid = threadIdx.x;
  const int R = min(K, M);  // rank r needs r better siblings: ranks >= M are never among the top M
  const int rs = min(R, kV11Lps / L);
  if (tid == 0) {
    V.bad = 0;
    V.hand = 0;
    V.nb = 0;
    V.qt = 0;
  }
  __syncthreads();
  // Rows: checks (<= 0, sorted, no NaN) for ranks < R, the first rs ranks copied. 8 loads in flight.
  {
    int bad = 0;
    constexpr int kU = 4;
#pragma unroll 1
    for (int base = tid; base < L * R; base += kU * kThreads) {
      float x[kU], xp[kU];
      int dd[kU], rr[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int idx = base + u * kThreads;
        const bool in = idx < L * R;
        dd[u] = in ? idx / R : 0;
        rr[u] = in ? idx - dd[u] * R : 0;
        const float* q = lp + static_cast<size_t>(dd[u]) * K + rr[u];
        x[u] = in ? __ldg(q) : -1.f;
        xp[u] = in && rr[u] > 0 ? __ldg(q - 1) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int idx = base + u * kThreads;
        if (idx < L * R) {
          if (!(x[u] <= 0.f) || (rr[u] > 0 && x[u] > xp[u])) bad = 1;
          if (rr[u] < rs) V.lp[dd[u] * rs + rr[u]] = x[u];
        }
      }
    }
    if (bad) atomicAdd(&V.bad, 1);
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(130);
  if (V.bad) {
    if (tid == 0) DDTREE_BUILD_TREE_EVENT(v11_rows);
    return -1;
  }
  const V11Rows X{V.lp, lp, rs, K};
  const double first = static_cast<double>(X.at(0, 0));
  if (tid == 0) {
    N.par[0] = -1; N.rank[0] = 0; N.dep[0] = 0; N.prev[0] = -1;
  }
  if (first == kNegInf) return 1;  // no candidate at all (the reference pushes nothing)

  if (tid < 32) {
    const int lane = tid;
    if (lane == 0) {
      V.es[0] = first;
      V.em[0] = 0u | (1u << 11) | kV11Pend;
      V.el[0] = kV11Root | (kV11Root << 16);
      V.bstart[0] = 0;
    }
    __syncwarp();
    // Band schedule state (warp-uniform): the last two (tau, count) points, starting from (first, 1).
    // tau_0: the cheapest one-rank deviation over the depths (at least 2^-10) below the first score.
    double gap = lane < L && R > 1 ? static_cast<double>(X.at(lane, 0)) - static_cast<double>(X.at(lane, 1)) : 1.0;
    if (!(gap >= 0x1p-10)) gap = 0x1p-10;  // also -inf - -inf (NaN) and -inf gaps
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) gap = fmin(gap, __shfl_xor_sync(0xffffffffu, gap, o));
    const double g0 = gap;
    double tau = first - g0;
    double ta = first, ca = 1.0;   // previous band's point
    double band_hi = first;        // upper score bound of the current band
    int qh = 0, qt = 1, dn = 0, nb = 1, b0 = 0;
    int next_raise = M;
    bool raised = false;  // tau is a valid lower bound of the M-th score: this band is the last
    bool bad = false;
    unsigned why = 0u;  // hand-back reasons: 1 order, 2 inexact, 4 E cap, 8 D cap, 16 bands
    double dmax_l = kNegInf;  // lane's largest deferred score
    while (true) {
      // ---- one band: pop every queued entry; pushes >= tau are queued, the others deferred ----
      while (qh < qt) {
        const int i = qh + lane;
        const bool act = i < qt;
        const int run_cap = max(16, kV11RunBudget / min(32, qt - qh));
        double s = kNegInf;
        uint32_t m = 0u, lk = 0u;
        if (act) {
          s = V.es[i];
          m = V.em[i];
          lk = V.el[i];
        }
        const bool live = act && s >= tau;  // below tau after a raise: popped, never a node, not expanded
        const int d = v11_depth(m), r = v11_rank(m);
        // Child (d + 1, 0).
        bool hc = false;
        double cs = 0.0;
        if (live && d < L) {
          const float y = X.at(d, 0);
          hc = y != -__builtin_huge_valf();
          cs = __dadd_rn(s, static_cast<double>(y));
        }
        // Run of next siblings r + 1 .. r + c (>= tau), then the continuation r + c + 1 (deferred).
        // A run stops at the lane's cap too; that continuation is >= tau and is queued, not deferred.
        int c = 0;
        bool cont = false, cont_q = false;
        double t = 0.0, conts = 0.0;
        if (live && (m & kV11Pend)) {
          t = __dsub_rn(s, static_cast<double>(X.at(d - 1, r)));
          const int jcap = r + 1 + run_cap;
          int j = r + 1;
          bool done = false;
#pragma unroll 1
          while (!done) {  // 4 ranks per step, their loads issued together
            float xs[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) xs[u] = j + u < R ? X.at(d - 1, j + u) : -__builtin_huge_valf();
#pragma unroll
            for (int u = 0; u < 4; ++u) {
              if (done) continue;
              if (xs[u] == -__builtin_huge_valf()) {  // past R or a -inf rank: no further sibling
                done = true;
                continue;
              }
              const double sj = __dadd_rn(t, static_cast<double>(xs[u]));
              if (!(sj >= tau) || j == jcap) {
                cont = true;
                cont_q = sj >= tau;
                conts = sj;
                done = true;
                continue;
              }
              ++j;
            }
          }
          c = j - r - 1;
          if (cont && !cont_q && raised) cont = false;  // below a valid bound of the M-th score: useless
          // The first sibling step must not increase the score (fl(fl(s - x) + x') can exceed s by an ulp).
          if ((c > 0 || cont) && !(__dadd_rn(t, static_cast<double>(X.at(d - 1, r + 1))) <= s)) { bad = true; why |= 1u; }
        }
        const bool child_q = hc && cs >= tau;
        if (hc && !child_q && raised) hc = false;
        const unsigned ne = (child_q ? 1u : 0u) + static_cast<unsigned>(c) + (cont_q ? 1u : 0u);
        const unsigned nd = (hc && !child_q ? 1u : 0u) + (cont && !cont_q ? 1u : 0u);
        const unsigned v = ne | (nd << 16) | ((bad ? 1u : 0u) << 24);
        unsigned inc = v;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const unsigned y = __shfl_up_sync(0xffffffffu, inc, o);
          if (lane >= o) inc += y;
        }
        const unsigned tot = __shfl_sync(0xffffffffu, inc, 31);
        const unsigned excl = inc - v;
        const int tot_e = static_cast<int>(tot & 0xFFFFu), tot_d = static_cast<int>((tot >> 16) & 0xFFu);
        if ((tot >> 24) != 0u || qt + tot_e > kV11ECap || dn + tot_d > kV11DCap) {
          why |= (qt + tot_e > kV11ECap ? 4u : 0u) | (dn + tot_d > kV11DCap ? 8u : 0u);
          bad = true;
          break;
        }
        int eo = qt + static_cast<int>(excl & 0xFFFFu), dof = dn + static_cast<int>((excl >> 16) & 0xFFu);
        const uint32_t tp = lk & 0xFFFFu;
        if (hc) {
          const uint32_t cm = 0u | (static_cast<uint32_t>(d + 1) << 11) | kV11Pend;
          const uint32_t cl = static_cast<uint32_t>(i) | (static_cast<uint32_t>(i) << 16);
          if (child_q) {
            V.es[eo] = cs; V.em[eo] = cm; V.el[eo] = cl;
            ++eo;
          } else {
            V.ds[dof] = cs; V.dm[dof] = cm; V.dl[dof] = cl;
            ++dof;
            dmax_l = fmax(dmax_l, cs);
          }
        }
        uint32_t hp = static_cast<uint32_t>(i);
#pragma unroll 1
        for (int k0 = 1; k0 <= c; k0 += 4) {  // 4 members per step, their loads issued together
          float xk[4];
#pragma unroll
          for (int u = 0; u < 4; ++u) xk[u] = k0 + u <= c ? X.at(d - 1, r + k0 + u) : 0.f;
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int k = k0 + u;
            if (k > c) continue;
            const double sk = __dadd_rn(t, static_cast<double>(xk[u]));
            // Its successor (the next member or the continuation) is scored from t: exact only if this holds.
            if ((k < c || cont) && __dsub_rn(sk, static_cast<double>(xk[u])) != t) { bad = true; why |= 2u; }
            V.es[eo] = sk;
            V.em[eo] = static_cast<uint32_t>(r + k) | (static_cast<uint32_t>(d) << 11);
            V.el[eo] = tp | (hp << 16);
            hp = static_cast<uint32_t>(eo);
            ++eo;
          }
        }
        if (cont_q) {
          V.es[eo] = conts;
          V.em[eo] = static_cast<uint32_t>(r + c + 1) | (static_cast<uint32_t>(d) << 11) | kV11Pend;
          V.el[eo] = tp | (hp << 16);
        } else if (cont) {
          V.ds[dof] = conts;
          V.dm[dof] = static_cast<uint32_t>(r + c + 1) | (static_cast<uint32_t>(d) << 11) | kV11Pend;
          V.dl[dof] = tp | (hp << 16);
          dmax_l = fmax(dmax_l, conts);
        }
        qh = min(qh + 32, qt);
        if (lane == 0) DDTREE_BUILD_TREE_EVENT(v11_round);
        DDTREE_BUILD_TREE_MARK(134);  // a round (the profile tool records thread 0 only)
        qt += tot_e;
        dn += tot_d;
        __syncwarp();  // the new entries are visible to every lane at the next round
        if (qt >= next_raise && b0 < M) {  // E holds >= M candidates: tau may rise to a bound of the M-th
          const double theta = v11_raise(V, b0, qt, M - b0, tau, band_hi);
          if (lane == 0) DDTREE_BUILD_TREE_EVENT(v11_raise);
          raised = raised || theta > tau;
          tau = theta;
          next_raise = qt + max(M / 4, 32);
          DDTREE_BUILD_TREE_MARK(136);
        }
      }
      bad = __any_sync(0xffffffffu, bad);
      if (bad || qt >= M || dn == 0) break;
      if (nb == kV11MaxBands) {
        why |= 16u;
        bad = true;
        break;
      }
      // ---- next band: tau from the last two (tau, count) points ----
      double dmax = dmax_l;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) dmax = fmax(dmax, __shfl_xor_sync(0xffffffffu, dmax, o));
      const double cb = static_cast<double>(qt), prev_step = ta - tau;
      const double target = cb >= 0.75 * M ? static_cast<double>(M) : 0.85 * M;
      // Steps within [0.25, 2] x the last one (no growth yet: 2x while fewer than M / 8 are popped). A
      // wider clamp (4x / 8x while few are popped) overshot more in the emulator (bench rows: 11.5k / 8.7k
      // entries over the 15 rows, two M = 1024 hand-backs at 8x) than this one (9.8k, none).
      double step = cb * 8.0 < M ? 2.0 * prev_step : prev_step;
      if (cb > ca) {
        const double rate = log(cb / ca) / prev_step;
        step = fmin(fmax(log(target / cb) / rate, 0.25 * prev_step), 2.0 * prev_step);
      }
      ta = tau;
      ca = cb;
      band_hi = tau;
      tau = fmin(tau - step, dmax);
      if (lane == 0) {
        V.bstart[nb] = qt;
        DDTREE_BUILD_TREE_EVENT(v11_band);
      }
      b0 = qt;
      ++nb;
      // Compaction of D: entries >= tau are queued (the new band), the others stay.
      int keep = 0;
      dmax_l = kNegInf;
#pragma unroll 1
      for (int base = 0; base < dn; base += 32) {
        const int j = base + lane;
        const bool in = j < dn;
        double s = 0.0;
        uint32_t dm = 0u, dl = 0u;
        if (in) {
          s = V.ds[j];
          dm = V.dm[j];
          dl = V.dl[j];
        }
        __syncwarp();  // every lane has read its entry before any lane writes this chunk
        const bool rel = in && s >= tau;
        const unsigned be = __ballot_sync(0xffffffffu, rel), bk = __ballot_sync(0xffffffffu, in && !rel);
        const int ne2 = popc32(be);
        if (qt + ne2 > kV11ECap) {
          why |= 4u;
          bad = true;
          break;
        }
        if (rel) {
          const int o = qt + popc32(be & v11_lanes_below(lane));
          V.es[o] = s; V.em[o] = dm; V.el[o] = dl;
        } else if (in) {
          const int o = keep + popc32(bk & v11_lanes_below(lane));
          V.ds[o] = s; V.dm[o] = dm; V.dl[o] = dl;
          dmax_l = fmax(dmax_l, s);
        }
        qt += ne2;
        keep += popc32(bk);
        __syncwarp();
      }
      dn = keep;
      DDTREE_BUILD_TREE_MARK(135);  // a band change (fit + compaction)
      if (bad) break;
    }
    unsigned whyall = 0u;
#pragma unroll
    for (int bit = 0; bit < 5; ++bit) whyall |= __ballot_sync(0xffffffffu, (why >> bit) & 1u) ? 1u << bit : 0u;
    if (lane == 0) {
      V.bstart[nb] = qt;
      V.nb = nb;
      V.qt = qt;
      V.hand = bad ? static_cast<int>(whyall | 32u) : 0;
    }
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(131);
  if (const int hand = V.hand) {
    if (tid == 0) {
      DDTREE_BUILD_TREE_EVENT(v11_handback);
      if (hand & 1) DDTREE_BUILD_TREE_EVENT(v11_order);
      if (hand & 2) DDTREE_BUILD_TREE_EVENT(v11_inexact);
      if (hand & 4) DDTREE_BUILD_TREE_EVENT(v11_ecap);
      if (hand & 8) DDTREE_BUILD_TREE_EVENT(v11_dcap);
      if (hand & 16) DDTREE_BUILD_TREE_EVENT(v11_bands);
    }
    return -1;
  }
  // ---- order: band by band, rank by counting inside a band; node index = 1 + position ----
  // G threads per entry (a power of two <= 32, G * entries <= 512 where possible), each a strided part of
  // the band; the parts add up by shuffles. Exact ties (rare) walk the rank tuples in a second loop.
  const int qt = V.qt;
  int G = 1;
  while (G < 32 && 2 * G * qt <= kThreads) G *= 2;
#pragma unroll 1
  for (int base = 0; base < qt * G; base += kThreads) {  // uniform trip count: whole warps shuffle
    const int idx = base + tid, i = idx / G, part = idx - i * G;
    const bool valid = i < qt;
    int rank = 0, ties = 0, lo = 0, hi = 0;
    double s = 0.0;
    if (valid) {
      int b = 0;
      while (V.bstart[b + 1] <= i) ++b;
      lo = V.bstart[b];
      hi = V.bstart[b + 1];
      s = V.es[i];
#pragma unroll 8
      for (int j = lo + part; j < hi; j += G) {
        const double sj = V.es[j];
        rank += sj > s ? 1 : 0;
        ties += sj == s ? 1 : 0;
      }
    }
    for (int o = 1; o < G; o <<= 1) {
      rank += __shfl_xor_sync(0xffffffffu, rank, o);
      ties += __shfl_xor_sync(0xffffffffu, ties, o);
    }
    if (valid && part == 0) {
      if (ties > 1) {
#pragma unroll 1
        for (int j = lo; j < hi; ++j)
          if (V.es[j] == s && j != i && v11_tuple_less(V, j, i)) ++rank;
      }
      const int pos = lo + rank;
      V.node[i] = static_cast<int16_t>(pos < M ? pos + 1 : 0);
    }
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(132);
#pragma unroll 1
  for (int i = tid; i < qt; i += kThreads) {
    const int ni = V.node[i];
    if (ni == 0) continue;
    const uint32_t m = V.em[i], lk = V.el[i];
    const uint32_t tp = lk & 0xFFFFu, hp = lk >> 16;
    const int r = v11_rank(m);
    N.par[ni] = static_cast<int16_t>(tp == kV11Root ? 0 : V.node[tp]);
    N.rank[ni] = static_cast<uint16_t>(r);
    N.dep[ni] = static_cast<uint8_t>(v11_depth(m));
    N.prev[ni] = static_cast<int16_t>(r > 0 ? V.node[hp] : -1);
  }
  if (tid == 0) {
    DDTREE_BUILD_TREE_EVENT(v11);
    for (int i = 0; i < qt; ++i) DDTREE_BUILD_TREE_EVENT(v11_entries);  // test hook (no code on the GPU)
  }
  return 1 + min(M, qt);
}

}  // namespace build_tree_k
}  // namespace ddtree
