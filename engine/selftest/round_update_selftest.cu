// Self-checks of round_update on hand-built slots with literal expected state: a normal round, a
// round cut by a stop token, ignore_stop, the length limit, an inactive slot (its kv_commit advance
// undone, nothing else touched), and a bad node index (flag set, hidden state kept).
#include <cstring>
#include <vector>

#include "ddtree/round_update.h"
#include "selftest.h"

namespace {

void run_golden(int row_bytes) {
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
  std::vector<uint8_t> hid(size_t(B) * N * row_bytes), hidden(size_t(B) * row_bytes, 0xEE);
  for (size_t i = 0; i < hid.size(); ++i) hid[i] = uint8_t(i * 7 + 3);
  st::DeviceBuffer<int32_t> d_al(accept_len), d_fin(finished), d_bonus(bonus), d_com(committed),
      d_an(accept_nodes), d_max(max_new), d_out(out_len), d_ctx(ctx), d_root(root),
      d_tok(std::vector<int32_t>(B * T, 99)), d_cnt(std::vector<int32_t>(B, 99)),
      d_finish(std::vector<int32_t>(B, 99)), d_flags(std::vector<int32_t>{0});
  st::DeviceBuffer<uint8_t> d_act(active), d_ign(ignore), d_hid(hid), d_hidden(hidden);
  ST_CHECK_STATUS(ddtree_round_update(B, d_al.ptr, d_fin.ptr, d_bonus.ptr, d_com.ptr, Wc, d_an.ptr, Wa, d_hid.ptr, N,
                                      row_bytes, d_act.ptr, d_ign.ptr, d_max.ptr, d_out.ptr, d_ctx.ptr, d_root.ptr,
                                      d_hidden.ptr, d_tok.ptr, T, d_cnt.ptr, d_finish.ptr, d_flags.ptr, nullptr));
  ST_CUDA(cudaDeviceSynchronize());
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
