// round_finish: a round's whole tail in ONE launch — tree_accept's fused kernel whose last CTA per request,
// after the walk, also commits the accepted nodes' K/V (all layers) and does the slot bookkeeping.
//
// Same results as tree_accept_fused + kv_commit + round_update (+ the live budget below), which stay the
// path for commits too large for one CTA (launcher: kFinishMaxPairs). Why: on the small model those three
// launches cost 13-16 us per round on the H200 (tree_accept 7.4-10.1, kv_commit 3.1-3.4, round_update
// 2.3-2.6 plus the gaps): each is a short chain of dependent global reads, and two of the chains restart
// from loads the accept's last CTA already holds in shared memory (the path, the bonus, the counts).
// Measured (H200, same model): 10.8-11.2 µs for the one launch at budget 16/64 batch 1 and 8/16, 15.7 at
// 8/64, against 12.5-15.6 µs of busy time for the three launches plus ~1 µs of gaps and the mask the
// live budget removes (bench/NOTES.md, session 5). The tail itself costs 3-6 µs: it is a chain of dependent
// round trips (block table, then K/V rows, then stores) in one CTA. Session 7: 2.2-3.1 µs of the launch were the
// accept's instruction fetch (tree_accept/common.cuh, kAcceptScoreCompact); with the compact scoring and the early
// mode (the default at V <= 1024) 8.5 / 9.6 / 9.0 / 12.5 µs at batch 1/8 x budget 16/64.
//
// The tail, per request b, in the last CTA (256 threads):
//   prefetch (before the walk): one thread loads the slot's scalar state into shared memory, so that round trip
//     overlaps the walk's own loads (the one-CTA accept also prefetches the tree's block-table entries).
//   A: thread 0 applies slot_outcome (round_update's formulas) and writes out_len, r_count, r_finish, root,
//      active, ctx_len (= ctx + accept_len when active: kv_commit's advance, already net of round_update's
//      undo for inactive slots) and live_budget (zeroed when the slot stops); the other threads look up
//      the source and destination pages of every accepted row (kv_commit's checks and flags).
//   B: the K/V moves: work item (cache, copy unit) owned by one thread, which reads that unit of every
//      row of a 16-row tile before writing any (kv_commit's overlap argument: sources never precede
//      destinations); the hidden-state row copy and the reported tokens.
#pragma once

#include <cstdint>

#include "ddtree/kernels/kv_commit.cuh"
#include "ddtree/kernels/round_update.cuh"
#include "ddtree/kernels/tree_accept.cuh"

namespace ddtree {
namespace kernels {

constexpr int kFinishMaxLayers = 32;  // layer pointers passed by value
constexpr int kFinishMaxPairs = 8 * kAcceptThreads;  // (cache, copy unit) work items: <= 8 per thread

template <typename U>
__device__ __forceinline__ void copy_row_units(char* dst, const char* src, int64_t bytes) {
  const int64_t units = bytes / int64_t(sizeof(U));
  for (int64_t i = threadIdx.x; i < units; i += blockDim.x)
    reinterpret_cast<U*>(dst)[i] = reinterpret_cast<const U*>(src)[i];
}

// One (cache, unit) work item: move unit u of every accepted row (tiles of kCommitTile rows).
template <typename U>
__device__ __forceinline__ void move_unit(char* base, int64_t row_bytes, int u, int count, const int32_t* src_row,
                                          const int32_t* dst_row) {
  for (int i0 = 0; i0 < count; i0 += kCommitTile) {
    const int cnt = min(kCommitTile, count - i0);
    U val[kCommitTile];
#pragma unroll
    for (int r = 0; r < kCommitTile; ++r)
      if (r < cnt && src_row[i0 + r] >= 0)
        val[r] = reinterpret_cast<const U*>(base + int64_t(src_row[i0 + r]) * row_bytes)[u];
#pragma unroll
    for (int r = 0; r < kCommitTile; ++r)
      if (r < cnt && src_row[i0 + r] >= 0)
        reinterpret_cast<U*>(base + int64_t(dst_row[i0 + r]) * row_bytes)[u] = val[r];
  }
}

struct RoundTail {
  char* k[kFinishMaxLayers];
  char* v[kFinishMaxLayers];  // null when only K caches are given
  int num_layers, num_pages, page_size, max_pages;
  int64_t kv_row_bytes;
  int kv_unit;  // copy unit in bytes: 16, 4 or 1 (divides the row and every cache's base)
  const int32_t* block_table;
  const char* hid;
  int hid_rows;
  int hid_unit;
  int64_t hid_row_bytes;
  uint8_t* active;
  const uint8_t* ignore_stop;
  const int32_t* max_new;
  int32_t* out_len;
  int32_t* ctx_len;  // the accept's ctx_len: read by the walk, advanced here
  int32_t* root;
  char* hidden;
  int32_t* r_tokens;
  int tokens_width;
  int32_t* r_count;
  int32_t* r_finish;
  int32_t* live_budget;  // may be null

