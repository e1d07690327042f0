// tree_accept, the one-CTA plan (session 6; small vocabularies): ONE launch, one 512-thread CTA per request
// that reads all of the request's logits itself, so there is no arrival counter, no partials round trip and no
// second CTA pass. Overview in ../tree_accept.cuh; the walk and the round tail are the fused plan's.
//
// Why: on the small end-to-end model (V = 320, 17-65 nodes) the fused plan's chain is: logits -> CTA
// reduction -> partial store + acq_rel arrival -> the last CTA's partials/child-list reads -> walk (-> the
// round tail's block-table, K/V and hidden-row round trips): 7.4-10.1 µs for the accept, 10.8-15.7 µs with the
// round tail (NOTES, sessions 4-5), against ~83 KB of logits per request at most. Here:
//   prologue (before the PDL wait: nothing in it is written by the model's last kernel): num_nodes, the child
//     lists and tokens, the stop ids into shared memory, the round tail's slot state and block-table entries;
//   logits: warp w owns nodes w, w + 16, ...; its (node, 16-byte vector) pairs are numbered densely and lane l
//     loads pairs l, l + 32, ... (up to 64 logits: 16 fp32 or 8 bf16 vectors, all in flight at once);
//   parents linked (and checked) while the loads are in flight; sampling: each owned node's noise key;
//   every pair scored (the fused plan's scored_item), reduced per node by the owning warp -> t.tgt;
//   the fused plan's mark + walk + outputs, then the round tail.
// Measured (H200, session 6, CUPTI inside the end-to-end round, V = 320): SLOWER than the chunked plan: 12.7 µs
// at 17 nodes (chunked 11.0-11.4) and 21.5-21.7 at 65 (chunked 11.8-16.6); the round span +5 µs at batch 1 /
// budget 64. The cost grows with the nodes per warp: the whole request's scoring (up to 13 vectors per lane
// x 16 warps) lands on one SM's four schedulers, where the chunked plan spreads one row per CTA over the GPU.
// Session 7: most of that was instruction fetch of the unrolled noise code (common.cuh, kAcceptScoreCompact); with the
// compact scoring it took 10.0 / 14.4 / 9.9 / 14.3 µs at batch 1/8 x 17/65 nodes, still slower than the chunked
// kernel with the same scoring (8.5 / 9.2-9.6 / 9.0 / 12.5-12.8) in the same process: one SM's scoring of 65 rows
// costs more than the arrival counter and the partials pass it saves.
// Opt-in (DDTREE_ACCEPT_ONE_CTA=1), kept for that A/B and as the base for a cluster-spread version.
// Fits (launcher): 16-byte vectors or not, ceil(n_max / 16) <= kAcceptOneNodesPerWarp and
// ceil(n_max / 16) * ceil(V / VN) <= 32 * 64 / VN (VN logits per vector): V = 320 up to 102 nodes.
#pragma once

#include <climits>
#include <cstdint>

#include "ddtree/kernels/common.cuh"
#include "ddtree/kernels/tree_accept/common.cuh"
#include "ddtree/kernels/tree_accept/fused.cuh"

namespace ddtree {
namespace kernels {

constexpr int kAcceptOneThreads = 512;
constexpr int kAcceptOneWarps = kAcceptOneThreads / 32;
constexpr int kAcceptOneElems = 64;        // logits a lane holds at once (16 fp32 or 8 bf16 16-byte vectors)
constexpr int kAcceptOneNodesPerWarp = 8;  // nodes a warp owns at most

// Whether a request's logits fit one CTA of this plan (host and device).
__host__ __device__ constexpr bool accept_one_cta_fits(int n_max, int vocab, int elem_bytes) {
  const int vn = 16 / elem_bytes;
  const int per_warp = (n_max + kAcceptOneWarps - 1) / kAcceptOneWarps;
  return n_max >= 1 && vocab >= 1 && per_warp <= kAcceptOneNodesPerWarp &&
         int64_t(per_warp) * ((vocab + vn - 1) / vn) <= int64_t(32) * (kAcceptOneElems / vn);
}

// grid (B), block kAcceptOneThreads; the caller checked accept_one_cta_fits(n_max, vocab, sizeof(T)).
template <typename T, bool VEC, typename Tail>
__global__ void __launch_bounds__(kAcceptOneThreads, 1) tree_accept_one_cta_kernel(
    const T* __restrict__ logits, int64_t batch_stride, int64_t row_stride, int vocab, int n_max,
    const int32_t* __restrict__ node_token, const int32_t* __restrict__ first_child,
    const int32_t* __restrict__ next_sibling, const int32_t* __restrict__ num_nodes,
    const int32_t* __restrict__ ctx_len, const float* __restrict__ temperature, const int64_t* __restrict__ seed,
    const int32_t* __restrict__ stop_ids, int num_stop, int width, int32_t* __restrict__ accept_nodes,
    int32_t* __restrict__ accept_len, int32_t* __restrict__ committed_ids, int32_t* __restrict__ bonus,
    int32_t* __restrict__ finished, int32_t* __restrict__ flags, const Tail tail, int score) {
  constexpr int VN = 16 / int(sizeof(T));
  constexpr int kAcceptOneVecs = kAcceptOneElems / VN;  // 16-byte vectors a lane holds at once
  __shared__ AcceptTreeSmem t;
  const int b = blockIdx.x;
  const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
  const int64_t row0 = int64_t(b) * n_max;

  // Prologue: inputs that were complete before the model's last kernel started.
  const int n = max(1, min(num_nodes[b], n_max));
  tail.prefetch(t, b, n_max, true);
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    t.tok[j] = node_token[row0 + j];
    t.fc[j] = first_child[row0 + j];
    t.ns[j] = next_sibling[row0 + j];
    t.par[j] = -1;
    t.next[j] = INT_MAX;
  }
  const bool stops_in_smem = stage_stops(t, stop_ids, num_stop, width);
  const float temp = temperature[b];
  const bool sample = temp > 0.f;  // 0, negative or NaN: greedy

