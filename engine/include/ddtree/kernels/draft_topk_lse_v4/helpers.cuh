// draft_topk_lse v4, part 1: configuration, the cluster / mbarrier / st.async primitives, the
// shared-memory layout, the row split, and the per-vector and rank-counting helpers. Overview in
// ../draft_topk_lse_v4.cuh, the kernel in kernel.cuh.
#pragma once

#include <cuda_bf16.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "ddtree/kernels/block_select.cuh"
#include "ddtree/kernels/common.cuh"

// The CPU emulation (tests/topk_emu/topk_v4_emu.cpp) counts the fallbacks and gives each emulated CTA
// its own shared memory; on the GPU these are no-ops / a plain __shared__ declaration.
#ifndef DDTREE_TOPK_V4_EVENT
#define DDTREE_TOPK_V4_EVENT(name) ((void)0)
#endif
// Per-CTA stage timestamps for bench/profile/draft_topk_lse_stages.cu (its trace build defines it; a no-op
// in the library).
#ifndef DDTREE_V4_MARK
#define DDTREE_V4_MARK(stage) ((void)0)
#endif
#ifndef DDTREE_V4_SHARED
#define DDTREE_V4_SHARED(type, name) __shared__ type name
#endif

namespace ddtree {
namespace kernels {

constexpr int kV4Threads = 512;
constexpr int kV4MaxCluster = 8;  // portable cluster size
constexpr int kV4MaxK = 64;
constexpr int kV4Groups = 128;   // lane groups (THREADS / 128 lanes each) whose maxima bound the k-th key
constexpr int kV4Cap = 512;      // candidates per CTA ranked by counting (>= kV4MaxCluster * kV4MaxK)
constexpr int kV4Vecs = 5;       // 16-byte vectors per thread held in registers per round
constexpr float kV4Log2e = 1.4426950408889634f;  // fl(log2 e); the merge divides by the same float
constexpr uint32_t kV4KeyNegInf = 0x007FFFFFu;    // ordered_key(-inf)

static_assert(kV4Cap >= kV4MaxK, "a CTA ranks at least k candidates");

// Kernel options (template parameter OPT; v6, NOTES "v6 (session 4)"). kV4OptFastLoad: a CTA whose
// vectors all lie inside the row loads a round with unconditional 16-byte loads (v5 compiled every vector
// load behind a bounds branch with an element-wise fallback, ~20 instructions per vector before the next
// load issued). kV4OptK1Warp (ASYNC only): k = 1 without the slice bound and candidate pass: each warp
// finds its best item while combining its sums, warp WARPS-1 sends the CTA's best with its partial, and
// CTA 0's warp WARPS-1 merges alone (two block barriers fewer per CTA). The old paths stay for the
// profiler's A/B (bench/profile/draft_topk_lse_stages.cu).
constexpr unsigned kV4OptFastLoad = 1u;
constexpr unsigned kV4OptK1Warp = 2u;
// k > 1, measured after the v6 stage trace (NOTES): kV4OptRadixBound (ASYNC only): every warp finds the
// k-th largest group maximum itself by a bitwise search over 32 ballot rounds (one rolled loop) instead
// of counting (v5) and a second block barrier; kV4OptRolledVisit: the candidate pass as one rolled copy of
// its per-vector body; kV4OptSplitMerge: CTA 0 ranks each slot item with P = 1-8 lanes (each searching
// some of the other CTAs' slots, then a shuffle sum) instead of one lane searching all seven.
constexpr unsigned kV4OptRadixBound = 16u;
constexpr unsigned kV4OptRolledVisit = 32u;
constexpr unsigned kV4OptSplitMerge = 64u;
// (Measured on the H200 in session 5, NOTES "v7": all three slower or neutral; profiler only.)
// v7 (session 5, NOTES "v7"), k > 1, from an ncu source-level profile of v6: kV4OptSpreadBound: the bound's
// group-maxima reads without bank conflicts; kV4OptFlatMerge: CTA 0 ranks each slot item by one branch-free
// binary search per CTA list, all lists step by step together (v6: seven searches one after another, each
// behind a branch), over a dense item numbering; kV4OptBatchReload: with two or more register rounds, the
// candidate pass loads a round's vectors together before visiting them (v6: one dependent L2 load per visit).
constexpr unsigned kV4OptSpreadBound = 128u;
constexpr unsigned kV4OptFlatMerge = 256u;
constexpr unsigned kV4OptBatchReload = 512u;
// kV4OptFloatFilter: the k > 1 candidate pass compares logits with the bound as floats, not as keys.
constexpr unsigned kV4OptFloatFilter = 1024u;
// kV4OptShortSearch (with kV4OptFlatMerge; v7b): the merge's searches take log2(k rounded up to 16/32/64) + 1
// steps over 4 lists when the cluster has <= 4 CTAs, else 8 (v7: seven steps over eight lists always).
constexpr unsigned kV4OptShortSearch = 2048u;
// v8 (session 6, NOTES "v8 (session 6)"), k > 1, st.async instantiations only. kV4OptLaneAppend: while the
// bound is a finite logit (no id limit, no -inf admitted), a visited vector's admitted logits are found by
// one float compare each and appended by their own lane (one shared atomic per lane with hits, predicated
// stores) instead of eight ballots, a warp atomic and eight predicated key/pack/stores per (warp, vector)
// (H200: 1x15 K = 16 / 32 / 64 -0.7 / -1.6 / -2.1 µs, 8x15 -2.0 / -2.1 / -5.5). Two more v8 tries, lane
// ranks (P lanes per candidate) and a lane merge (one lane per (item, list) pair), measured slower (NOTES)
// and were removed.
constexpr unsigned kV4OptLaneAppend = 4096u;
// v9 (session 7, NOTES "v9 (session 7)"), k > 1, st.async instantiations only. kV4OptWarpAppend (with the lane
// append's condition, 16-byte-aligned rows): the candidate pass takes a register round at a time, tests each
// vector's maximum first and only for a vector that reaches the bound builds its element mask, reserves its
// slots with one shared atomic and stores its candidates in a loop over the set bits. (v8 built every
// vector's mask, and ptxas compiled each vector with a hit to an aggregated atomic and eight guarded store
// blocks: ~120 instructions.) kV4OptA2AMerge: every CTA sends its partial and its sorted items to EVERY CTA of
// the cluster (st.async against each receiver's own mbarrier), and each CTA ranks only its own items against
// all lists, one lane per (item, list) pair (lists stored XOR-swizzled by list index, so the lanes of one
// item read distinct banks), then a shuffle sum. v8's CTA 0 alone ranked every CTA's items.
constexpr unsigned kV4OptWarpAppend = 8192u;
constexpr unsigned kV4OptA2AMerge = 16384u;
// v10 (session 7, s7topk2, NOTES "v10 (session 7"), with kV4OptA2AMerge: the per-CTA ranks and the all-to-all puts
// with eight lanes per candidate (lane s of the candidate's group counts the candidates s, s + 8, ..., a
// three-step shuffle sum gives the rank, and lane s sends the item to CTA s). v9 ranked each candidate with one
// thread over all of them, which then issued the seven st.async in a row (~1.2 µs of the 1x15 K = 16 trace).
constexpr unsigned kV4OptSpreadPut = 32768u;
// v11 (session 8, s8topk, NOTES "v11 (session 8"), with kV4OptA2AMerge: a ROW bound before the candidate pass. Each
// warp also takes its largest group maximum with m = ceil(k / cluster) group maxima of its CTA at or above it (the same
// count as for the k-th, a second redux) and sends it to every CTA of the cluster (st.async, 4 bytes, a second
// mbarrier) before barrier 2; a CTA's value is the largest of its warps', and the row bound R the smallest of the
// CTAs' values: the cluster's CTAs hold cluster * m >= k disjoint groups whose maxima are >= R, so the row's k-th item
// is >= R, and every CTA admits only logits >= max(its own bound, R) (R finite; else v9's bound alone). A CTA then
// holds a few candidates instead of ~k-2k (expected on randn x 4 rows of 163,840 at k = 16: ~5 instead of ~25) and
// sends its ranked ones and zeros for the rest of its kc slots (zeros sort below every item). H200 (NOTES): 1x15 K = 64
// 9.0 -> 7.9 µs, 8x15 K = 64 25.8 -> 23.4; K = 16 +0.3 (the exchange's wait outweighs the smaller stages).
constexpr unsigned kV4OptRowBound = 65536u;
// v13 (session 9, s9topk, NOTES "v13 (session 9"), k > 1: compact code on the executed path. Session 8's ncu regions put
// a fifth of v9's samples at 1x15 K = 16 in no_instruction (instruction fetch), in the candidate pass (a 6,179-instruction
// region: every visit variant inline), the ranks + puts and the merge; the library's v9 kernel is 10,544 SASS
// instructions (165 KB, sm_90a) of which a K = 16 call runs a few short stretches. With kV4OptCompact: the round append
// tests its five vectors' maxima first and runs ONE copy of the hit body in a rolled loop over the vectors that reach
// the bound (v9: five inline copies, ~200 instructions each, skipped when no lane hits); the lane append is not built
// (the element-wise pass takes its cases), and the element-wise pass is the rolled one (kV4OptRolledVisit: one visit
// copy); the radix fallback's element loop is rolled; the merge ranks its own items with one instantiation (eight
// lists, a rolled search as deep as k needs) instead of six; the v5 merge loop that the all-to-all merge never enters
// is not built. Exact semantics unchanged.
constexpr unsigned kV4OptCompact = 131072u;
// v13b (with kV4OptCompact): the radix fallback and the element-wise candidate pass as __noinline__ functions, so the
// executed path from barrier 2 to the exit is one contiguous stretch of code.
constexpr unsigned kV4OptColdCall = 262144u;
constexpr unsigned kV4OptV6 = kV4OptFastLoad | kV4OptK1Warp;  // session 4's default, kept for the A/B
// Session 5's default (each v7 option alone was faster or neutral on v6; NOTES "v7"); DDTREE_TOPK_V4_OPT=v7b
// runs it in the library.
constexpr unsigned kV4OptV7b =
    kV4OptV6 | kV4OptSpreadBound | kV4OptFlatMerge | kV4OptBatchReload | kV4OptFloatFilter | kV4OptShortSearch;
constexpr unsigned kV4OptV7 = kV4OptV7b & ~kV4OptShortSearch;  // session 5's call-2 default
// The library's default for k > 1 (k = 1 runs the kV4OptV7b instantiation: same k = 1 path, and it measured
// 0.1 µs faster there at 1x15; NOTES "v8").
constexpr unsigned kV4OptV8 = kV4OptV7b | kV4OptLaneAppend;  // session 6's default (DDTREE_TOPK_V4_OPT=v8)
// The kernel template's default options (the emulator's base build). The library picks per call (run_v4_async
// in src/draft_topk_lse.cu): v9 for k > 1 where it measured faster than v8 on the H200 (clusters of 4 or more
// CTAs per row), v11 there for k > 32 (and k = 32 at 4-CTA clusters), kV4OptV13r (v11 compact, session 9) at 8-CTA
// clusters, v8 for shorter rows, kV4OptV7b for k = 1.
constexpr unsigned kV4OptDefault = kV4OptV8;
// Session 7 (NOTES "v9 (session 7)"): v8 + the round append + the all-to-all merge (DDTREE_TOPK_V4_OPT=v9).
constexpr unsigned kV4OptV9 = kV4OptV8 | kV4OptWarpAppend | kV4OptA2AMerge;
// v9 + the spread puts (DDTREE_TOPK_V4_OPT=v10; opt-in only: H200, 1x15 K = 16 / 32 / 64 1.00 / 1.05 / 1.03x of v9).
constexpr unsigned kV4OptV10 = kV4OptV9 | kV4OptSpreadPut;
// v9 + the row bound (DDTREE_TOPK_V4_OPT=v11).
constexpr unsigned kV4OptV11 = kV4OptV9 | kV4OptRowBound;
// v13: the compact builds of v9 and v11 with the rare passes called (DDTREE_TOPK_V4_OPT=v13 runs them where the default
// runs v9 / v11); kV4OptV13a: v9 compact with the rare passes inline (profiler only).
constexpr unsigned kV4OptV13 = kV4OptV9 | kV4OptCompact | kV4OptColdCall;
constexpr unsigned kV4OptV13r = kV4OptV11 | kV4OptCompact | kV4OptColdCall;
constexpr unsigned kV4OptV13a = kV4OptV9 | kV4OptCompact;
// v11 compact with the rare paths inline (DDTREE_TOPK_V4_OPT=v13s; opt-in).
constexpr unsigned kV4OptV13s = kV4OptV11 | kV4OptCompact;

#ifndef DDTREE_V4_EMULATED
// Cluster and special-function primitives (sm_90+; the emulator defines its own).
__device__ __forceinline__ void v4_cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void v4_cluster_arrive_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void v4_cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
// Generic address of `p` (this CTA's shared memory) in the shared memory of cluster CTA `rank`.
template <typename P>
__device__ __forceinline__ P* v4_map_rank(P* p, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t out;
  asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"(reinterpret_cast<uint64_t>(p)), "r"(rank));
  return reinterpret_cast<P*>(out);
#else
  (void)rank;
  return p;
#endif
}
// The asynchronous exchange (ASYNC = true, the default since v5): st.async into CTA 0's shared memory, completing bytes
// on CTA 0's mbarrier. No GPU-scope fence: the cluster barrier's release compiles to MEMBAR.ALL.GPU.
__device__ __forceinline__ uint32_t v4_smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ uint32_t v4_mapa_u32(uint32_t addr, unsigned rank) {
  uint32_t out = addr;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
#endif
  return out;
}
// Initializes an mbarrier of one arrival, arms it for `bytes` of transactions (that arrival) and makes the
// initialization visible to the cluster (waited for through the entry cluster barrier).
__device__ __forceinline__ void v4_mbar_init_expect(uint64_t* mbar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(v4_smem_u32(mbar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(v4_smem_u32(mbar)), "r"(bytes)
               : "memory");
#endif
}
// v11: an mbarrier of one arrival, initialized at entry (visible to the cluster through the entry cluster barrier) and
// armed later, by its one arrival, for `bytes` of transactions: bytes that land before it is armed leave its tx-count
// below zero, and its phase cannot complete before that arrival. (Arming it at entry, beside the first mbarrier or in
// another thread, made ptxas spill 8-20 bytes in the kernel, sm_90a: `cluster` alive from the entry.)
__device__ __forceinline__ void v4_mbar_init(uint64_t* mbar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(v4_smem_u32(mbar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void v4_mbar_arrive_expect(uint64_t* mbar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(v4_smem_u32(mbar)), "r"(bytes)
               : "memory");
#endif
}
__device__ __forceinline__ void v4_mbar_wait0(uint64_t* mbar) {  // phase 0 completed
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n.reg .pred p;\nV4_WAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0;\n@!p bra V4_WAIT;\n}"
      ::"r"(v4_smem_u32(mbar)) : "memory");
#endif
}
// *p (this CTA's layout) in CTA `rank` := v, completing its bytes on `mbar` (this CTA's layout) in CTA `rank`.
__device__ __forceinline__ void v4_st_async(uint64_t* p, unsigned rank, uint64_t v, uint64_t* mbar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];"
               ::"r"(v4_mapa_u32(v4_smem_u32(p), rank)), "l"(v), "r"(v4_mapa_u32(v4_smem_u32(mbar), rank))
               : "memory");
#endif
}
__device__ __forceinline__ void v4_st_async(uint32_t* p, unsigned rank, uint32_t v, uint64_t* mbar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
               ::"r"(v4_mapa_u32(v4_smem_u32(p), rank)), "r"(v), "r"(v4_mapa_u32(v4_smem_u32(mbar), rank))
               : "memory");
#endif
}
__device__ __forceinline__ void v4_st_async(float2* p, unsigned rank, float2 v, uint64_t* mbar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
               ::"r"(v4_mapa_u32(v4_smem_u32(p), rank)), "f"(v.x), "f"(v.y),
               "r"(v4_mapa_u32(v4_smem_u32(mbar), rank))
               : "memory");
