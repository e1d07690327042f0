// Tree attention fa3 back end, part 1: the shared-memory layout and the sm_90 synchronization helpers
// (mbarriers, cp.async with mbarrier completion, named barriers, setmaxnreg, cluster barriers and DSMEM).
// Overview in ../tree_attention_fa3.cuh.
#pragma once

#include "ddtree/kernels/tree_attention.cuh"

// s11 (opt-in build, issue #9): lazy rescale threshold in log2 units (fa3_softmax); 0 = the running max
// follows every tile's max (the default, v18's bits).
#ifndef DDTREE_TA_FA3_RESCALE_TH
#define DDTREE_TA_FA3_RESCALE_TH 0
#endif
// s13 (diagnostic builds only, NOTES "v22"): what sets the steady-state tile period. Bit 1 = no softmax (P is the raw
// S: no mask, max or exp), bit 2 = no K/V copies after each ring stage's first fill (the producer's barriers still
// complete; the consumers compute on real but stale K/V), 3 = both. Wrong outputs by design; 0 = the kernel (the default, main's source).
#ifndef DDTREE_TA_FA3_PROBE
#define DDTREE_TA_FA3_PROBE 0
#endif

namespace ddtree {
namespace tree_attn {

struct Fa3Config {
  static constexpr int D = 128, BN = 128, BM = 128, STAGES = 3;
  static constexpr int NT = 384;  // producer warpgroup + 2 consumer warpgroups
  static constexpr int CPR = D / 8;
  static constexpr int Q_BYTES = BM * D * 2;             // 32 KB
  static constexpr int KV_BYTES = BN * D * 2;            // 32 KB (K or V tile)
  // Everything lives in dynamic shared memory (no static __shared__): Q, the K ring, the V ring, then
  // a small region with the mbarriers, the producer's key-row table, the tile mask and row flags.
  static constexpr int K_OFF = Q_BYTES, V_OFF = K_OFF + STAGES * KV_BYTES;
  static constexpr int SMALL_OFF = V_OFF + STAGES * KV_BYTES;  // 224 KB
  static constexpr int BAR_FULL_K = 0, BAR_FULL_V = 8 * STAGES, BAR_EMPTY_K = 16 * STAGES,
                       BAR_EMPTY_V = 24 * STAGES;                 // byte offsets in the small region
  static constexpr int BAR_MASK = 32 * STAGES;                     // v10: the tile mask is published (256 arrivals)
  static constexpr int ROWS_OFF = BAR_MASK + 16;                   // int rows[3][BN]
  static constexpr int MASK_OFF = ROWS_OFF + 3 * BN * 4;           // u64 tile mask
  static constexpr int VALID_OFF = MASK_OFF + 8;                   // u8 row_valid[2][BM] (per mask half)
  static constexpr int FLAG_OFF = VALID_OFF + 2 * BM;              // int: this CTA merges its row tile (v10)
  static constexpr int SMALL_BYTES = FLAG_OFF + 4;
  // + 1 KB so the base can be aligned to the 1024-byte swizzle atom.
  static constexpr int SMEM = SMALL_OFF + SMALL_BYTES + 1024;
  static constexpr int NT8 = BN / 8, DT8 = D / 8, VW = BN / 64;
  // 32 x 128 + 232 x 256 = 63488 <= 65536 registers.
  static constexpr int PRODUCER_REGS = 32, CONSUMER_REGS = 232;
  static constexpr int EMPTY_ARRIVALS = 8;  // one per consumer warp
  // cluster_merge: after the main loop a CTA's unnormalized O (fp32, rows padded to 136 floats so the
  // float2 stores of a quad row group hit distinct banks) and (m, l) per row sit at the start of its
  // shared memory (over Q and the first K stages, no longer read by then), read by the cluster's CTAs.
  static constexpr int PART_PITCH = D + 8;                      // floats per row
  static constexpr int PART_ML_OFF = BM * PART_PITCH * 4;       // 69632
  static constexpr int MAX_CLUSTER = 8;                         // portable cluster size
  // fused merge (v10): a row tile split into 2..MAX_FUSED_SPLITS chunks is merged by the last of its CTAs
  // to finish (fused_merge_epilogue); more splits go to the merge kernel (one SM would read them all).
  static constexpr int MAX_FUSED_SPLITS = 4;
};
static_assert(Fa3Config::SMEM <= 227 * 1024, "sm_90 allows 227 KB of shared memory per block");
static_assert(Fa3Config::PART_ML_OFF + Fa3Config::BM * 8 <= Fa3Config::V_OFF, "partials fit below the V ring");
static_assert(Fa3Config::ROWS_OFF % 16 == 0 && Fa3Config::MASK_OFF % 8 == 0 && Fa3Config::FLAG_OFF % 4 == 0,
              "small-region alignment");

// ---- sm_90 synchronization helpers ------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
#endif
}
// Arrive on `bar` once every cp.async this thread issued so far has landed (counts as one of the
// barrier's expected arrivals: .noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}
// 16-byte cp.async through L2. _zfill: when `zero`, the source is ignored (not read) and 16 zero
// bytes are written (cp.async's ignore-src predicate; ptxas turns it into the LDGSTS predicate).
__device__ __forceinline__ void cp_async16_full(uint32_t dst, const void* src) {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
#endif
}
__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void* src, bool zero) {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("{\n.reg .pred z;\nsetp.ne.b32 z, %2, 0;\ncp.async.cg.shared.global [%0], [%1], 16, z;\n}\n" ::"r"(dst),
               "l"(src), "r"(static_cast<uint32_t>(zero)));
#endif
}
// row * pitch as an exact 32 x 32 -> 64-bit product (mul.wide.u32). Added to a 64-bit base in C++,
// ptxas fuses the two into one IMAD.WIDE.U32 with the base as its addend. (A plain C++ 64-bit multiply
// left an add of a known-zero high word per row; mad.wide.u32 in PTX was split into three instructions.)
__device__ __forceinline__ uint64_t mul_wide(uint32_t a, uint32_t b) {
  uint64_t r;
  asm("mul.wide.u32 %0, %1, %2;\n" : "=l"(r) : "r"(a), "r"(b));
  return r;
}
// Blocking wait with a watchdog: a pipeline bug would otherwise hang the GPU (and every test after it)
// forever. try_wait suspends the thread for a while per attempt, so 2^26 failed attempts are far
// beyond any legitimate wait (the longest is one K/V tile load); the kernel then traps, which the
// launch reports as an error.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile(
      "{\n.reg .pred p;\n.reg .u32 n;\nmov.u32 n, 0;\nTA_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@p bra TA_DONE;\n"
      "add.u32 n, n, 1;\nsetp.lt.u32 p, n, 67108864;\n@p bra TA_WAIT;\ntrap;\nTA_DONE:\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}