  // This warp's nodes and their logits: pair f = (node slot f / vpn, vector f % vpn).
  const int vpn = (vocab + VN - 1) / VN;
  const int owned = warp < n ? (n - 1 - warp) / kAcceptOneWarps + 1 : 0;
  const int pairs = owned * vpn;
  pdl_wait();  // the logits (the model's last kernel) are visible
  // Pair f = lane + 32 r is (slot s, vector u) = (f / vpn, f % vpn), walked incrementally (no division).
  const int s0 = lane / vpn, u0 = lane - s0 * vpn;
  auto advance = [vpn](int& s, int& u) {
    u += 32;
    while (u >= vpn) {  // once for vpn >= 32; more only for tiny vocabularies
      u -= vpn;
      ++s;
    }
  };
  uint4 raw[kAcceptOneVecs];
  {
    int s = s0, u = u0;
#pragma unroll
    for (int r = 0; r < kAcceptOneVecs; ++r) {
      if (lane + 32 * r < pairs) {
        const T* x = logits + int64_t(b) * batch_stride + int64_t(warp + kAcceptOneWarps * s) * row_stride;
        const int base = u * VN;
        if (VEC && base + VN <= vocab) {
          raw[r] = __ldg(reinterpret_cast<const uint4*>(x + base));
        } else {
          T* e = reinterpret_cast<T*>(&raw[r]);
#pragma unroll
          for (int q = 0; q < VN; ++q) e[q] = (base + q < vocab) ? x[base + q] : T(0.0f);
        }
      }
      advance(s, u);
    }
  }
  __syncthreads();  // the tree is in shared memory
  link_parents(t, n, true, flags);

  uint64_t best[kAcceptOneNodesPerWarp];
#pragma unroll
  for (int q = 0; q < kAcceptOneNodesPerWarp; ++q) best[q] = 0;
  int bad = 0;
  if (score == kAcceptScoreCompact && !sample) {  // greedy: straight-line vectors (common.cuh)
    int s = s0, u = u0;
#pragma unroll
    for (int r = 0; r < kAcceptOneVecs; ++r) {
      if (lane + 32 * r >= pairs) break;  // pairs are numbered densely: no later one is this lane's
      const uint64_t top = greedy_vector_best<T>(raw[r], u * VN, vocab, &bad);
#pragma unroll
      for (int q = 0; q < kAcceptOneNodesPerWarp; ++q)
        if (s == q) best[q] = top > best[q] ? top : best[q];
      advance(s, u);
    }
  } else {  // session 6's loop (sampling, and greedy under DDTREE_ACCEPT_SCORE=unrolled)
    uint32_t key[kAcceptOneNodesPerWarp];
#pragma unroll
    for (int q = 0; q < kAcceptOneNodesPerWarp; ++q) {
      key[q] = 0u;
      if (sample && q < owned)
        key[q] = gumbel_key(uint64_t(seed[b]), uint32_t(b),
                            uint32_t(ctx_len[b] + node_depth_of(t, warp + kAcceptOneWarps * q, n) + 1));
    }
    int s = s0, u = u0;
#pragma unroll
    for (int r = 0; r < kAcceptOneVecs; ++r) {
      if (lane + 32 * r < pairs) {
        const T* e = reinterpret_cast<const T*>(&raw[r]);
        uint32_t k = 0u;
#pragma unroll
        for (int q = 0; q < kAcceptOneNodesPerWarp; ++q) k = s == q ? key[q] : k;
        uint64_t top = 0;
#pragma unroll
        for (int q = 0; q < VN; ++q) {
          const int id = u * VN + q;
          if (id < vocab) {
            const uint64_t it = scored_item(to_float<T>(e[q]), id, sample, temp, k, &bad);
            top = it > top ? it : top;
          }
        }
#pragma unroll
        for (int q = 0; q < kAcceptOneNodesPerWarp; ++q)
          if (s == q) best[q] = top > best[q] ? top : best[q];
      }
      advance(s, u);
    }
  }
  bad = warp_or(bad);
  if (bad && lane == 0) raise_flag(flags, 0x1);
#pragma unroll
  for (int q = 0; q < kAcceptOneNodesPerWarp; ++q) {
    if (q < owned) {  // warp-uniform
      const uint64_t m = warp_max_u64(best[q]);
      if (lane == 0) t.tgt[warp + kAcceptOneWarps * q] = m != 0 ? item_id(m) : -1;
    }
  }
  __syncthreads();
  const WalkResult w = accept_mark_and_walk(t, b, n, stop_ids, num_stop, stops_in_smem, width, accept_nodes,
                                            accept_len, committed_ids, bonus, finished, flags);
  tail(t, b, width, w, flags);
}

}  // namespace kernels
}  // namespace ddtree
