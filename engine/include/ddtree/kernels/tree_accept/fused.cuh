// tree_accept, the fused plan (the default, n_max <= kAcceptFusedMaxNodes): one kernel whose last CTA per
// request walks the tree in shared memory, and the device functions of that walk. Overview in
// ../tree_accept.cuh.
#pragma once

#include <climits>
#include <cstdint>

#include "ddtree/kernels/common.cuh"
#include "ddtree/kernels/tree_accept/common.cuh"

namespace ddtree {
namespace kernels {

// atom.add with acquire-release semantics at GPU scope (sm_70+): one instruction instead of a
// __threadfence() followed by a relaxed atomicAdd.
__device__ __forceinline__ uint32_t atomic_add_acq_rel_gpu(uint32_t* addr, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(addr), "r"(v) : "memory");
  return old;
}

// A 4-byte load that the compiler issues where it is written (not sunk below a branch).
__device__ __forceinline__ int32_t ld_relaxed_gpu(const int32_t* p) {
  int32_t v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// One request's tree in shared memory (the fused kernel's last CTA; sampling CTAs use fc/ns/par).
struct AcceptTreeSmem {
  int32_t fc[kAcceptFusedMaxNodes], ns[kAcceptFusedMaxNodes], par[kAcceptFusedMaxNodes];
  int32_t tok[kAcceptFusedMaxNodes], tgt[kAcceptFusedMaxNodes], next[kAcceptFusedMaxNodes];
  int32_t path[kAcceptMaxWidth];
  int32_t info[16];  // the walk's results (WalkResult) and a round tail's prefetched slot state
  int32_t pages[kAcceptPageCache];  // a round tail's prefetched block-table entries (info[5] first, info[6] count)
};

// What the last CTA's walk decided for its request (the values it wrote to the outputs).
struct WalkResult {
  int count;   // accept_len: accepted nodes incl. the root, after stop-id truncation
  int len;     // accepted nodes before truncation (path[0..len))
  int target;  // the last accepted node's target token
  int last;    // bonus
  int done;    // finished
};

// The fused kernel without a round tail: the accept outputs are the kernel's only effect.
struct NoRoundTail {
  __device__ __forceinline__ void prefetch(AcceptTreeSmem&, int, int, bool, int = -1) const {}
  __device__ __forceinline__ void operator()(AcceptTreeSmem&, int, int, const WalkResult&, int32_t*) const {}
};

// par[] of nodes 0..n-1 from the child lists already in t.fc / t.ns (t.par preset to -1; -1 stays for
// the root and unreached nodes). With `check`, raises DDTREE_FLAG_BAD_INDEX on a child that does not
// come after its parent, as the split plan does. Ends with a block barrier.
__device__ __forceinline__ void link_parents(AcceptTreeSmem& t, int n, bool check, int32_t* __restrict__ flags) {
  for (int p = threadIdx.x; p < n; p += blockDim.x) {
    int c = t.fc[p];
    for (int guard = 0; c != -1 && guard < n; ++guard) {
      if (c <= p || c >= n) {  // children come after their parent in pop order
        if (check) raise_flag(flags, 0x2);
        break;
      }
      t.par[c] = p;
      c = t.ns[c];
    }
  }
  __syncthreads();
}

// A sampling CTA's parents: loads nodes 0..n-1's child lists, then link_parents without raising flags
// (the request's last CTA checks the tree once). Ends with a block barrier.
__device__ __forceinline__ void load_parents(AcceptTreeSmem& t, const int32_t* __restrict__ fc,
                                             const int32_t* __restrict__ ns, int n) {
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    t.fc[j] = fc[j];
    t.ns[j] = ns[j];
    t.par[j] = -1;
  }
  __syncthreads();
  link_parents(t, n, false, nullptr);
}

// Depth of node i from par[] (0 when it is not connected to the root; the last CTA flags that).
__device__ __forceinline__ int node_depth_of(const AcceptTreeSmem& t, int i, int n) {
  int d = 0, j = i;
  while (j > 0 && d <= n) {
    j = t.par[j];
    ++d;
  }
  return j == 0 ? d : 0;
}

// Stop ids into the tail of t.path (the walk needs path only after it has read them) when they fit; returns
// whether they did (else the walk reads them from global memory).
__device__ __forceinline__ bool stage_stops(AcceptTreeSmem& t, const int32_t* __restrict__ stop_ids, int num_stop,
                                            int width) {
  const bool in_smem = num_stop <= kAcceptStopsInSmem && width <= kAcceptMaxWidth - kAcceptStopsInSmem;
  if (in_smem)
    for (int q = threadIdx.x; q < num_stop; q += blockDim.x) t.path[kAcceptMaxWidth - kAcceptStopsInSmem + q] = stop_ids[q];
  return in_smem;
}

// The walk once t.tok/fc/ns/tgt/par hold nodes 0..n-1 (parents linked and checked) and t.next is INT_MAX:
// for every parent its first child holding the parent's target, the serial walk, stop-id truncation, the
// outputs. Returns the walk's results to every thread (after a block barrier).
__device__ __forceinline__ WalkResult accept_mark_and_walk(
    AcceptTreeSmem& t, int b, int n, const int32_t* __restrict__ stop_ids, int num_stop, bool stops_in_smem,
    int width, int32_t* __restrict__ accept_nodes, int32_t* __restrict__ accept_len,
    int32_t* __restrict__ committed_ids, int32_t* __restrict__ bonus, int32_t* __restrict__ finished,
    int32_t* __restrict__ flags, int32_t* __restrict__ pend = nullptr) {
  const int* stops = t.path + kAcceptMaxWidth - kAcceptStopsInSmem;
  for (int j = 1 + int(threadIdx.x); j < n; j += blockDim.x) {
    const int p = t.par[j];
    if (p < 0) {
      raise_flag(flags, 0x2);  // not connected to the root
      continue;
    }
    if (node_depth_of(t, j, n) == 0) raise_flag(flags, 0x2);
    if (t.tok[j] == t.tgt[p]) atomicMin(&t.next[p], j);  // the first matching child in pop order
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int cur = 0, len = 1;
    t.path[0] = 0;
    while (len < width && t.next[cur] != INT_MAX) {
      cur = t.next[cur];
      t.path[len++] = cur;
    }
    const int target = t.tgt[cur];
    // Leaf mode (pend != nullptr): a leaf's row was not scored, so where the walk ends on one its target (the
    // bonus) is not known here. The path's own tokens are cut first; a stop among them decides everything (the
    // bonus is not reached). Else the walk is pending: accept_len = len is final, and the leaf pass
    // (tree_accept/leaf.cuh) scores the leaf's row and writes bonus, finished and committed id len - 1.
    bool pending = pend != nullptr && cur > 0 && t.fc[cur] == -1;
    int last, done;
    const auto stop_at = [&](int q) { return stops_in_smem ? stops[q] : stop_ids[q]; };
    int count;
    if (pending) {
      count = cut_at_stop(len - 1, 0, [&](int s) { return t.tok[t.path[s + 1]]; }, stop_at, num_stop, &last, &done);
      pending = !done;
      if (pending) count = len;
    } else {
      count = cut_at_stop(len, target, [&](int s) { return s + 1 < len ? t.tok[t.path[s + 1]] : target; }, stop_at,
                          num_stop, &last, &done);
    }
    if (pend != nullptr) {
      pend[b] = pending ? cur : -1;
      pend[int(gridDim.z) + b] = len;  // the fused kernel's grid is (chunks, n_max, batch)
    }
    accept_len[b] = count;
    if (!pending) {
      bonus[b] = last;
      finished[b] = done;
    }
    t.info[0] = count;  // broadcast
    t.info[1] = len;
    t.info[2] = target;
    t.info[3] = last;
    t.info[4] = done;
  }
  __syncthreads();
  const WalkResult w = {t.info[0], t.info[1], t.info[2], t.info[3], t.info[4]};
  int32_t* an = accept_nodes + int64_t(b) * width;
  int32_t* ci = committed_ids + int64_t(b) * width;
  for (int s = threadIdx.x; s < width; s += blockDim.x) {
    an[s] = s < w.count ? t.path[s] : -1;
    ci[s] = s < w.count ? (s + 1 < w.len ? t.tok[t.path[s + 1]] : w.target) : -1;
  }
  return w;
}

// The last CTA of request b: every node's target token from the chunk partials, the walk along the
// first child holding its parent's target, stop-id truncation, outputs (the split plan's semantics).
// All of the request's global inputs are read in one pass (one memory round trip on the critical path).
// Returns the walk's results to every thread (after a block barrier).
__device__ __forceinline__ WalkResult accept_walk_in_smem(
    AcceptTreeSmem& t, const uint64_t* __restrict__ partial, int num_chunks, int b, int n, int n_max,
    const int32_t* __restrict__ node_token, const int32_t* __restrict__ first_child,
    const int32_t* __restrict__ next_sibling, const int32_t* __restrict__ stop_ids, int num_stop, int width,
    int32_t* __restrict__ accept_nodes, int32_t* __restrict__ accept_len, int32_t* __restrict__ committed_ids,
    int32_t* __restrict__ bonus, int32_t* __restrict__ finished, int32_t* __restrict__ flags,
    int32_t* __restrict__ pend = nullptr) {
  const int64_t row0 = int64_t(b) * n_max;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const int fc = first_child[row0 + j];
    const uint64_t* p = partial + (row0 + j) * num_chunks;
    uint64_t m = 0;
    const bool scored = pend == nullptr || j == 0 || fc != -1;  // leaf mode: leaves' partials were not written
    for (int c = 0; scored && c < num_chunks; ++c) {
      const uint64_t v = __ldcg(p + c);  // written by other CTAs of this launch: read through L2
      m = v > m ? v : m;
    }
    t.tok[j] = node_token[row0 + j];
    t.fc[j] = fc;
    t.ns[j] = next_sibling[row0 + j];
    t.tgt[j] = m != 0 ? item_id(m) : -1;
    t.par[j] = -1;
    t.next[j] = INT_MAX;
  }
  const bool stops_in_smem = stage_stops(t, stop_ids, num_stop, width);
  __syncthreads();
  link_parents(t, n, true, flags);
  return accept_mark_and_walk(t, b, n, stop_ids, num_stop, stops_in_smem, width, accept_nodes, accept_len,
                              committed_ids, bonus, finished, flags, pend);
}

