// tree_accept, the pieces both launch plans share: sizes, the Gumbel noise, stop-id truncation, one CTA's
// scored vocab chunk and its block reduction. Overview in ../tree_accept.cuh.
//
// The Gumbel noise must equal reference/tree_accept.py's gumbel_noise bit for bit: integer hash, then a
// logarithm made only of exactly rounded float32 operations (__f*_rn: no FMA contraction).
#pragma once

#include <cuda_bf16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "ddtree/kernels/common.cuh"

namespace ddtree {
namespace kernels {

constexpr int kAcceptThreads = 256;
constexpr int kAcceptPerThread = 32;
constexpr int kAcceptChunk = kAcceptThreads * kAcceptPerThread;  // 8192 logits per CTA
// Session 11 (issue #6): the fused kernel's "wide" bf16 chunk, 8 16-byte vectors a thread like fp32's (64 bf16
// logits, 16,384 a CTA, 32 KB): half the CTAs of the 8192-logit chunk, twice the bytes in flight per CTA.
constexpr int kAcceptWideNV = 8;
constexpr int kAcceptWalkThreads = 256;
constexpr int kAcceptMaxWidth = 1024;  // max_depth + 1
constexpr int kAcceptFusedMaxNodes = 1024;  // n_max of the fused plan (its last CTA holds the tree in smem)
constexpr int kAcceptStopsInSmem = 64;      // stop ids the fused walk stages in shared memory
constexpr int kAcceptPageCache = 16;        // block-table entries a round tail prefetches before the walk

__device__ __forceinline__ uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// Hash of (seed, request, position): the per-(node depth) part of the noise key.
__device__ __forceinline__ uint32_t gumbel_key(uint64_t seed, uint32_t request, uint32_t position) {
  uint32_t h = mix32(uint32_t(seed) ^ 0x9E3779B9u);
  h = mix32(h ^ uint32_t(seed >> 32));
  h = mix32(h ^ request);
  return mix32(h ^ position);
}

// log of a positive normal float, identical to reference log32 (same operations, same order).
__device__ __forceinline__ float log32(float x) {
  const int bits = __float_as_int(x);
  int e = ((bits >> 23) & 0xFF) - 127;
  float m = __int_as_float((bits & 0x7FFFFF) | 0x3F800000);
  if (m > float(1.41421356237309504880)) {
    m = __fmul_rn(m, 0.5f);
    e += 1;
  }
  const float f = __fsub_rn(m, 1.0f);
  const float s = __fdiv_rn(f, __fadd_rn(2.0f, f));
  const float z = __fmul_rn(s, s);
  float poly = float(1.0 / 11.0);
  poly = __fadd_rn(__fmul_rn(poly, z), float(1.0 / 9.0));
  poly = __fadd_rn(__fmul_rn(poly, z), float(1.0 / 7.0));
  poly = __fadd_rn(__fmul_rn(poly, z), float(1.0 / 5.0));
  poly = __fadd_rn(__fmul_rn(poly, z), float(1.0 / 3.0));
  poly = __fmul_rn(poly, z);
  const float t = __fadd_rn(s, __fmul_rn(s, poly));
  return __fadd_rn(__fmul_rn(float(e), float(0.69314718055994530942)), __fadd_rn(t, t));
}

__device__ __forceinline__ float gumbel(uint32_t key, uint32_t vocab_id) {
  const uint32_t h = mix32(mix32(key ^ vocab_id) ^ 0x5BD1E995u);
  const float u = __fmul_rn(float(h >> 8), 5.9604644775390625e-8f);  // 2^-24
  if (u == 0.f) return -INFINITY;
  return -log32(-log32(u));
}

// A logit's packed (score key, id): the logit itself (greedy) or logit / temp + its Gumbel noise (sampling).
// NaN sets *bad and gives 0 (below every item).
__device__ __forceinline__ uint64_t scored_item(float s, int id, bool sample, float temp, uint32_t key, int* bad) {
  if (s != s) {
    *bad = 1;
    return 0;
  }
  if (sample) s = __fadd_rn(__fdiv_rn(s, temp), gumbel(key, uint32_t(id)));
  return pack_item(ordered_key(s), id);
}

// Stop-id truncation of a round's new tokens: token_at(s), s < len, is new token s (the accepted
// non-root nodes' tokens, then the bonus `target`); the tokens are cut right after the first stop id.
// Returns the number kept and sets *last (the bonus: the stop id, or target) and *done.
template <typename TokenAt, typename StopAt>
__device__ __forceinline__ int cut_at_stop(int len, int target, TokenAt token_at, StopAt stop_at, int num_stop,
                                           int* last, int* done) {
  int count = len, found = 0, bonus = target;
  for (int s = 0; s < len && !found; ++s) {
    const int token = token_at(s);
    for (int q = 0; q < num_stop; ++q) {
      if (stop_at(q) == token) {
        count = s + 1;
        bonus = token;
        found = 1;
        break;
      }
    }
  }
  *last = bonus;
  *done = found;
  return count;
}

// The best pack_item(key(logit), id) of one loaded 16-byte vector whose first element is vocab id `base`,
// greedy (T = 0): elements past `vocab` and NaN are skipped (NaN sets *bad). Straight-line code: a handful of
// instructions per element, no branch (see kAcceptScoreCompact below).
template <typename T>
__device__ __forceinline__ uint64_t greedy_vector_best(const uint4& raw, int base, int vocab, int* bad) {
  constexpr int VN = 16 / int(sizeof(T));
  const T* e = reinterpret_cast<const T*>(&raw);
  uint64_t top = 0;
  int nan = 0;
#pragma unroll
  for (int q = 0; q < VN; ++q) {
    const float s = to_float<T>(e[q]);
    const bool in = base + q < vocab;
    nan |= int(in && s != s);
    const uint64_t it = in && s == s ? pack_item(ordered_key(s), base + q) : 0;
    top = it > top ? it : top;
  }
  *bad |= nan;
  return top;
}

// How the accept kernels score their logits (DDTREE_ACCEPT_SCORE, read by the launcher on every call):
//   unrolled (sessions 4-6): one fully unrolled loop over every element a thread holds, each element with its
//     own inline copy of the Gumbel noise (two log32, a division) behind `if (sample)`. The chunked kernel's
//     scoring is ~72 KB of SASS (32 elements x ~2.3 KB), the one-CTA kernel's ~190 KB; at T = 0 every element
//     runs ~10 instructions and then jumps ~2.3 KB ahead, past its skipped noise code, and the chunked kernel's
//     threads past the vocab still step through all 32 element checks.
//   compact (session 7): T = 0 takes a separate loop of greedy_vector_best (straight-line, ~15 instructions an
//     element) that stops at the first vector past the vocab; sampling keeps the unrolled loop.
// Same results either way (the same items are compared; NaN handling identical). Measured on the H200 in the
// end-to-end round (V = 320, 17-65 nodes): the chunked round_finish 10.9 / 11.5 / 11.4 / 15.9 -> 8.5 / 9.2 / 9.1 /
// 12.8 µs (batch 1/8 x budget 16/64), so most of session 6's tail time was fetching code, not data. Default for the
// fused plan at V <= 1024 (src/tree_accept.cu).
//   packed (session 10, bf16 only; fp32 rows and the one-CTA kernel score compact): T = 0 takes the thread's maximum
//     with bf16x2 max instructions (three per 8-element vector), then scores only the first vector holding it with
//     greedy_vector_best (packed_bf16_best below). At V = 151,936 on the H200 the compact loop is instruction-bound
//     (bf16 compact 98.7 µs at 8 x 65 nodes, fp32 compact 110.8, the bf16 byte floor 37.3); packed: 58.9 µs, and
//     1.2-1.7x faster than compact at 1 x 17 .. 8 x 65 (NOTES, "Session 10 (s10e2e)"). Default above V = 1024.
constexpr int kAcceptScoreUnrolled = 0;
constexpr int kAcceptScoreCompact = 1;
constexpr int kAcceptScorePacked = 2;

// kAcceptScorePacked's greedy best of a thread's NV bf16 vectors (vector j's first id: start + (j * kAcceptThreads +
// tid) * 8): max over bf16x2 pairs (NaN-propagating), then greedy_vector_best on the first vector whose maximum
// equals the thread's (a larger bf16 value is a larger ordered key, and earlier vectors hold lower ids, so this is
// the item the compact loop would return). Returns false, and leaves *out, where the compact loop must decide: a
// NaN (its flag), a maximum of zero (-0 and +0 compare equal here but order apart as keys), a vector crossing the
// vocab (zero-filled past it), or no element in the vocab (maximum -inf).
template <int NV>
__device__ __forceinline__ bool packed_bf16_best(const uint4 (&raw)[NV], int start, int vocab, int* bad,
                                                 uint64_t* out) {
  constexpr int VN = 8;
  const __nv_bfloat16 ninf = __ushort_as_bfloat16(0xFF80);
  __nv_bfloat16 vmax[NV];
  __nv_bfloat162 all = __bfloat162bfloat162(ninf);
  bool split = false;
#pragma unroll
  for (int j = 0; j < NV; ++j) {
    const int base = start + (j * kAcceptThreads + int(threadIdx.x)) * VN;
    const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&raw[j]);
    __nv_bfloat162 m = __hmax2_nan(__hmax2_nan(p[0], p[1]), __hmax2_nan(p[2], p[3]));
    split |= base < vocab && base + VN > vocab;
    if (base >= vocab) m = __bfloat162bfloat162(ninf);
    vmax[j] = __hmax_nan(__low2bfloat16(m), __high2bfloat16(m));
    all = __hmax2_nan(all, m);
  }
  const float tmax = __bfloat162float(__hmax_nan(__low2bfloat16(all), __high2bfloat16(all)));
  if (split || !(tmax > -INFINITY) || tmax == 0.f) return false;  // NaN fails the comparison too
  uint4 sel = raw[NV - 1];
  int sel_base = start + ((NV - 1) * kAcceptThreads + int(threadIdx.x)) * VN;
#pragma unroll
  for (int j = NV - 2; j >= 0; --j) {
    if (__bfloat162float(vmax[j]) == tmax) {
      sel = raw[j];
      sel_base = start + (j * kAcceptThreads + int(threadIdx.x)) * VN;
    }
  }
  *out = greedy_vector_best<__nv_bfloat16>(sel, sel_base, vocab, bad);
  return true;
}

// The best scored_item of one 16-byte vector whose first element is vocab id `base` (sampling, or greedy under the
// unrolled scoring); sets *bad on NaN. Out of line: the wide chunk calls it once per vector (kAcceptWideNV calls,
// one copy of the noise code).
template <typename T>
__device__ __noinline__ uint64_t scored_vector_best(uint4 raw, int base, int vocab, bool sample, float temp,
                                                    uint32_t key, int* bad) {
  constexpr int VN = 16 / int(sizeof(T));
  const T* e = reinterpret_cast<const T*>(&raw);
  uint64_t top = 0;
  int nan = 0;
#pragma unroll
  for (int q = 0; q < VN; ++q) {
    if (base + q < vocab) {
      const uint64_t it = scored_item(to_float<T>(e[q]), base + q, sample, temp, key, &nan);
      top = it > top ? it : top;
    }
  }
  *bad |= nan;
  return top;
}

// One CTA's vocab chunk of one node's logits: loaded into registers first (the loads overlap whatever
// the caller does before scoring them), then scored. best() gives the thread's best
// pack_item(key(score), id) (0 = only NaN seen) and sets *bad on NaN.
template <typename T, bool VEC, int NV_ = kAcceptPerThread / (16 / int(sizeof(T)))>
struct ChunkLogits {
  static constexpr int VN = 16 / int(sizeof(T));
  static constexpr int NV = NV_;
  static constexpr int kChunk = kAcceptThreads * NV * VN;  // logits per CTA
  uint4 raw[NV];