__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void wg_wait1() {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
#endif
}
template <int R>
__device__ __forceinline__ void regs_dealloc() {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void regs_alloc() {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
#endif
}
// Cluster primitives for the split merge through distributed shared memory (cluster_merge).
// Every thread of every CTA of the cluster arrives (release: this CTA's shared-memory partials become
// visible to the cluster) and waits (acquire).
__device__ __forceinline__ void cluster_sync_all() {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
#endif
}
// The closing barrier orders nothing (every remote load's value is consumed before it); it only keeps
// each CTA's shared memory alive until the cluster is done reading it. relaxed: without release
// semantics ptxas emits no MEMBAR.GPU in front of it (which would wait for this CTA's output stores).
__device__ __forceinline__ void cluster_sync_relaxed() {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("barrier.cluster.arrive.relaxed;\nbarrier.cluster.wait;\n" ::: "memory");
#endif
}
// Address of shared-memory address `addr` of this CTA in cluster CTA `rank`, and loads from there.
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t rank) {
  uint32_t out = addr;
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(addr), "r"(rank));
#endif
  return out;
}
__device__ __forceinline__ float4 ld_cluster_f4(uint32_t addr) {
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
#endif
  return v;
}
__device__ __forceinline__ void st_shared_f2(uint32_t addr, float x, float y) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
__device__ __forceinline__ float2 ld_cluster_f2(uint32_t addr) {
  float2 v = make_float2(0.f, 0.f);
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
#endif
  return v;
}

// GPU-scope atomics and fences for the fused split merge's per-row-tile arrival counter (v10). The
// pattern is CUTLASS's generic barrier: the writers' stores, a CTA barrier, then one thread's
// fence.acq_rel.gpu + relaxed add (release); the reader's ld.acquire.gpu, then a CTA barrier.
__device__ __forceinline__ uint32_t atom_add_relaxed_gpu(uint32_t* ptr, uint32_t v) {
  uint32_t old = 0;
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;\n" : "=r"(old) : "l"(ptr), "r"(v) : "memory");
#endif
  return old;
}
__device__ __forceinline__ void red_add_release_gpu(uint32_t* ptr, uint32_t v) {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("fence.acq_rel.gpu;\nred.relaxed.gpu.global.add.u32 [%0], %1;\n" ::"l"(ptr), "r"(v) : "memory");
#endif
}
__device__ __forceinline__ uint32_t ld_acquire_gpu(const uint32_t* ptr) {
  uint32_t v = 0;
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(ptr) : "memory");
#endif
  return v;
}
__device__ __forceinline__ void st_relaxed_gpu(uint32_t* ptr, uint32_t v) {
#if DDTREE_TA_HAVE_WGMMA
  asm volatile("st.relaxed.gpu.global.u32 [%0], %1;\n" ::"l"(ptr), "r"(v) : "memory");
#endif
}

