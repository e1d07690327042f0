// Tree attention fa3 back end: the kernel (roles, prologue, producer loop, consumer main loop, epilogue
// dispatch). Overview in ../tree_attention_fa3.cuh.
//
// The per-tile steps live in fa3_producer.cuh / fa3_consumer.cuh, called from the kernel's lambdas (one-
// line forwarders): moving the lambdas' bodies left the SASS identical on sm_90a and sm_120, whereas
// moving inline blocks (the consumers' prologue, the nact == 1 epilogue) or the page_of / cache_row lambdas
// into functions changed ptxas' register allocation. Check per-function SASS before moving more.
#pragma once

#include "ddtree/kernels/tree_attention/fa3_consumer.cuh"
#include "ddtree/kernels/tree_attention/fa3_epilogue.cuh"
#include "ddtree/kernels/tree_attention/fa3_producer.cuh"

// Phase trace (bench/profile/fa3_trace.py): a build with -DDDTREE_TA_FA3_TRACE_BUILD defines this in
// src/tree_attention.cu to record %globaltimer and clock64 per CTA at the marks below (tid 0: entry 0,
// lengths loaded 1, chunk planned 14, first rows in shared memory 8, prologue published 2, producer done 7;
// tid 128, the first consumer warpgroup: Q copies issued 9, mask part published 10, registers raised 11,
// Q landed 3, K_0 landed 12, S_0 done 13, first softmax 4, main loop done 5, epilogue stores issued 6).
// A no-op otherwise (the default build's SASS is the same with or without the marks).
#ifndef DDTREE_TA_FA3_TRACE
#define DDTREE_TA_FA3_TRACE(tag) ((void)0)
#endif