  // Slot state -> t.info[8..12], read after the walk's first barrier. With `pages`, also the block-table entries
  // of the slots [ctx, ctx + n_max) -> t.pages (first page index in info[5], count in info[6]; 0 when they do not
  // fit), so the commit's page lookups do not follow the walk with a global round trip. Taken by the one-CTA
  // accept (its prologue runs before the PDL wait) and by the chunked plan's last CTA when it already holds
  // ctx_len (`ctx_known` >= 0: its early mode loads it with num_nodes; otherwise the page loads would wait for
  // the ctx_len load before the walk's first barrier, so the chunked plan without it keeps session 5's order).
  __device__ __forceinline__ void prefetch(AcceptTreeSmem& t, int b, int n_max, bool pages, int ctx_known = -1) const {
    if (threadIdx.x == blockDim.x - 1) {
      const int ctx = ctx_known >= 0 ? ctx_known : ctx_len[b];
      t.info[8] = ctx;
      t.info[9] = active[b];
      t.info[10] = ignore_stop[b];
      t.info[11] = max_new[b];
      t.info[12] = out_len[b];
      int cnt = 0;
      int64_t first = 0;
      if (pages && ctx >= 0) {
        first = int64_t(ctx) / page_size;
        const int64_t last = (int64_t(ctx) + n_max - 1) / page_size;
        cnt = int(min(last + 1, int64_t(max_pages)) - first);
        cnt = cnt >= 1 && cnt <= kAcceptPageCache ? cnt : 0;
        for (int q = 0; q < cnt; ++q) t.pages[q] = block_table[int64_t(b) * max_pages + first + q];
      }
      t.info[5] = int(first);
      t.info[6] = cnt;
    }
  }

  __device__ __forceinline__ void operator()(AcceptTreeSmem& t, int b, int width, const WalkResult& w,
                                             int32_t* __restrict__ flags) const {
    const int ctx = t.info[8];
    const bool act = t.info[9] != 0;
    const int count = w.count;  // accepted rows to commit (<= width)
    // The walk is done with fc/ns: they hold the rows' source / destination row index in the cache
    // (page * page_size + offset), -1 for a row that stays (or is malformed and flagged).
    int32_t* src_row = t.fc;
    int32_t* dst_row = t.ns;
    if (threadIdx.x == 0) {
      const SlotOutcome o = slot_outcome(act, count, w.done, t.info[10] != 0, t.info[11], t.info[12]);
      out_len[b] = t.info[12] + o.n_new;
      r_count[b] = o.n_new;
      r_finish[b] = o.finish;
      if (act) {
        root[b] = w.last;
        ctx_len[b] = ctx + count;
      }
      active[b] = o.keep_active ? 1 : 0;
      if (live_budget != nullptr && !o.keep_active) live_budget[b] = 0;
      int node = -1;
      if (act) {
        node = t.path[max(count - 1, 0)];
        if (node >= hid_rows || node < 0) {
          raise_flag(flags, DDTREE_FLAG_BAD_INDEX);
          node = -1;
        }
      }
      t.info[13] = o.n_new;
      t.info[14] = node;
    }
    const int64_t slots = int64_t(max_pages) * page_size;
    const int32_t* bt = block_table + int64_t(b) * max_pages;
    const int64_t p0 = t.info[5];
    const int cached = t.info[6];
    auto page = [&](int64_t q) { return q - p0 >= 0 && q - p0 < cached ? t.pages[q - p0] : bt[q]; };
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      const int node = t.path[i];
      const int64_t s = int64_t(ctx) + node, d = int64_t(ctx) + i;
      int32_t sr = -1, dr = -1;
      if (node < i || s >= slots || d < 0) {
        raise_flag(flags, DDTREE_FLAG_BAD_INDEX);
      } else if (node != i) {
        const int sp = page(s / page_size), dp = page(d / page_size);
        if (sp < 0 || sp >= num_pages || dp < 0 || dp >= num_pages) {
          raise_flag(flags, DDTREE_FLAG_BAD_INDEX);
        } else {
          sr = int32_t(int64_t(sp) * page_size + s % page_size);
          dr = int32_t(int64_t(dp) * page_size + d % page_size);
        }
      }
      src_row[i] = sr;
      dst_row[i] = dr;
    }
    __syncthreads();
    const int n_new = t.info[13], node = t.info[14];
    for (int c = threadIdx.x; c < tokens_width; c += blockDim.x) {
      int32_t v = -1;
      if (c < n_new && c < width) v = c + 1 < w.len ? t.tok[t.path[c + 1]] : w.target;
      r_tokens[int64_t(b) * tokens_width + c] = v;
    }
    if (node >= 0) {
      const char* src = hid + (int64_t(b) * hid_rows + node) * hid_row_bytes;
      char* dst = hidden + int64_t(b) * hid_row_bytes;
      if (hid_unit == 16) copy_row_units<uint4>(dst, src, hid_row_bytes);
      else if (hid_unit == 4) copy_row_units<uint32_t>(dst, src, hid_row_bytes);
      else copy_row_units<uint8_t>(dst, src, hid_row_bytes);
    }
    const int units = int(kv_row_bytes / kv_unit);
    const int items = 2 * num_layers * units;
    for (int q = threadIdx.x; q < items; q += blockDim.x) {
      const int cache = q / units, u = q - cache * units;
      char* base = (cache & 1) ? v[cache >> 1] : k[cache >> 1];
      if (base == nullptr) continue;
      if (kv_unit == 16) move_unit<uint4>(base, kv_row_bytes, u, count, src_row, dst_row);
      else if (kv_unit == 4) move_unit<uint32_t>(base, kv_row_bytes, u, count, src_row, dst_row);
      else move_unit<uint8_t>(base, kv_row_bytes, u, count, src_row, dst_row);
    }
  }
};

}  // namespace kernels
}  // namespace ddtree