#endif
}
// Shared-memory atomicAdd returning the old value, as one ATOMS (inline PTX: the compiler would wrap
// atomicAdd in its own warp aggregation, a vote/popc/shuffle chain, even when one lane calls it).
__device__ __forceinline__ int v4_atomic_add_shared(int* p, int v) {
  int old;
  asm volatile("atom.shared.add.u32 %0, [%1], %2;" : "=r"(old) : "r"(v4_smem_u32(p)), "r"(v) : "memory");
  return old;
}
__device__ __forceinline__ float v4_ex2(float x) {  // one MUFU.EX2 (2^-22 relative), 0 for -inf
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// This thread's lane, read again where it is called (asm volatile: not merged with the kernel's early `lane`,
// so ptxas need not keep addresses derived from it alive across the kernel; v8's default spilled such an
// address, sm_90a).
__device__ __forceinline__ int v4_lane_again() {
  int l;
  asm volatile("mov.u32 %0, %%laneid;" : "=r"(l));
  return l;
}
// Packed max of two bf16 pairs; a NaN input yields the other one (NaN is caught through the sum).
__device__ __forceinline__ uint32_t v4_bf16x2_max(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t d;
  asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
#else
  const float alo = __uint_as_float(a << 16), blo = __uint_as_float(b << 16);
  const float ahi = __uint_as_float(a & 0xffff0000u), bhi = __uint_as_float(b & 0xffff0000u);
  return (__float_as_uint(fmaxf(alo, blo)) >> 16) | (__float_as_uint(fmaxf(ahi, bhi)) & 0xffff0000u);
#endif
}
#endif  // DDTREE_V4_EMULATED

template <int THREADS>
struct V4Smem {
  SelectSmem sel;                                // fallback radix select only
  uint64_t cbuf[kV4Cap];                         // candidates
  uint64_t slot[kV4MaxCluster][kV4MaxK];         // CTA 0: each CTA's best items, sorted (remote stores)
  float2 part[kV4MaxCluster];                    // CTA 0: each CTA's (log2-domain reference, sum)
  alignas(16) uint32_t gmax[kV4Groups];          // lane-group maxima (keys; lower bounds)
  float wref[THREADS / 32], wsum[THREADS / 32];  // per warp (log2-domain reference, sum)
  uint32_t red_t[THREADS / 32];                  // per warp: its best group maximum with k groups above
  uint64_t witem[THREADS / 32];                  // k = 1 (kV4OptK1Warp): each warp's best item
  unsigned long long best;  // k = 1: the best item (atomicMax)
  int cnt, bad;
  uint64_t mbar;  // CTA 0, ASYNC only: completes when every other CTA's bytes landed
  // v11 (kV4OptRowBound): the mbarrier of the other CTAs' 4-byte puts, their warps' values (rbw[cc][w]: warp w of
  // CTA cc, its largest group maximum with m of the CTA's at or above it) and this CTA's bound (the last warp's).
  uint64_t mbar2;
  alignas(16) uint32_t rbw[kV4MaxCluster][THREADS / 32];
  uint32_t thr_s;
};

// How a row is split (host and device agree): nvec 16-byte vectors per row, pv per CTA, `cluster` CTAs.
template <typename T>
struct V4Split {
  int cluster, pv;
};
template <typename T, int THREADS = kV4Threads>
__host__ __device__ inline V4Split<T> v4_split(int vocab, int max_cluster = kV4MaxCluster) {
  constexpr int VN = 16 / int(sizeof(T));
  const int nvec = (vocab + VN - 1) / VN;
  int cs = (nvec + 2 * THREADS - 1) / (2 * THREADS);  // at least ~2 vectors per thread before splitting
  cs = cs < 1 ? 1 : (cs > max_cluster ? max_cluster : cs);
  const int pv = (nvec + cs - 1) / cs;
  return V4Split<T>{(nvec + pv - 1) / pv, pv};  // every CTA gets at least one vector
}

// The key of a logit for selection: ordered_key with -0 read as +0. The reference orders by value, so
// -0 and +0 tie and the lower id comes first; ordered_key alone puts every +0 above every -0 (v4.1 did).
__device__ __forceinline__ uint32_t v4_key(float f) { return ordered_key(f == 0.f ? 0.f : f); }

template <typename T>
__device__ __forceinline__ uint4 v4_neg_inf_vec() {
  const uint32_t w = sizeof(T) == 2 ? 0xFF80FF80u : 0xFF800000u;
  return uint4{w, w, w, w};
}

// Maximum of the valid logits of one vector (invalid ones are -inf).
template <typename T>
__device__ __forceinline__ float v4_vec_max(const uint4& v);
template <>
__device__ __forceinline__ float v4_vec_max<__nv_bfloat16>(const uint4& v) {
  const uint32_t p = v4_bf16x2_max(v4_bf16x2_max(v.x, v.y), v4_bf16x2_max(v.z, v.w));
  return fmaxf(__uint_as_float(p << 16), __uint_as_float(p & 0xffff0000u));
}
template <>
__device__ __forceinline__ float v4_vec_max<float>(const uint4& v) {
  return fmaxf(fmaxf(__uint_as_float(v.x), __uint_as_float(v.y)), fmaxf(__uint_as_float(v.z), __uint_as_float(v.w)));
}

// Adds exp2(x * log2e - ref) of the vector's logits to s0/s1 (two chains for latency).
template <typename T>
__device__ __forceinline__ void v4_vec_sum(const uint4& v, float ref, float& s0, float& s1);
template <>
__device__ __forceinline__ void v4_vec_sum<__nv_bfloat16>(const uint4& v, float ref, float& s0, float& s1) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s0 += v4_ex2(fmaf(__uint_as_float(w[i] << 16), kV4Log2e, -ref));
    s1 += v4_ex2(fmaf(__uint_as_float(w[i] & 0xffff0000u), kV4Log2e, -ref));
  }
}
template <>
__device__ __forceinline__ void v4_vec_sum<float>(const uint4& v, float ref, float& s0, float& s1) {
  s0 += v4_ex2(fmaf(__uint_as_float(v.x), kV4Log2e, -ref));
  s1 += v4_ex2(fmaf(__uint_as_float(v.y), kV4Log2e, -ref));
  s0 += v4_ex2(fmaf(__uint_as_float(v.z), kV4Log2e, -ref));
  s1 += v4_ex2(fmaf(__uint_as_float(v.w), kV4Log2e, -ref));
}

