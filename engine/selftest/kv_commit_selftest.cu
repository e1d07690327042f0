// Self-checks of kv_commit: overlapping chains, page boundaries, page sizes 1/16/64, many layers
// (more than one launch's worth), every untouched slot unchanged, ctx_len advanced, counters reset.
#include <cstring>
#include <vector>

#include "ddtree/kv_commit.h"
#include "selftest.h"

namespace {

struct CommitCase {
  int layers, page_size, row_bytes, batch, max_pages;
  std::vector<std::vector<int>> paths;  // accepted node paths per request
  std::vector<int> ctx;
  bool v_caches;
};

void run_commit(const CommitCase& c, uint64_t seed) {
  st::Rng rng(seed);
  const int width = 32;
  const int num_pages = c.batch * c.max_pages + 3;
  const size_t cache_bytes = size_t(num_pages) * c.page_size * c.row_bytes;
  // Each request gets a shuffled set of pages so that logical neighbours are physically apart.
  std::vector<int> pages(num_pages);
  for (int i = 0; i < num_pages; ++i) pages[i] = i;
  for (int i = num_pages - 1; i > 0; --i) std::swap(pages[i], pages[rng.below(i + 1)]);
  std::vector<int> block_table(size_t(c.batch) * c.max_pages);
  for (size_t i = 0; i < block_table.size(); ++i) block_table[i] = pages[i];
  std::vector<int> accept_nodes(size_t(c.batch) * width, -1), accept_len(c.batch);
  for (int b = 0; b < c.batch; ++b) {
    accept_len[b] = int(c.paths[b].size());
    for (size_t i = 0; i < c.paths[b].size(); ++i) accept_nodes[size_t(b) * width + i] = c.paths[b][i];
  }
  const int n_caches = c.layers * (c.v_caches ? 2 : 1);
  std::vector<std::vector<uint8_t>> host(n_caches, std::vector<uint8_t>(cache_bytes));
  std::vector<st::DeviceBuffer<uint8_t>> dev;
  std::vector<void*> kp(c.layers), vp(c.layers);
  for (int i = 0; i < n_caches; ++i) {
    for (auto& byte : host[i]) byte = uint8_t(rng.next());
    dev.emplace_back(host[i]);
    (i < c.layers ? kp[i] : vp[i - c.layers]) = dev.back().ptr;
  }
  st::DeviceBuffer<int32_t> d_bt(block_table), d_an(accept_nodes), d_al(accept_len), d_ctx(c.ctx),
      d_cnt(std::vector<int>(c.batch, 0)), d_flags(std::vector<int>{0});
  ST_CHECK_STATUS(ddtree_kv_commit(kp.data(), c.v_caches ? vp.data() : nullptr, c.layers, num_pages, c.page_size,
                                   c.row_bytes, d_bt.ptr, c.batch, c.max_pages, d_an.ptr, width, d_al.ptr, d_ctx.ptr,
                                   d_cnt.ptr, d_flags.ptr, nullptr));
  ST_CUDA(cudaDeviceSynchronize());
  // Host model: gather every source row first, then write.
  auto slot_offset = [&](int b, int s) {
    return (size_t(block_table[size_t(b) * c.max_pages + s / c.page_size]) * c.page_size + s % c.page_size) * c.row_bytes;
  };
  for (auto& h : host) {
    for (int b = 0; b < c.batch; ++b) {
      std::vector<std::vector<uint8_t>> rows;
      for (int node : c.paths[b]) {
        const size_t o = slot_offset(b, c.ctx[b] + node);
        rows.emplace_back(h.begin() + o, h.begin() + o + c.row_bytes);
      }
      for (size_t i = 0; i < rows.size(); ++i)
        std::memcpy(&h[slot_offset(b, c.ctx[b] + int(i))], rows[i].data(), c.row_bytes);
    }
  }
  int mismatched = 0;
  for (int i = 0; i < n_caches; ++i) mismatched += dev[i].download() != host[i];
  ST_EXPECT(mismatched == 0, "layers %d page %d row %d: %d of %d caches differ from the host model", c.layers,
            c.page_size, c.row_bytes, mismatched, n_caches);
  const auto ctx_after = d_ctx.download();
  const auto cnt_after = d_cnt.download();
  for (int b = 0; b < c.batch; ++b) {
    ST_EXPECT(ctx_after[b] == c.ctx[b] + accept_len[b], "ctx_len[%d] = %d, want %d", b, ctx_after[b],
              c.ctx[b] + accept_len[b]);
    ST_EXPECT(cnt_after[b] == 0, "counters[%d] = %d after the call", b, cnt_after[b]);
  }
  ST_EXPECT(d_flags.download()[0] == 0, "error flags set");
}

}  // namespace

DDTREE_SELFTEST(kv_commit_overlapping_chains_and_pages) {
  // [0,1,2,3] is a no-op chain; [0,5,9] moves rows 5 -> 1 and 9 -> 2 across page boundaries.
  run_commit({2, 4, 256, 2, 8, {{0, 1, 2, 3}, {0, 5, 9}}, {3, 6}, true}, 1);
  run_commit({3, 1, 64, 3, 40, {{0, 5, 9}, {0}, {0, 2, 3, 7, 8, 12, 13, 20}}, {0, 1, 5}, true}, 2);
  run_commit({2, 16, 512, 2, 6, {{0, 3, 4, 17, 18, 33}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}},
              {14, 30}, false}, 3);
  run_commit({1, 64, 2048, 1, 3, {{0, 40, 63, 64, 90}}, {60}, true}, 4);
}

DDTREE_SELFTEST(kv_commit_many_layers_and_odd_rows) {
  // 130 layers: two launches; ctx_len must advance exactly once.
  run_commit({130, 16, 256, 2, 4, {{0, 2, 7}, {0, 1, 9, 10}}, {5, 17}, true}, 5);
  // Rows of 6 and 36 bytes: 1-byte and 4-byte copy units.
  run_commit({3, 16, 6, 2, 4, {{0, 2, 7}, {0, 1, 9, 10}}, {5, 17}, true}, 6);
  run_commit({3, 16, 36, 1, 4, {{0, 4, 5, 11}}, {16}, true}, 7);
}