namespace ddtree {
namespace tree_attn {

// kStrided (v17, session 9): the tile schedule of a split request. false = v10's chunks (split s takes the
// keys [s * chunk, (s + 1) * chunk), or the opt-in balanced boundaries); true = strided tiles
// (fa3_strided_first: split s takes every nact-th 128-key tile, so the tree tiles at the end of the key
// range go one to a split instead of all to the last chunk). Both instances are launched by the same
// library, chosen per launch on the host (DDTREE_TA_FA3_SCHEDULE), so the kernel carries no switch.
// kEarlyInputs (v18, session 10): the PDL wait moves from the top of the kernel to just before the first
// read of q or the K/V cache (the producer's first copy, the consumers' Q copies): qo_indptr, ctx_len, the
// block table and the ancestor words are read while the previous kernel in the stream drains. Legal only
// because the API makes those four inputs of the round (tree_attention.h: the kernel launched right before
// tree_attention on the stream must not write them); q and the cache (the tree's K/V are written right before
// in a model layer) and every output stay behind the wait. Chosen per launch (DDTREE_TA_FA3_EARLY_INPUTS).
template <bool kStrided, bool kEarlyInputs = false>
__global__ void __launch_bounds__(Fa3Config::NT, 1) tree_attention_fa3_kernel(const Params p) {
#if defined(__CUDA_ARCH__)
#if !DDTREE_TA_HAVE_WGMMA
  __trap();  // the launcher only picks this kernel when the image has sm_90a code
#else
  using C = Fa3Config;
  constexpr int D = C::D, BN = C::BN, BM = C::BM, CPR = C::CPR, ST = C::STAGES;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t q_s = (smem_u32(smem_raw) + 1023u) & ~1023u;
  unsigned char* small = smem_raw + (q_s - smem_u32(smem_raw)) + C::SMALL_OFF;
  const uint32_t small_s = q_s + C::SMALL_OFF;
  unsigned long long* s_tile_mask = reinterpret_cast<unsigned long long*>(small + C::MASK_OFF);
  unsigned char* s_row_valid = small + C::VALID_OFF;
  int* s_rows = reinterpret_cast<int*>(small + C::ROWS_OFF);
  const uint32_t full_k = small_s + C::BAR_FULL_K, full_v = small_s + C::BAR_FULL_V;
  const uint32_t empty_k = small_s + C::BAR_EMPTY_K, empty_v = small_s + C::BAR_EMPTY_V;
  const uint32_t mask_bar = small_s + C::BAR_MASK;

  const int tid = threadIdx.x;
  if (tid == 0) DDTREE_TA_FA3_TRACE(0);
  // v21: with lpt_order the heads run along x and the row-tile index along y, reversed (Params::lpt_order).
  const int b = blockIdx.z, h = p.lpt_order ? blockIdx.x : blockIdx.y;
  const int xi = p.lpt_order ? static_cast<int>(gridDim.y - 1u - blockIdx.y) : static_cast<int>(blockIdx.x);
  // cluster_merge: the num_splits CTAs of a row tile are adjacent in x (one cluster, rank = split).
  const bool cl = p.cluster_merge != 0;
  const int rt = cl ? xi / p.num_splits : xi % p.row_tiles;
  const int split = cl ? xi % p.num_splits : xi / p.row_tiles;

  // v9: the mbarriers are initialized (and published by the one __syncthreads that needs no global
  // data) before anything else, so that the producer can issue its first K/V copies as soon as its
  // block-table entries arrive, without waiting for the consumers' Q copies to be issued.
  if (tid == 0) {
    s_tile_mask[0] = 0ull;
#pragma unroll
    for (int s = 0; s < ST; ++s) {
      mbar_init(full_k + 8 * s, 128);  // every producer thread's copies land once per fill
      mbar_init(full_v + 8 * s, 128);
      mbar_init(empty_k + 8 * s, C::EMPTY_ARRIVALS);  // every consumer warp once per use
      mbar_init(empty_v + 8 * s, C::EMPTY_ARRIVALS);
    }
    mbar_init(mask_bar, 256);  // v10: every consumer thread once, after its part of the tile mask
  }
  __syncthreads();
  // Launched with programmatic dependent launch: the previous kernel in the stream (which may have
  // written q, the K/V cache, the tree or the lengths) must be complete before the first global read;
  // with kEarlyInputs, before the first read of q or the cache (below), the inputs being the caller's.
  if constexpr (!kEarlyInputs) ddtree::kernels::pdl_wait();
  const int t0 = p.qo_indptr[b];
  const int n_b = max(0, min(min(p.qo_indptr[b + 1], p.num_tokens) - t0, p.n_max));
  const int G = p.group;
  const int rows_b = n_b * G;
  const int row0 = rt * BM;
  // The two exits below come before kEarlyInputs' waits (in the prologue's branches), so they wait first: every CTA
  // of a PDL grid executes griddepcontrol.wait before it exits (session 12, s12pdl; a second wait, in the other
  // instance, returns at once). The grid's completion then implies its predecessor's even when no CTA has work.
  if (row0 >= rows_b) {  // CTA- and cluster-uniform (same row tile): no barrier after this yet
    ddtree::kernels::pdl_wait();
    return;
  }
  if (tid == 0) DDTREE_TA_FA3_TRACE(1);
  const int ctx = max(p.ctx_len[b], 0);
  const int kv_len = min(ctx + n_b, p.max_pages * p.page_size);
  const int nact = (kv_len + p.chunk - 1) / p.chunk;
  // A cluster that merges (nact > 1) needs every CTA at its cluster barriers: a CTA past the request's
  // length stays, with an empty key range (no tiles: O = 0, m = -inf, l = 0, never read by the merge).
  const bool cmerge = cl && nact > 1;
  if (split >= nact && !cmerge) {
    ddtree::kernels::pdl_wait();
    return;
  }
  int c_begin = split * p.chunk, c_end = min(c_begin + p.chunk, kv_len);
  // Strided: the CTA's tiles are c_begin, then adv() of it, ... while < c_end = kv_len; keys below r_keys
  // are the partial round (see fa3_strided_first). Chunked: c_begin, c_begin + BN, ... while < c_end.
  int r_keys = 0, step = BN;
  if constexpr (kStrided) {
    fa3_strided_first(kv_len, nact, split, c_begin, r_keys);
    c_end = kv_len;
    step = nact * BN;
  } else {
    if (p.balance_w > 0 && nact > 1) fa3_balanced_chunk(kv_len, ctx, nact, split, p.balance_w, c_begin, c_end);
  }
  auto adv = [&](int k) {  // the CTA's next tile after the one at key k
    if constexpr (kStrided) return k + (k < r_keys ? r_keys : step);
    return k + BN;
  };
  const int tb0 = (ctx / BN) * BN;
  if (tid == 0) DDTREE_TA_FA3_TRACE(14);
  const int* bt = p.block_table + static_cast<int64_t>(b) * p.max_pages;
  const uint32_t* anc_b = p.anc ? p.anc + static_cast<int64_t>(b) * p.n_max * p.words : nullptr;

  const uint32_t k_ring = q_s + C::K_OFF, v_ring = q_s + C::V_OFF;
  const int wg = tid >> 7;

  // ---- prologue: three things overlap before the tile mask is published ----------------------------
  // the producer looks up and issues the first K (and V) tiles when they are context tiles, which the
  // mask cannot skip; the consumers issue their ancestor-word loads, then their Q copies, then compute
  // the mask from the words.
  // Producer helpers: the v7 copy mapping (fa3_producer.cuh).
  const int cp_g = (tid & 127) >> 3, cp_s = tid & 7;
  const int rows_slot = (tid & 15) * 8 + ((tid & 127) >> 4);  // where key tid goes in s_rows[buf]
  auto page_of = [&](int slot) {  // block-table entry of a key slot (slot < kv_len)
    return __ldg(bt + (p.page_shift >= 0 ? (slot >> p.page_shift) : slot / p.page_size));
  };
  auto cache_row = [&](int slot, int page) {  // cache row of a key slot, 0 past the length (zero fill)
    if (slot >= kv_len) return 0;
    const int off = p.page_shift >= 0 ? (slot & (p.page_size - 1)) : slot - (slot / p.page_size) * p.page_size;
    return page * p.page_size + off;
  };
  // Bytes per cache row (every kv head's D elements).
  const uint32_t row_pitch = static_cast<uint32_t>(p.hkv) * (D * 2);
  // This thread's chunk of head h in cache row 0 of K / V. Opaque (empty asm) so that ptxas keeps each
  // as one 64-bit register pair and uses it as IMAD.WIDE.U32's addend; without it, it re-associates
  // p.k + offset + row * pitch and spends IADD3 + IADD3.X per row on top of the multiply.
  const char* k_src0 = reinterpret_cast<const char*>(p.k) + (h * D + cp_s * 8) * 2;
  const char* v_src0 = reinterpret_cast<const char*>(p.v) + (h * D + cp_s * 8) * 2;
  asm("" : "+l"(k_src0));
  asm("" : "+l"(v_src0));
  const uint32_t cp_dst0 = swz<BN>(cp_g, cp_s);
#if DDTREE_TA_FA3_PROBE & 2
  // Diagnostic (fa3_config.cuh): only the first 7 tile copies (K_0, K_1, V_0, K_2, V_1, K_3, V_2: every ring stage
  // of K and V once, so the GEMMs run on real data), none after; the cp.async arrives still complete every stage.
  int n_issued = 0;
  auto issue = [&](uint32_t dst, const char* src0, int buf, int lim) {
    if (n_issued++ <= 2 * ST) fa3_issue_tile(dst, src0, s_rows, buf, lim, cp_g, cp_dst0, row_pitch);
  };
#else
  auto issue = [&](uint32_t dst, const char* src0, int buf, int lim) {
    fa3_issue_tile(dst, src0, s_rows, buf, lim, cp_g, cp_dst0, row_pitch);
  };
#endif
  // Context tiles are never skipped, so a chunk that starts inside the context starts at c_begin, and
  // its first tiles are known before the tile mask exists. v8: when tiles 0 and 1 are both context
  // tiles, the prologue runs producer steps 0 and 1 (K_0; K_1 and V_0) before the mask is published,
  // so everything iteration 1 of the consumers needs is in flight while warpgroups 1 and 2 compute the
  // mask; the page of the first tile the loop issues is looked up before the first barrier as well.
  const int k1 = adv(c_begin);  // the CTA's second tile (c_begin + BN when chunked)
  const bool first_is_ctx = c_begin < ctx;
  const bool second_is_ctx = first_is_ctx && k1 < ctx && k1 < c_end;
  const int npre = first_is_ctx ? (second_is_ctx ? 2 : 1) : 0;  // producer steps done in the prologue
  // the loop's first tile when it is a context tile (not skippable)
  const int kpre = kStrided ? (npre == 0 ? c_begin : npre == 1 ? k1 : adv(k1)) : c_begin + npre * BN;
  const bool kpre_known = kpre < ctx && kpre < c_end;
  int page0 = 0, page1 = 0, page_next = 0;
  if (wg == 0) {  // independent block-table loads, all in flight together
    if (first_is_ctx && c_begin + tid < kv_len) page0 = page_of(c_begin + tid);
    if (second_is_ctx && k1 + tid < kv_len) page1 = page_of(k1 + tid);
    if (kpre_known && kpre + tid < kv_len) page_next = page_of(kpre + tid);
    if constexpr (kEarlyInputs) ddtree::kernels::pdl_wait();  // the block-table loads are in flight
  }

  if (wg == 0 && first_is_ctx) {  // steps 0 (K_0) and, with a second context tile, 1 (K_1, then V_0)
    s_rows[rows_slot] = cache_row(c_begin + tid, page0);
    if (second_is_ctx) s_rows[BN + rows_slot] = cache_row(k1 + tid, page1);
    if (tid == 0) DDTREE_TA_FA3_TRACE(8);
    named_sync(5, 128);
    issue(k_ring, k_src0, 0, kv_len - c_begin - cp_g);
    cp_async_mbar_arrive(full_k);
    if (second_is_ctx) {
      issue(k_ring + C::KV_BYTES, k_src0, 1, kv_len - k1 - cp_g);
      cp_async_mbar_arrive(full_k + 8);
      issue(v_ring, v_src0, 0, kv_len - c_begin - cp_g);
      cp_async_mbar_arrive(full_v);
    }
  }
  if (wg != 0) {  // per-row validity and the tree tiles this CTA visits (as in tree_attention_kernel)
    // Both consumer warpgroups share the work (v8): warpgroup 1 + half takes the ancestor words
    // 8 * half + 16 * k .. + 7, so a row of up to 512 nodes costs one round of 8 loads in flight per
    // thread instead of two dependent rounds. Validity is kept per half and ORed where it is read.
    const int lr = tid & 127, r = row0 + lr, half = wg - 1;
    bool valid = false;
    unsigned long long tiles = 0ull;
    // v9: the first round of ancestor words goes out before the Q copies, whose issue then hides its
    // latency (each thread waits for the words only when it processes them below).
    uint32_t wd[8];
    if (r < rows_b && anc_b != nullptr) {
      const uint32_t* row = anc_b + static_cast<int64_t>(r / G) * p.words;
#pragma unroll
      for (int u = 0; u < 8; ++u) wd[u] = (8 * half + u) * 32 < n_b ? __ldg(row + 8 * half + u) : 0u;
    }
    if constexpr (kEarlyInputs) ddtree::kernels::pdl_wait();  // before the Q copies (q: the predecessor's)
    {  // Q: each consumer its 64 rows (rows past rows_b are zero), resident for the whole loop. Thread
       // wtid copies 16-byte chunk wtid % 16 of rows wtid / 16 + 8 k (k < 8): the (node, head) of the
       // row advances by 8 rows per step without a division.
      const int c = wg - 1, wtid = tid & 127, cc = wtid % CPR;
      int r0 = c * 64 + wtid / CPR;
      int gr = row0 + r0, node = gr / G, g = gr - node * G;
#pragma unroll 1
      for (int k = 0; k < 64 / (128 / CPR); ++k) {
        const bool ok = gr < rows_b;
        const __nv_bfloat16* src =
            p.q + (static_cast<int64_t>(t0 + node) * p.hq + static_cast<int64_t>(h) * G + g) * D + cc * 8;
        cp_async16(q_s + swz<BM>(r0, cc), ok ? src : p.q, ok);
        r0 += 128 / CPR;
        gr += 128 / CPR;
        g += 128 / CPR;
        while (g >= G) {  // at most 8 / G steps; one when G >= 8
          g -= G;
          ++node;
        }
      }
      cp_async_commit();
      if (tid == 128) DDTREE_TA_FA3_TRACE(9);
    }
    if (r < rows_b) {
      const int node = r / G;
      if (anc_b == nullptr) {
        if (half == 0) {
          valid = true;
          for (int j = 0; j <= node; j += 32) {
            const int lo = (ctx + j - tb0) / BN, hi = (ctx + min(j + 31, node) - tb0) / BN;
            tiles |= range64(lo, hi + 1);
          }
        }
      } else {
        const uint32_t* row = anc_b + static_cast<int64_t>(node) * p.words;
        for (int w0 = 8 * half; w0 * 32 < n_b; w0 += 16) {
          if (w0 != 8 * half) {  // later rounds (n_b > 512); the first one was loaded before the Q copies
#pragma unroll
            for (int u = 0; u < 8; ++u) wd[u] = (w0 + u) * 32 < n_b ? __ldg(row + w0 + u) : 0u;
          }
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            const int w = w0 + u;
            uint32_t word = wd[u];
            const int rem = n_b - w * 32;
            if (rem < 32) word &= rem > 0 ? (1u << rem) - 1u : 0u;
            if (!word) continue;
            valid = true;
            const int ta = (ctx + w * 32 - tb0) / BN;
            const int split_bit = (ta + 1) * BN + tb0 - ctx - w * 32;
            const uint32_t low = split_bit >= 32 ? word : (word & ((1u << split_bit) - 1u));
            if (low) tiles |= 1ull << ta;
            if (word & ~low) tiles |= 1ull << (ta + 1);
          }
        }
      }
    }
    s_row_valid[half * BM + lr] = valid;
    // One 32-bit shared atomic per half and warp (a 64-bit atomicOr on shared memory is a CAS loop).
    const uint32_t lo = __reduce_or_sync(0xffffffffu, static_cast<uint32_t>(tiles));
    const uint32_t hi = __reduce_or_sync(0xffffffffu, static_cast<uint32_t>(tiles >> 32));
    uint32_t* mask32 = reinterpret_cast<uint32_t*>(s_tile_mask);
    if ((tid & 31) == 0 && lo) atomicOr(mask32, lo);
    if ((tid & 31) == 0 && hi) atomicOr(mask32 + 1, hi);
    mbar_arrive(mask_bar);  // release: this thread's row flags and (lane 0) its warp's mask bits
    if (tid == 128) DDTREE_TA_FA3_TRACE(10);
  }
  // v10: the tile mask is published through mask_bar instead of a __syncthreads. Only the skipping of
  // tree tiles (the first key >= ctx that next_tile meets) and the epilogue's row flags read it, so
  // the producer goes on issuing context tiles and the consumers start on tile 0 as soon as Q and K_0
  // have landed, while the other consumer warps still build the mask.
  unsigned long long tile_mask = 0ull;
  bool have_mask = false;
  auto ensure_mask = [&]() {
    if (!have_mask) {
      mbar_wait(mask_bar, 0u);
      tile_mask = *reinterpret_cast<volatile unsigned long long*>(s_tile_mask);
      have_mask = true;
    }
  };
  if (!p.lazy_mask) ensure_mask();  // A/B switch: the v9b schedule (everyone waits here)
  if (tid == 0) DDTREE_TA_FA3_TRACE(2);
  auto next_tile = [&](int k0) {
    if (k0 < c_end && k0 >= ctx) {
      ensure_mask();
      while (k0 < c_end && !((tile_mask >> ((k0 - tb0) / BN)) & 1ull)) k0 = adv(k0);
    }
    return k0;
  };