// Chunk boundaries weighted by tile cost (opt-in, Params::balance_w = w > 0): a request split into nact
// chunks of uniform size has its tree tiles (the masked ones, at the end) all in its last chunk; here a
// context tile counts 4 units and a tile that reaches past ctx w units, and chunk i covers the tiles
// [t(i), t(i + 1)) with t(i) the first tile at which the cumulative cost reaches i / nact of the total.
// Boundaries stay multiples of BN and depend only on (kv_len, ctx, nact, w), so a chain still equals
// causal mode bit for bit and the merge order is unchanged; the count nact (and so the partial slots)
// is the plan's. When the total cost per chunk is below one tile's cost, a chunk could come out empty:
// uniform chunks are kept then.
__device__ __forceinline__ void fa3_balanced_chunk(int kv_len, int ctx, int nact, int split, int w, int& c_begin,
                                                   int& c_end) {
  constexpr int BN = Fa3Config::BN;
  const int T = (kv_len + BN - 1) / BN;  // tiles of the request
  const int f = min(ctx / BN, T);        // tiles wholly inside the context
  const long long U = 4ll * f + static_cast<long long>(w) * (T - f);
  if (U / nact < max(4, w)) return;
  auto t_of = [&](int i) {  // smallest t whose cumulative cost reaches ceil(i * U / nact)
    const long long x = (i * U + nact - 1) / nact;
    if (x <= 4ll * f) return static_cast<int>((x + 3) / 4);
    return f + static_cast<int>((x - 4ll * f + w - 1) / w);
  };
  c_begin = t_of(split) * BN;
  c_end = min(t_of(split + 1) * BN, kv_len);
}

// v17 (session 9): the first tile of split `split` under the strided schedule, and r_keys = r * BN.
// The request's T = ceil(kv_len / BN) tiles are dealt out in rounds of nact, aligned to the END of the key
// range: with T = q * nact + r, the last q * nact tiles form q full rounds (split s takes tile
// T - 1 - s - k * nact, k < q) and the first r tiles a partial round (split s >= nact - r takes tile
// nact - 1 - s). So the tree tiles (the last ones, which the tile mask may skip or which cost ~1.35 of a
// context tile) go one to a split, and a split that gets a partial-round tile never gets the last one.
// Split s visits, in increasing key order: its partial-round tile (if any), then T - 1 - s - (q - 1) * nact
// = nact + r - 1 - s, stepping nact tiles. Tiles below r (the partial round) are followed by the split's
// first full-round tile, r tiles further; every other tile by the one nact tiles further (the kernel's
// adv()). nact <= T (chunk >= BN), so every split s < nact gets q >= 1 tiles. A split past nact (an idle
// member of a merging cluster) gets none: its first tile is kv_len. Every position and the merge order
// depend only on (kv_len, nact), so a chain still equals causal mode bit for bit.
__device__ __forceinline__ void fa3_strided_first(int kv_len, int nact, int split, int& first, int& r_keys) {
  constexpr int BN = Fa3Config::BN;
  const int T = (kv_len + BN - 1) / BN;
  const int r = static_cast<int>(static_cast<unsigned>(T) % static_cast<unsigned>(nact));
  r_keys = r * BN;
  first = split >= nact ? kv_len : (nact - 1 - split + (split < nact - r ? r : 0)) * BN;
}

// Pin registers that an in-flight wgmma reads or writes: the compiler may not move their other uses
// across this point (CUTLASS's warpgroup_fence_operand).
__device__ __forceinline__ void pin(float (&x)[16][4]) {
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+f"(x[i][j])::"memory");
}
__device__ __forceinline__ void pin(uint32_t (&x)[8][4]) {
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(x[i][j])::"memory");
}

// ex2.approx.ftz: the bare MUFU.EX2 (exp2f adds a denormal range fix-up per element). exp2(-inf) = +0
// exactly, so masked scores still add exactly 0.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ void pin(float (&a)[2], float (&b)[2], float (&c)[2]) {
  asm volatile("" : "+f"(a[0]), "+f"(a[1]), "+f"(b[0]), "+f"(b[1]), "+f"(c[0]), "+f"(c[1])::"memory");
}

}  // namespace tree_attn
}  // namespace ddtree
