// build_tree kernel, part 3 of 5: sorting the survivors into heap pop order (bitonic, packed and merge
// sorts, tie-run repair).
// The algorithm is described in ../build_tree.cuh.
#pragma once

#include "ddtree/kernels/build_tree/select.cuh"

namespace ddtree {
namespace build_tree_k {

// ---- sorting the survivors ----------------------------------------------------------------------

__device__ __forceinline__ bool sorts_before(const Smem& S, int a, int b) {
  const unsigned long long ka = ~ord_asc(S.score[a]), kb = ~ord_asc(S.score[b]);
  if (ka != kb) return ka < kb;
  return S.lex[a] < S.lex[b];
}

// Sorts S.sidx[0, P) (P a power of two). Stages whose compare distance j is <= 32 stay inside one
// warp's 64-element segment (pair q of warp w touches [64 * (q / 32), +64)), so they need only
// __syncwarp; a block barrier is paid only around stages with j >= 64. Ends with a block barrier.
__device__ DDTREE_BT_OUTLINE void bitonic_sort(Smem& S, int P) {
  for (int k = 2; k <= P; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      #pragma unroll 1
      for (int q = threadIdx.x; q < (P >> 1); q += kThreads) {
        const int i = ((q & ~(j - 1)) << 1) | (q & (j - 1));
        const int ixj = i | j;
        const int a = S.sidx[i], c = S.sidx[ixj];
        bool a_after_c;
        if (a == 0xFFFF) a_after_c = c != 0xFFFF;
        else if (c == 0xFFFF) a_after_c = false;
        else a_after_c = sorts_before(S, c, a);
        const bool up = (i & k) == 0;
        const bool c_after_a = !a_after_c && a != c;
        if (up ? a_after_c : c_after_a) { S.sidx[i] = static_cast<uint16_t>(c); S.sidx[ixj] = static_cast<uint16_t>(a); }
      }
      const int next_j = j > 1 ? j >> 1 : k;  // the next k starts with j = k
      if (j >= 64 || next_j >= 64) __syncthreads(); else __syncwarp();
    }
  }
  __syncthreads();
}

// Register bitonic sort of the survivors for n_live <= kThreads * E: element i lives in thread
// i % kThreads, slot i / kThreads. Compare distances j < 32 exchange through warp shuffles, j >= kThreads
// inside a thread's registers, and only 32 <= j < kThreads through shared memory, where just the pool
// index travels (the keys are re-read from the pool, which the sort never writes). Input: S.sidx[0,
// n_live) pool indices in any order; output: the same slots sorted by (score desc, tuple code asc).
__device__ __forceinline__ bool key_less(unsigned long long ah, unsigned long long al, unsigned long long bh,
                                         unsigned long long bl) {
  return ah < bh || (ah == bh && al < bl);
}

template <int E>
__device__ __noinline__ void sort_survivors(Smem& S, int n_live) {  // own register budget: keys stay in registers
  constexpr int NE = kThreads * E;
  const int tid = threadIdx.x;
  unsigned long long kh[E], kl[E];
  int ix[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = tid + kThreads * e;
    ix[e] = i < n_live ? static_cast<int>(S.sidx[i]) : 0xFFFF;
    kh[e] = ix[e] != 0xFFFF ? ~ord_asc(S.score[ix[e]]) : ~0ull;
    kl[e] = ix[e] != 0xFFFF ? S.lex[ix[e]] : ~0ull;
  }
  __syncthreads();  // S.sidx now serves as the exchange buffer
  for (int k = 2; k <= NE; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      if (j >= kThreads) {
        const int je = j / kThreads;
#pragma unroll
        for (int e = 0; e < E; ++e) {
#pragma unroll
          for (int f = e + 1; f < E; ++f) {
            if (f == (e ^ je)) {
              const bool asc = ((tid + kThreads * e) & k) == 0;  // e is the lower index of the pair
              const bool swap = asc ? key_less(kh[f], kl[f], kh[e], kl[e]) : key_less(kh[e], kl[e], kh[f], kl[f]);
              if (swap) {
                const unsigned long long th = kh[e], tl = kl[e];
                const int ti = ix[e];
                kh[e] = kh[f]; kl[e] = kl[f]; ix[e] = ix[f];
                kh[f] = th; kl[f] = tl; ix[f] = ti;
              }
            }
          }
        }
      } else if (j >= 32) {
#pragma unroll
        for (int e = 0; e < E; ++e) S.sidx[tid + kThreads * e] = static_cast<uint16_t>(ix[e]);
        __syncthreads();
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int i = tid + kThreads * e;
          const int pix = S.sidx[i ^ j];
          const unsigned long long ph = pix != 0xFFFF ? ~ord_asc(S.score[pix]) : ~0ull;
          const unsigned long long pl = pix != 0xFFFF ? S.lex[pix] : ~0ull;
          const bool keep_min = ((i & j) == 0) == ((i & k) == 0);
          const bool take = keep_min ? key_less(ph, pl, kh[e], kl[e]) : key_less(kh[e], kl[e], ph, pl);
          if (take) { kh[e] = ph; kl[e] = pl; ix[e] = pix; }
        }
        __syncthreads();
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int i = tid + kThreads * e;
          const unsigned long long ph = __shfl_xor_sync(0xffffffffu, kh[e], j);
          const unsigned long long pl = __shfl_xor_sync(0xffffffffu, kl[e], j);
          const int pix = __shfl_xor_sync(0xffffffffu, ix[e], j);
          const bool keep_min = ((i & j) == 0) == ((i & k) == 0);
          const bool take = keep_min ? key_less(ph, pl, kh[e], kl[e]) : key_less(kh[e], kl[e], ph, pl);
          if (take) { kh[e] = ph; kl[e] = pl; ix[e] = pix; }
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = tid + kThreads * e;
    if (i < n_live) S.sidx[i] = static_cast<uint16_t>(ix[e]);  // sentinels sorted last
  }
  __syncthreads();
}

// After a packed sort: S.sidx[1, 1 + ns) in key order, S.scr[pool index] = key32. Equal keys are
// contiguous. Each run of equal keys (two scores within 2^-32 of the key range, or a real tie) is
// re-sorted by one thread with the full (score, tuple code) order. Runs are listed first (start and
// length in S.fhist, which no fast_select uses any more at this point; it is cleared again at the next
// launch's entry), then sorted after a barrier, so no thread reads a slot another one is rewriting. A run
// longer than 32 or more than kSelBins / 2 runs (massive ties) set S.tie: the caller runs the full sort.
// Loops are left rolled on purpose (small code). Starts after a barrier that follows the sort.
__device__ DDTREE_BT_OUTLINE bool fix_tie_runs(Smem& S, int ns) {
  const int tid = threadIdx.x;
  if (tid == 0) S.count = 0;
  __syncthreads();
#pragma unroll 1
  for (int i = tid; i + 1 < ns; i += kThreads) {
    const uint32_t my = S.scr[S.sidx[1 + i]];
    if ((i == 0 || S.scr[S.sidx[i]] != my) && S.scr[S.sidx[2 + i]] == my) {
      int j = i + 2;
      while (j < ns && j - i <= 32 && S.scr[S.sidx[1 + j]] == my) ++j;
      const int slot = atomicAdd(&S.count, 1);
      if (j - i > 32 || slot >= kSelBins / 2) {
        S.tie = 1;
      } else {
        S.fhist[2 * slot] = static_cast<uint32_t>(i);
        S.fhist[2 * slot + 1] = static_cast<uint32_t>(j - i);
      }
    }
  }
  __syncthreads();
  const int runs = min(S.count, kSelBins / 2);
  if (S.tie == 0) {
#pragma unroll 1
    for (int q = tid; q < runs; q += kThreads) {
      uint16_t* r = S.sidx + 1 + S.fhist[2 * q];
      const int len = static_cast<int>(S.fhist[2 * q + 1]);
#pragma unroll 1
      for (int x = 1; x < len; ++x) {  // insertion sort of the run
        const uint16_t cur = r[x];
        int y = x - 1;
        while (y >= 0 && sorts_before(S, cur, r[y])) {
          r[y + 1] = r[y];
          --y;
        }
        r[y + 1] = cur;
      }
    }
  }
  __syncthreads();
  return S.tie != 0;
}

// key32 of a survivor: floor((0 - x) * scale), monotone (a smaller key means a score at least as large).
__device__ __forceinline__ unsigned key32_of(double x, double scale) {
  double q = __dmul_rn(__dsub_rn(0.0, x), scale);
  q = q < 4294967295.0 ? q : 4294967295.0;
  return static_cast<unsigned>(q);
}

// Small sort (ns <= 16 * 32E non-root survivors in S.sidx[1, 1 + ns)), same contract as sort_packed.
// Each warp sorts a chunk of C = 32E packed keys in registers (shuffles for j < 32, register pairs
// above; no barrier); then every element's final position is its position in its chunk plus, for each
// other chunk, the number of keys below it there (a binary search in shared memory; the searches are
// independent and unrolled, so their loads overlap). Six barriers in all, instead of a bitonic
// network's two per shared-memory stage. The u64 chunk keys live in S.sidx (16 * C * 8 bytes <= 8 KB).
template <int E>
__device__ __noinline__ bool sort_merge(Smem& S, int ns, double lo) {
  constexpr int C = 32 * E;
  static_assert(kWarps * C * 8 <= kSort * 2, "chunk keys must fit S.sidx");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const double scale = lo < 0.0 ? __ddiv_rn(4294967295.0, __dsub_rn(0.0, lo)) : 0.0;
  const int nch = (ns + C - 1) / C;
  unsigned long long v[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = warp * C + lane + 32 * e;
    v[e] = ~0ull;
    if (i < ns) {
      const int pe = S.sidx[1 + i];
      const unsigned key = key32_of(S.score[pe], scale);
      S.scr[pe] = key;
      v[e] = (static_cast<unsigned long long>(key) << 16) | static_cast<unsigned long long>(pe);
    }
  }
  if (tid == 0) S.tie = 0;
  DDTREE_BUILD_TREE_MARK(60);
  if (warp < nch) {
#pragma unroll 1
    for (int k = 2; k <= C; k <<= 1) {
#pragma unroll 1
      for (int j = k >> 1; j > 0; j >>= 1) {
        if (j >= 32) {  // only E == 2, j == 32: the lane's own pair (slot 0 and slot 1)
          static_assert(E <= 2, "register stages below assume at most two slots");
          if constexpr (E == 2) {
            const bool asc = (lane & k) == 0;
            const unsigned long long x = v[0], y = v[1];
            const bool sw = asc ? y < x : x < y;
            v[0] = sw ? y : x;
            v[1] = sw ? x : y;
          }
        } else {
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const int q = lane + 32 * e;
            const unsigned long long pv = __shfl_xor_sync(0xffffffffu, v[e], j);
            const bool keep_min = ((q & j) == 0) == ((q & k) == 0);
            v[e] = keep_min ? (pv < v[e] ? pv : v[e]) : (pv > v[e] ? pv : v[e]);
          }
        }
      }
    }
  }
  DDTREE_BUILD_TREE_MARK(61);
  __syncthreads();  // S.sidx was read above; from here it holds the sorted chunks as u64 keys
  unsigned long long* keys = reinterpret_cast<unsigned long long*>(S.sidx);
  if (warp < nch) {
#pragma unroll
    for (int e = 0; e < E; ++e) keys[warp * C + lane + 32 * e] = v[e];
  }
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(62);
  int rank[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    rank[e] = lane + 32 * e;
    if (warp * C + lane + 32 * e >= ns) continue;
#pragma unroll 1
    for (int c = 0; c < nch; ++c) {  // rolled: small code (the instruction cache is cold each launch)
      const unsigned long long* ch = keys + C * c;
      int pos = 0;
#pragma unroll
      for (int step = C / 2; step > 0; step >>= 1)
        if (ch[pos + step - 1] < v[e]) pos += step;
      rank[e] += c == warp ? 0 : pos + (ch[pos] < v[e] ? 1 : 0);
    }
  }
  __syncthreads();  // every search is done before S.sidx takes the result
  DDTREE_BUILD_TREE_MARK(63);
#pragma unroll
  for (int e = 0; e < E; ++e)
    if (warp * C + lane + 32 * e < ns) S.sidx[1 + rank[e]] = static_cast<uint16_t>(v[e] & 0xFFFFu);
  if (tid == 0) S.sidx[0] = 0;
  __syncthreads();
  DDTREE_BUILD_TREE_MARK(64);
  return fix_tie_runs(S, ns);
}