// Element q of a vector, and the bits of one logit (no type punning through pointers: the CPU
// emulation compiles this with g++ -O2, where that would be undefined behaviour).
__device__ __forceinline__ uint32_t v4_word(const uint4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
template <typename T>
__device__ __forceinline__ float v4_elem(const uint4& v, int q) {
  if (sizeof(T) == 2) {
    const uint32_t w = v4_word(v, q >> 1);
    return __uint_as_float((q & 1) ? (w & 0xffff0000u) : (w << 16));
  }
  return __uint_as_float(v4_word(v, q));
}
__device__ __forceinline__ uint32_t v4_bits(float f) { return __float_as_uint(f); }
__device__ __forceinline__ uint32_t v4_bits(__nv_bfloat16 h) { return __bfloat16_as_ushort(h); }
// Sets element q of a vector to the logit with bits `e`.
template <typename T>
__device__ __forceinline__ void v4_set_elem(uint4& v, int q, uint32_t e) {
  const int i = sizeof(T) == 2 ? q >> 1 : q;
  uint32_t w = v4_word(v, i);
  if (sizeof(T) == 2) w = (q & 1) ? ((w & 0x0000ffffu) | (e << 16)) : ((w & 0xffff0000u) | e);
  else w = e;
  if (i == 0) v.x = w;
  else if (i == 1) v.y = w;
  else if (i == 2) v.z = w;
  else v.w = w;
}

// How many of buf[0, n) are greater than `it` (buf holds kV4Cap entries, n <= kV4Cap): eight independent
// broadcast loads per step instead of one dependent chain; entries at n and past it are read (inside
// the buffer) and not counted.
__device__ __forceinline__ int v4_count_greater(const uint64_t* buf, int n, uint64_t it) {
  static_assert(kV4Cap % 8 == 0, "steps of 8 stay inside the buffer");
  int r0 = 0, r1 = 0;
  for (int q = 0; q < n; q += 8) {
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      r0 += int((q + i < n) & (buf[q + i] > it));
      r1 += int((q + i + 1 < n) & (buf[q + i + 1] > it));
    }
  }
  return r0 + r1;
}

// How many of list[0, n) (sorted descending, n <= kV4MaxK) are greater than `it`: a branch-free binary
// search (those items form a prefix), 7 dependent shared loads at most.
__device__ __forceinline__ int v4_count_greater_sorted(const uint64_t* list, int n, uint64_t it) {
  int pos = 0;
#pragma unroll
  for (int s = kV4MaxK; s > 0; s >>= 1) {
    const uint64_t v = pos + s <= n ? list[pos + s - 1] : 0ull;
    pos += (v > it) ? s : 0;
  }
  return pos;
}

}  // namespace kernels
}  // namespace ddtree