  __device__ __forceinline__ void load(const T* __restrict__ x, int start, int vocab) {
    load_row_vectors<T, VEC, NV, kAcceptThreads>(x, start, vocab, raw);
  }

  __device__ __forceinline__ uint64_t best(int start, int vocab, bool sample, float temp, uint32_t key, int* bad,
                                           int score = kAcceptScoreUnrolled) const {
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      uint64_t top = 0;
      if (score == kAcceptScorePacked && !sample && packed_bf16_best<NV>(raw, start, vocab, bad, &top)) return top;
    }
    if ((score == kAcceptScoreCompact || score == kAcceptScorePacked) && !sample) {
      uint64_t top = 0;
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int base = start + (j * kAcceptThreads + int(threadIdx.x)) * VN;
        if (base >= vocab) break;  // every later vector starts further right
        const uint64_t it = greedy_vector_best<T>(raw[j], base, vocab, bad);
        top = it > top ? it : top;
      }
      return top;
    }
    uint64_t top = 0;
    if constexpr (NV * VN > kAcceptPerThread) {
      // The wide chunk's sampled rows (and greedy ones under the unrolled scoring): one out-of-line copy of the
      // noise code, not 64 inline copies (the unrolled loop's code size is what session 7 found the accept to wait on).
#pragma unroll
      for (int j = 0; j < NV; ++j) {
        const int base = start + (j * kAcceptThreads + int(threadIdx.x)) * VN;
        if (base >= vocab) break;
        const uint64_t it = scored_vector_best<T>(raw[j], base, vocab, sample, temp, key, bad);
        top = it > top ? it : top;
      }
      return top;
    }
#pragma unroll
    for (int j = 0; j < NV; ++j) {
      const int base = start + (j * kAcceptThreads + int(threadIdx.x)) * VN;
      const T* e = reinterpret_cast<const T*>(&raw[j]);
#pragma unroll
      for (int q = 0; q < VN; ++q) {
        const int id = base + q;
        if (id < vocab) {
          const uint64_t it = scored_item(to_float<T>(e[q]), id, sample, temp, key, bad);
          top = it > top ? it : top;
        }
      }
    }
    return top;
  }
};

// The CTA's maximum of every thread's `best` (valid in thread 0); raises the NaN flag once per warp.
__device__ __forceinline__ uint64_t block_best(uint64_t best, int bad, uint64_t* red, int32_t* flags) {
  best = warp_max_u64(best);
  bad = warp_or(bad);
  if (bad && (threadIdx.x & 31) == 0) raise_flag(flags, 0x1);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = best;
  __syncthreads();
  uint64_t m = red[0];
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 1; w < kAcceptThreads / 32; ++w) m = red[w] > m ? red[w] : m;
  }
  return m;
}

}  // namespace kernels
}  // namespace ddtree