// Packed sort of the non-root survivors S.sidx[1, 1 + ns) (pool indices, any order), ns <= kThreads * E,
// into S.sidx[1, 1 + ns) by score desc; S.sidx[0] = 0 (the root). Key: a 32-bit order-preserving image
// of the score, key32(x) = floor((0 - x) * scale) (monotone: a smaller key means a score at least as
// large), packed with the pool index into one u64, so a compare-exchange moves one register pair and
// never re-reads the pool. Only distinct keys prove the order: returns true (S.tie) when two
// neighbours share a key, and the caller re-sorts with the full (score, tuple code) keys. Element i
// lives in thread i % kThreads, slot i / kThreads; stages with j < 32 use shuffles, j >= kThreads
// registers, the rest an exchange of pool indices through S.sidx with the keys cached in S.scr.
template <int E>
__device__ __noinline__ bool sort_packed(Smem& S, int ns, double lo) {
  const int tid = threadIdx.x;
  const double scale = lo < 0.0 ? __ddiv_rn(4294967295.0, __dsub_rn(0.0, lo)) : 0.0;
  int P = 1;
  while (P < ns) P <<= 1;
  unsigned long long v[E];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = tid + kThreads * e;
    v[e] = ~0ull;
    if (i < ns) {
      const int pe = S.sidx[1 + i];
      double q = __dmul_rn(__dsub_rn(0.0, S.score[pe]), scale);
      q = q < 4294967295.0 ? q : 4294967295.0;
      const unsigned key = static_cast<unsigned>(q);
      S.scr[pe] = key;
      v[e] = (static_cast<unsigned long long>(key) << 16) | static_cast<unsigned long long>(pe);
    }
  }
  if (tid == 0) S.tie = 0;
  __syncthreads();  // S.sidx is the exchange buffer from here on; S.scr holds the keys
  // Warps whose elements all lie at or past P hold sentinels only and never meet a real element
  // (partners i ^ j stay inside [0, P)): they skip the work and only keep the barriers.
  const bool active = (tid & ~31) < P;
  for (int k = 2; k <= P; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      if (j >= kThreads) {
        const int je = j / kThreads;
#pragma unroll
        for (int e = 0; e < E; ++e) {
#pragma unroll
          for (int f = e + 1; f < E; ++f) {
            if (f == (e ^ je)) {
              const bool asc = ((tid + kThreads * e) & k) == 0;
              const unsigned long long a = v[e], b = v[f];
              const bool sw = asc ? b < a : a < b;
              v[e] = sw ? b : a;
              v[f] = sw ? a : b;
            }
          }
        }
      } else if (j >= 32) {
        if (active) {
#pragma unroll
          for (int e = 0; e < E; ++e) S.sidx[tid + kThreads * e] = static_cast<uint16_t>(v[e] & 0xFFFFu);
        }
        __syncthreads();
        if (active) {
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const int i = tid + kThreads * e;
            const int pe = S.sidx[i ^ j];
            const unsigned long long pv = pe == 0xFFFF ? ~0ull
                                                       : (static_cast<unsigned long long>(S.scr[pe]) << 16) |
                                                             static_cast<unsigned long long>(pe);
            const bool keep_min = ((i & j) == 0) == ((i & k) == 0);
            v[e] = keep_min ? (pv < v[e] ? pv : v[e]) : (pv > v[e] ? pv : v[e]);
          }
        }
        __syncthreads();
      } else if (active) {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          const int i = tid + kThreads * e;
          const unsigned long long pv = __shfl_xor_sync(0xffffffffu, v[e], j);
          const bool keep_min = ((i & j) == 0) == ((i & k) == 0);
          v[e] = keep_min ? (pv < v[e] ? pv : v[e]) : (pv > v[e] ? pv : v[e]);
        }
      }
    }
  }
  __syncthreads();  // the last exchange reads are done before S.sidx takes the result
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = tid + kThreads * e;
    if (i < ns) S.sidx[1 + i] = static_cast<uint16_t>(v[e] & 0xFFFFu);
  }
  if (tid == 0) S.sidx[0] = 0;
  __syncthreads();
  return fix_tie_runs(S, ns);
}

}  // namespace build_tree_k
}  // namespace ddtree