// The fused kernel's parameters up to the error flags, shared with leaf mode 2's rows kernel (rows.cuh), which the
// launcher calls with the same arguments.
#define DDTREE_ACCEPT_KERNEL_PARAMS                                                                                  \
  const T *__restrict__ logits, int64_t batch_stride, int64_t row_stride, int vocab, int n_max,                     \
      const int32_t *__restrict__ node_token, const int32_t *__restrict__ first_child,                              \
      const int32_t *__restrict__ next_sibling, const int32_t *__restrict__ num_nodes,                              \
      const int32_t *__restrict__ ctx_len, const float *__restrict__ temperature, const int64_t *__restrict__ seed, \
      const int32_t *__restrict__ stop_ids, int num_stop, int width, int num_chunks, uint64_t *__restrict__ partial, \
      uint32_t *__restrict__ counters, int32_t *__restrict__ accept_nodes, int32_t *__restrict__ accept_len,        \
      int32_t *__restrict__ committed_ids, int32_t *__restrict__ bonus, int32_t *__restrict__ finished,             \
      int32_t *__restrict__ flags

// The fused plan's one kernel (grid chunks x N x B, kAcceptThreads threads). `Tail` runs in the last CTA
// of each request after the walk (NoRoundTail: nothing; RoundTail in round_finish.cuh: the KV commit and
// the slot bookkeeping of the round); its prefetch() runs before the walk, so its loads overlap it.
// `score`: kAcceptScoreUnrolled / kAcceptScoreCompact / kAcceptScorePacked (common.cuh). `early` (session 7, DDTREE_ACCEPT_PDL=1; the
// launcher then launches with PDL): griddepcontrol.wait first (so the launch and the CTAs' start overlap the
// model's last kernel, while every input is read after the wait as without PDL); every CTA loads temperature
// and ctx_len together with num_nodes (session 6 loaded temperature after the num_nodes check: one more round
// trip before scoring), so the last CTA's tail prefetch has ctx_len at once and also fetches the tree's
// block-table entries (the commit's page lookups then come from shared memory, not a round trip after the walk).
// NV: 16-byte vectors a thread loads (the chunk is kAcceptThreads x NV vectors): kAcceptPerThread's (8 fp32, 4 bf16)
// or kAcceptWideNV for bf16 (session 11, DDTREE_ACCEPT_WIDE).
// `pend` (session 13, leaf mode; nullptr: off): a leaf's row (node i > 0 with no child) is read only if the walk
// ends on it, so its CTAs load no logits and only count themselves in; the walk leaves such an ending pending in
// pend ([0, B): the leaf or -1, [B, 2B): the walk's length) for tree_accept/leaf.cuh's pass. NoRoundTail only.
template <typename T, bool VEC, typename Tail, int NV = kAcceptPerThread / (16 / int(sizeof(T)))>
__global__ void __launch_bounds__(kAcceptThreads) tree_accept_fused_kernel(
    DDTREE_ACCEPT_KERNEL_PARAMS, const Tail tail, int score, int early, int32_t* __restrict__ pend = nullptr) {
  __shared__ uint64_t red[kAcceptThreads / 32];
  __shared__ AcceptTreeSmem tree;
  __shared__ int s_last;
  const int chunk = blockIdx.x, i = blockIdx.y, b = blockIdx.z;
  using Chunk = ChunkLogits<T, VEC, NV>;
  const int start = chunk * Chunk::kChunk;
  if (early) pdl_wait();  // no-op without a PDL launch; every input below is read after it
  // Row i < n_max exists (the launcher checked the strides), so its load need not wait for num_nodes:
  // rows past the tree are loaded and dropped, never scored.
  Chunk chunk_logits;
  const T* row = logits + int64_t(b) * batch_stride + int64_t(i) * row_stride;
  if (pend == nullptr) chunk_logits.load(row, start, vocab);
  // Leaf mode: whether node i has a child, read in num_nodes' round trip (the row's load waits for it).
  const int fc_i = pend != nullptr && i > 0 ? first_child[int64_t(b) * n_max + i] : 0;
  const int nn = num_nodes[b];
  int ctx_early = -1;
  float temp_early = 0.f;
  if (early) {  // asm volatile: issued here, in num_nodes' round trip, not after the exit below (ptxas sinks
                // plain loads there)
    ctx_early = ld_relaxed_gpu(ctx_len + b);
    temp_early = __int_as_float(ld_relaxed_gpu(reinterpret_cast<const int32_t*>(temperature + b)));
  }
  const int n = max(1, min(nn, n_max));
  if (i >= n) return;  // not counted: the request's arrivals are n x num_chunks
  const bool skip = fc_i == -1;  // leaf mode's leaf (block-uniform): counted in, nothing read or scored
  uint64_t m = 0;
  if (!skip) {
    if (pend != nullptr) chunk_logits.load(row, start, vocab);
    const float temp = early ? temp_early : temperature[b];
    const bool sample = temp > 0.f;  // 0, negative or NaN: greedy
    uint32_t key = 0;
    if (sample) {  // block-uniform: the whole CTA derives node i's depth
      load_parents(tree, first_child + int64_t(b) * n_max, next_sibling + int64_t(b) * n_max, n);
      key = gumbel_key(uint64_t(seed[b]), uint32_t(b), uint32_t(ctx_len[b] + node_depth_of(tree, i, n) + 1));
    }
    int bad = 0;
    const uint64_t best = chunk_logits.best(start, vocab, sample, temp, key, &bad, score);
    m = block_best(best, bad, red, flags);
  }
  if (threadIdx.x == 0) {
    if (!skip) partial[(int64_t(b) * n_max + i) * num_chunks + chunk] = m;
    // Release: the partial is visible device-wide before this CTA counts as arrived; acquire: the last
    // arriver sees every other CTA's partial.
    const uint32_t arrived = atomic_add_acq_rel_gpu(&counters[b], 1u) + 1u;
    s_last = arrived == uint32_t(n) * uint32_t(num_chunks);
    if (s_last) counters[b] = 0;  // every arrival of this launch is in: ready for the next launch
  }
  __syncthreads();
  if (!s_last) return;
  tail.prefetch(tree, b, n_max, early != 0, ctx_early);
  const WalkResult w =
      accept_walk_in_smem(tree, partial, num_chunks, b, n, n_max, node_token, first_child, next_sibling, stop_ids,
                          num_stop, width, accept_nodes, accept_len, committed_ids, bonus, finished, flags, pend);
  tail(tree, b, width, w, flags);
}

}  // namespace kernels
}  // namespace ddtree