  if (wg == 0) {
    // =================================== producer ===================================================
    regs_dealloc<C::PRODUCER_REGS>();
    // Tile j sits in ring stage st = j % 3 (also its s_rows buffer) in round ph = (j / 3) & 1; once
    // j >= 3 its stage's empty barrier is waited on with parity (j / 3 - 1) & 1 = ph ^ 1. sv, phv and
    // kt_prev are the same for tile j-1, whose V goes out in step j. Counters instead of j % 3, j / 3.
    // Steps 0 .. npre-1 ran in the prologue (npre <= 2 < ST: no empty waits there, round 0). Step j
    // issues K_j and V_{j-1}, so the V of tile npre-1 is still due in step npre.
    int j = npre;
    int st = j, ph = 0, sv = j >= 1 ? j - 1 : 0, phv = 0;
    int kt_prev = kStrided ? (j >= 2 ? k1 : c_begin) : c_begin + (j >= 1 ? (j - 1) * BN : 0);
    int kt = next_tile(kpre);  // == kpre when kpre_known (a context tile), whose page is already loaded
    if (!kpre_known && kt < c_end && kt + tid < kv_len) page_next = page_of(kt + tid);
    if (j == 1 && kt >= c_end) {  // a single tile: its V
      issue(v_ring, v_src0, 0, kv_len - c_begin - cp_g);
      cp_async_mbar_arrive(full_v);
    }
    for (; kt < c_end; ++j) {
      const int kn = next_tile(adv(kt));
      const int row = cache_row(kt + tid, page_next);
      if (kn < c_end && kn + tid < kv_len) page_next = page_of(kn + tid);  // consumed next tile
      s_rows[st * BN + rows_slot] = row;
      named_sync(5, 128);  // rows of tile j visible to every producer thread
      // K of tile j: its stage last held K of tile j-3, released once both consumers finished S_{j-3}.
      if (j >= ST) mbar_wait(empty_k + 8 * st, static_cast<uint32_t>(ph ^ 1));
      issue(k_ring + st * C::KV_BYTES, k_src0, st, kv_len - kt - cp_g);
      cp_async_mbar_arrive(full_k + 8 * st);
      // V of tile j-1 (needed together with K_j: iteration j issues S_j and P_{j-1} V_{j-1}).
      if (j >= 1) {
        if (j - 1 >= ST) mbar_wait(empty_v + 8 * sv, static_cast<uint32_t>(phv ^ 1));
        issue(v_ring + sv * C::KV_BYTES, v_src0, sv, kv_len - kt_prev - cp_g);
        cp_async_mbar_arrive(full_v + 8 * sv);
      }
      sv = st;
      phv = ph;
      kt_prev = kt;
      if (++st == ST) {
        st = 0;
        ph ^= 1;
      }
      kt = kn;
    }
    if (j >= 1 && !(npre == 1 && j == 1)) {  // V of the last tile (a single tile's V went above)
      if (j - 1 >= ST) mbar_wait(empty_v + 8 * sv, static_cast<uint32_t>(phv ^ 1));
      issue(v_ring + sv * C::KV_BYTES, v_src0, sv, kv_len - kt_prev - cp_g);
      cp_async_mbar_arrive(full_v + 8 * sv);
    }
    // Leave no copy in flight behind an exited thread (the consumers wait for all of them anyway).
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    ddtree::kernels::pdl_launch_dependents();  // the merge kernel may start launching (it waits for us)
    if (tid == 0) DDTREE_TA_FA3_TRACE(7);
    if (cmerge) {  // the producer's part of the consumers' two cluster barriers (see the epilogue)
      cluster_sync_all();
      cluster_sync_relaxed();
    }
  } else {
    // =================================== consumers ==================================================
    regs_alloc<C::CONSUMER_REGS>();
    if (tid == 128) DDTREE_TA_FA3_TRACE(11);
    const int c = wg - 1;  // consumer index: rows c*64 .. c*64+63 of the tile
    const int wtid = tid & 127, lane = tid & 31, warp = wtid >> 5;
    const int g4 = lane >> 2, t4 = lane & 3;
    const int wrow = c * 64 + warp * 16;  // this warp's first row in the CTA tile

    cp_async_wait<0>();
    fence_proxy_async();
    named_sync(3 + c, 128);
    if (tid == 128) DDTREE_TA_FA3_TRACE(3);
    // Shared-memory descriptors: desc(addr + off) = desc(addr) + off / 16 (the 14-bit address field
    // cannot carry: shared addresses stay below 256 KB), so each GEMM computes one base descriptor.
    // The broadcast makes q_wg provably warp-uniform, so its descriptor can live in uniform registers.
    const uint32_t q_wg = __shfl_sync(0xffffffffu, q_s + c * 64 * 128, 0);
    const uint64_t dq0 = wg_desc(q_wg, 16);

    // Ancestor rows of this thread's two rows (nullptr: causal).
    const uint32_t* rowp[2];
    int node_of[2];
    bool live[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int gr = row0 + wrow + g4 + 8 * hf;
      live[hf] = gr < rows_b;
      node_of[hf] = live[hf] ? gr / G : 0;
      rowp[hf] = anc_b ? anc_b + static_cast<int64_t>(node_of[hf]) * p.words : nullptr;
    }

    float acc[C::DT8][4];
    float s[C::NT8][4];
    uint32_t pa[BN / 16][4];
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f}, corr[2] = {1.f, 1.f};
#pragma unroll
    for (int j = 0; j < C::DT8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll
    for (int j = 0; j < C::NT8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int j = 0; j < BN / 16; ++j) pa[j][0] = pa[j][1] = pa[j][2] = pa[j][3] = 0u;

    auto issue_s = [&](uint32_t ks) { fa3_issue_s(s, dq0, ks); };
    auto issue_pv = [&](uint32_t vs) { fa3_issue_pv(acc, pa, vs); };
    // One arrival per warp on an empty barrier (after the wgmma wait that retired the reads).
    auto release = [&](uint32_t bar) {
      if (lane == 0) mbar_arrive(bar);
    };
    // Mask (tiles reaching past ctx) and online softmax of s in place; sets corr. The visibility words
    // are loaded before the wait for S (see the loop), so their latency hides behind the GEMMs.
    uint32_t vis[2][4];
    auto load_vis = [&](int kt) { fa3_load_vis(vis, rowp, live, node_of, kt, ctx, n_b); };
    auto softmax = [&](int kt) { fa3_softmax(p, s, vis, m_run, l_run, corr, kt, ctx, t4); };
    auto pack_p = [&]() { fa3_pack_p(pa, s); };
    auto rescale = [&]() { fa3_rescale(acc, corr); };  // skipped when no row of the warp moved

    // Ping-pong: named barrier 1 = "consumer 0 may issue", 2 = "consumer 1 may issue" (256 threads:
    // one side syncs, the other arrives). Consumer 0 goes first; every issue phase of consumer c is
    // followed by an arrive for the other, except consumer 1's last (nobody waits for it), so each
    // barrier sees exactly as many arrivals as syncs.
    int kt = next_tile(c_begin);
    if (kt < c_end) {
      if (c == 1) named_arrive(1, 256);
      int it = 0;
      int kn = next_tile(adv(kt));
      // ---- tile 0: S only ----
      mbar_wait(full_k, 0u);
      if (tid == 128) DDTREE_TA_FA3_TRACE(12);
      fence_proxy_async();  // the stage was written through the generic proxy (cp.async)
      named_sync(1 + c, 256);
      pin(s);
      wg_fence();
      issue_s(k_ring);
      wg_commit();
      if (!(c == 1 && kn >= c_end)) named_arrive(2 - c, 256);
      load_vis(kt);
      wg_wait0();
      pin(s);
      if (tid == 128) DDTREE_TA_FA3_TRACE(13);
      release(empty_k);  // S_0 no longer reads K_0
      softmax(kt);
      if (tid == 128) DDTREE_TA_FA3_TRACE(4);
      kt = kn;
      ++it;
      // ---- steady state: S of tile it with P.V of tile it-1 ----
      // The wait for P.V of tile it-2 sits at the top of the iteration, behind the (looping) full-
      // barrier waits: ptxas schedules wgmma.wait_group at the top of its basic block, so this keeps
      // tile it-1's softmax (end of the previous iteration) overlapped with that P.V.
      while (kt < c_end) {
        kn = next_tile(adv(kt));
        const int sk = it % ST, sv = (it - 1) % ST;
        mbar_wait(full_k + 8 * sk, static_cast<uint32_t>(it / ST) & 1u);
        pin(s);
        pin(m_run, l_run, corr);
        wg_wait0();
        pin(acc);
        pin(pa);
        if (it >= 2) release(empty_v + 8 * ((it - 2) % ST));  // P_{it-2} V_{it-2} is done
        pack_p();  // P of tile it-1
        fence_proxy_async();
        named_sync(1 + c, 256);
        pin(s);
        wg_fence();
        issue_s(k_ring + sk * C::KV_BYTES);
        wg_commit();
        rescale();  // by tile it-1's correction, before its P.V is added
        // V of tile it-1 is waited for only here (FA3's order): the producer issues it after K of tile
        // it, so S_it goes out as soon as K_it has landed and this wait overlaps S_it on the tensor pipe.
        mbar_wait(full_v + 8 * sv, static_cast<uint32_t>((it - 1) / ST) & 1u);
        fence_proxy_async();
        pin(acc);
        pin(pa);
        wg_fence();
        issue_pv(v_ring + sv * C::KV_BYTES);
        wg_commit();
        if (!(c == 1 && kn >= c_end)) named_arrive(2 - c, 256);
        load_vis(kt);
        wg_wait1();  // S of tile it done; P.V of tile it-1 may still run
        pin(s);
        release(empty_k + 8 * sk);
        softmax(kt);
        kt = kn;
        ++it;
      }
      // ---- last P.V ----
      const int sv = (it - 1) % ST;
      mbar_wait(full_v + 8 * sv, static_cast<uint32_t>((it - 1) / ST) & 1u);
      pin(s);
      pin(m_run, l_run, corr);
      wg_wait0();
      pin(acc);
      pin(pa);
      if (it >= 2) release(empty_v + 8 * ((it - 2) % ST));
      pack_p();
      fence_proxy_async();
      rescale();
      pin(acc);
      pin(pa);
      wg_fence();
      issue_pv(v_ring + sv * C::KV_BYTES);
      wg_commit();
      wg_wait0();
      pin(acc);
      pin(pa);
      release(empty_v + 8 * sv);
    }

    // ---- epilogue (as tree_attention_kernel with MT = 1) -------------------------------------------
    if (tid == 128) DDTREE_TA_FA3_TRACE(5);
    ddtree::kernels::pdl_launch_dependents();
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float l = l_run[hf];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      l_run[hf] = l;
    }
    ensure_mask();  // the row flags (s_row_valid) are the mask's
    constexpr float kLn2 = 0.69314718055994531f;
    if (nact == 1) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int lr = wrow + g4 + 8 * hf, gr = row0 + lr;
        if (gr >= rows_b) continue;
        const float l = l_run[hf];
        const bool valid = (s_row_valid[lr] | s_row_valid[BM + lr]) && l > 0.f;
        const float inv = valid ? 1.f / l : 0.f;
        const int64_t qrow = static_cast<int64_t>(t0 + gr / G) * p.hq + static_cast<int64_t>(h) * G + gr % G;
        __nv_bfloat16* orow = p.o + qrow * D;
#pragma unroll
        for (int j = 0; j < C::DT8; ++j)
          *reinterpret_cast<uint32_t*>(orow + j * 8 + 2 * t4) =
              pack_bf16(valid ? acc[j][2 * hf] * inv : 0.f, valid ? acc[j][2 * hf + 1] * inv : 0.f);
        if (p.lse && t4 == 0) p.lse[qrow] = valid ? (m_run[hf] + log2f(l)) * kLn2 : -INFINITY;
      }
    } else if (cmerge) {
      cluster_merge_epilogue(p, q_s, acc, m_run, l_run, s_row_valid, wg, wrow, g4, t4, lane, warp, split, nact,
                             row0, rows_b, t0, h, G);
    } else if (p.fused_merge) {
      const int64_t tile = (static_cast<int64_t>(b) * p.hkv + h) * p.row_tiles + rt;
      fused_merge_epilogue(p, acc, m_run, l_run, s_row_valid, reinterpret_cast<volatile int*>(small + C::FLAG_OFF),
                           tid, c * 4 + warp, wrow, g4, t4, lane, split, nact, tile * p.num_splits, p.merge_cnt + tile,
                           row0, rows_b, t0, h, G);
    } else {
      fa3_store_partials(p, acc, m_run, l_run, wrow, g4, t4, b, h, rt, split);
    }
    if (tid == 128) DDTREE_TA_FA3_TRACE(6);
  }
#endif
#endif
}

}  // namespace tree_attn
}  // namespace ddtree
