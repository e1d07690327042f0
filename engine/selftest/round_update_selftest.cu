// Self-checks of round_update on hand-built slots with literal expected state: a normal round, a
// round cut by a stop token, ignore_stop, the length limit, an inactive slot (its kv_commit advance
// undone, nothing else touched), and a bad node index (flag set, hidden state kept). The same slots through
// commit_update (kv_commit + round_update + live budget in one launch): the same state, the K/V rows moved.
#include <cstring>
#include <vector>

#include "ddtree/commit_update.h"
#include "ddtree/round_update.h"
#include "selftest.h"

namespace {

// fused: run ddtree_commit_update on the context lengths before kv_commit (with K/V caches and a live budget)
// instead of ddtree_round_update on those after it.
void run_golden(int row_bytes, bool fused = false) {
  const int B = 6, Wc = 4, Wa = 4, N = 5, T = 3;
  // slot:                      0 normal  1 stop   2 ignore  3 length  4 inactive  5 bad node
  std::vector<int32_t> accept_len = {3, 2, 2, 4, 1, 2};
  std::vector<int32_t> finished = {0, 1, 1, 0, 0, 0};
  std::vector<int32_t> bonus = {70, 71, 72, 73, 74, 75};
  std::vector<int32_t> committed = {10, 11, 12, -1, 20, 21, -1, -1, 30, 31, -1, -1,
                                    40, 41, 42, 43, 50, -1, -1, -1, 60, 61, -1, -1};
  std::vector<int32_t> accept_nodes = {0, 2, 4, -1, 0, 1, -1, -1, 0, 3, -1, -1,
                                       0, 1, 2, 3,  0, -1, -1, -1, 0, 9, -1, -1};
  std::vector<uint8_t> active = {1, 1, 1, 1, 0, 1}, ignore = {0, 0, 1, 0, 0, 0};
  std::vector<int32_t> max_new = {100, 100, 100, 10, 100, 100}, out_len = {5, 5, 5, 8, 5, 5};
  std::vector<int32_t> ctx = {50, 50, 50, 50, 51, 50}, root = {1, 2, 3, 4, 5, 6};
  const std::vector<int32_t> ctx_before = {47, 48, 48, 46, 50, 48};  // kv_commit adds accept_len
  std::vector<uint8_t> hid(size_t(B) * N * row_bytes), hidden(size_t(B) * row_bytes, 0xEE);
  for (size_t i = 0; i < hid.size(); ++i) hid[i] = uint8_t(i * 7 + 3);
  st::DeviceBuffer<int32_t> d_al(accept_len), d_fin(finished), d_bonus(bonus), d_com(committed),
      d_an(accept_nodes), d_max(max_new), d_out(out_len), d_ctx(fused ? ctx_before : ctx), d_root(root),
      d_tok(std::vector<int32_t>(B * T, 99)), d_cnt(std::vector<int32_t>(B, 99)),
      d_finish(std::vector<int32_t>(B, 99)), d_flags(std::vector<int32_t>{0});
  st::DeviceBuffer<uint8_t> d_act(active), d_ign(ignore), d_hid(hid), d_hidden(hidden);
  // K and V caches of 2 layers for commit_update: 4-int32 rows holding (layer, k|v, b, slot), page size 4,
  // request b's 16 pages at b * 16 + reversed page order (sources and destinations in different pages).
  const int L = 2, P = 16, page = 4, row = 4, npages = B * P;
  std::vector<int32_t> table(B * P), cache_init(size_t(npages) * page * row);
  for (int b = 0; b < B; ++b)
    for (int q = 0; q < P; ++q) table[b * P + q] = b * P + (P - 1 - q);
  std::vector<st::DeviceBuffer<int32_t>> caches;
  std::vector<void*> kp, vp;
  for (int c = 0; c < 2 * L; ++c) {
    for (int b = 0; b < B; ++b)
      for (int s = 0; s < P * page; ++s)
        for (int e = 0; e < row; ++e)
          cache_init[((size_t(table[b * P + s / page]) * page + s % page) * row) + e] = c * 100000 + b * 1000 + s;
    caches.emplace_back(cache_init);
    (c % 2 ? vp : kp).push_back(caches.back().ptr);
  }
  std::vector<int32_t> live = {9, 9, 9, 9, 0, 9};
  st::DeviceBuffer<int32_t> d_table(table), d_live(live), d_counters(std::vector<int32_t>(B, 0));
  if (fused) {
    const ddtree_round_tail_t tail = {kp.data(), vp.data(), L, npages, page, P, row * 4, d_table.ptr, d_hid.ptr, N,
                                      row_bytes, d_act.ptr, d_ign.ptr, d_max.ptr, d_out.ptr, d_ctx.ptr, d_root.ptr,
                                      d_hidden.ptr, d_tok.ptr, T, d_cnt.ptr, d_finish.ptr, d_live.ptr};
    ST_CHECK_STATUS(ddtree_commit_update(B, d_an.ptr, Wa, d_al.ptr, d_fin.ptr, d_bonus.ptr, d_com.ptr, Wc, &tail,
                                         d_counters.ptr, d_flags.ptr, nullptr));
  } else {
    ST_CHECK_STATUS(ddtree_round_update(B, d_al.ptr, d_fin.ptr, d_bonus.ptr, d_com.ptr, Wc, d_an.ptr, Wa, d_hid.ptr,
                                        N, row_bytes, d_act.ptr, d_ign.ptr, d_max.ptr, d_out.ptr, d_ctx.ptr,
                                        d_root.ptr, d_hidden.ptr, d_tok.ptr, T, d_cnt.ptr, d_finish.ptr, d_flags.ptr,
                                        nullptr));
  }
  ST_CUDA(cudaDeviceSynchronize());
  if (fused) {
    // Slot ctx_before + i of every request (inactive ones too: kv_commit moves them) holds the row of slot
    // ctx_before + accept_nodes[i]; every other slot keeps its own.
    for (int c = 0; c < 2 * L; ++c) {
      const std::vector<int32_t> got = caches[c].download();
      int bad = 0;
      for (int b = 0; b < B; ++b)
        for (int s = 0; s < P * page; ++s) {
          const int i = s - ctx_before[b];
          const int src = i >= 0 && i < accept_len[b] ? ctx_before[b] + accept_nodes[b * Wa + i] : s;
          for (int e = 0; e < row; ++e)
            bad += got[((size_t(table[b * P + s / page]) * page + s % page) * row) + e] != c * 100000 + b * 1000 + src;
        }
      ST_EXPECT(bad == 0, "row %d: cache %d has %d wrong values after commit_update", row_bytes, c, bad);
    }
    const std::vector<int32_t> want_live = {9, 0, 9, 0, 0, 9};
    ST_EXPECT(d_live.download() == want_live, "row %d: live_budget differs", row_bytes);
    ST_EXPECT(d_counters.download() == std::vector<int32_t>(B, 0), "row %d: counters not left zero", row_bytes);
  }
  const std::vector<int32_t> want_tok = {10, 11, 12, 20, 21, -1, 30, 31, -1, 40, 41, -1, -1, -1, -1, 60, 61, -1};
  const std::vector<int32_t> want_cnt = {3, 2, 2, 2, 0, 2}, want_fin = {0, 1, 0, 2, 0, 0};
  const std::vector<int32_t> want_out = {8, 7, 7, 10, 5, 7}, want_ctx = {50, 50, 50, 50, 50, 50};
  const std::vector<int32_t> want_root = {70, 71, 72, 73, 5, 75};
  const std::vector<uint8_t> want_act = {1, 0, 1, 0, 0, 1};
  ST_EXPECT(d_tok.download() == want_tok, "row %d: r_tokens differ from the golden values", row_bytes);
  ST_EXPECT(d_cnt.download() == want_cnt, "row %d: r_count differs", row_bytes);
  ST_EXPECT(d_finish.download() == want_fin, "row %d: r_finish differs", row_bytes);
  ST_EXPECT(d_out.download() == want_out, "row %d: out_len differs", row_bytes);
  ST_EXPECT(d_ctx.download() == want_ctx, "row %d: ctx_len differs (inactive slot not restored?)", row_bytes);
  ST_EXPECT(d_root.download() == want_root, "row %d: root differs", row_bytes);
  ST_EXPECT(d_act.download() == want_act, "row %d: active differs", row_bytes);
  // Hidden: slot b takes hid[b, node] with node = accept_nodes[b][accept_len - 1]; 4 and 5 keep theirs.
  const int node_of[B] = {4, 1, 3, 3, -1, -1};
  std::vector<uint8_t> want_hidden(hidden);
  for (int b = 0; b < B; ++b)
    if (node_of[b] >= 0)
      std::memcpy(&want_hidden[size_t(b) * row_bytes], &hid[(size_t(b) * N + node_of[b]) * row_bytes], row_bytes);
  ST_EXPECT(d_hidden.download() == want_hidden, "row %d: hidden state differs", row_bytes);
  ST_EXPECT(d_flags.download()[0] == DDTREE_FLAG_BAD_INDEX, "row %d: bad node index not flagged", row_bytes);
}

}  // namespace

DDTREE_SELFTEST(round_update_golden) {
  run_golden(512);  // 16-byte copy unit
  run_golden(36);   // 4-byte unit
  run_golden(6);    // 1-byte unit
}

DDTREE_SELFTEST(commit_update_golden) {
  run_golden(512, true);
  run_golden(36, true);
  run_golden(6, true);
}
