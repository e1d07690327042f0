// Self-checks of round_finish (tree_accept + kv_commit + round_update in one launch): random rounds run both
// ways on the same inputs — the three-launch sequence (tree_accept_fused, kv_commit, round_update, then the
// live-budget mask on the host) and ddtree_round_finish — and every output, every cache byte, every piece
// of slot state and the error flags must be equal. Covers greedy and sampled nodes, inactive slots, stop
// ids, ignore_stop, the length limit, 1/4/16-byte copy units, K-only caches, page sizes 1/5/16, vocabularies
// of one and two accept chunks, bf16 and fp32 logits; and the argument checks (too large a commit, a tail
// whose ctx_len is not the accept's).
#include <algorithm>
#include <cstring>
#include <vector>

#include "ddtree/kv_commit.h"
#include "ddtree/round_finish.h"
#include "ddtree/round_update.h"
#include "ddtree/tree_accept.h"
#include "selftest.h"

namespace {

struct Case {
  int batch, n_max, vocab, layers, row_bytes, page_size, hid_bytes;
  bool bf16, v_caches;
};

struct State {  // everything a round may change
  std::vector<int32_t> an, al, ci, bo, fi, ctx, out_len, root, r_tokens, r_count, r_finish, live, flags;
  std::vector<uint8_t> active, hidden;
  std::vector<std::vector<uint8_t>> caches;
};

void run_case(const Case& c, uint64_t seed) {
  st::Rng rng(seed);
  const int B = c.batch, N = c.n_max, V = c.vocab, T = 9;  // T: reported-token width (L + 1)
  // Trees: node i > 0 hangs under a random earlier node; a child's token is often its parent's argmax
  // so that walks go deep. Logits random, per node row.
  std::vector<float> logits(size_t(B) * N * V);
  for (auto& x : logits) x = rng.normal();
  std::vector<int32_t> tok(size_t(B) * N, -1), fc(size_t(B) * N, -1), ns(size_t(B) * N, -1), nn(B);
  for (int b = 0; b < B; ++b) {
    const int n = 1 + rng.below(N);
    nn[b] = n;
    std::vector<int> last(N, -1);
    for (int i = 0; i < n; ++i) {
      if (i == 0) {
        tok[size_t(b) * N] = rng.below(V);
        continue;
      }
      const int p = rng.below(std::min(i, 1 + rng.below(4) * 3 + (i > 3 ? i - 3 : 0)));
      const float* row = &logits[(size_t(b) * N + p) * V];
      const int best = int(std::max_element(row, row + V) - row);
      tok[size_t(b) * N + i] = rng.uniform() < 0.6f ? best : rng.below(V);
      if (last[p] < 0) fc[size_t(b) * N + p] = i;
      else ns[size_t(b) * N + last[p]] = i;
      last[p] = i;
    }
  }
  // Slot state. Capacity: ctx + N slots per request.
  const int max_pages = (64 + N + c.page_size - 1) / c.page_size;
  const int num_pages = B * max_pages + 2;
  std::vector<int32_t> pages(num_pages);
  for (int i = 0; i < num_pages; ++i) pages[i] = i;
  for (int i = num_pages - 1; i > 0; --i) std::swap(pages[i], pages[rng.below(i + 1)]);
  std::vector<int32_t> bt(pages.begin(), pages.begin() + size_t(B) * max_pages);
  std::vector<int32_t> ctx(B), max_new(B), out_len(B), root(B), live(B);
  std::vector<float> temp(B);
  std::vector<int64_t> sd(B);
  std::vector<uint8_t> active(B), ignore(B);
  for (int b = 0; b < B; ++b) {
    ctx[b] = rng.below(64);
    active[b] = rng.uniform() < 0.8f;
    ignore[b] = rng.uniform() < 0.3f;
    out_len[b] = rng.below(20);
    max_new[b] = out_len[b] + 1 + rng.below(12);
    root[b] = rng.below(V);
    live[b] = active[b] ? 1 + rng.below(N) : 0;
    temp[b] = rng.uniform() < 0.3f ? 0.7f : 0.f;
    sd[b] = int64_t(rng.next());
  }
  std::vector<int32_t> stops = {tok[1 % (size_t(B) * N)] >= 0 ? tok[1 % (size_t(B) * N)] : 3, V - 1};
  std::vector<uint8_t> hid(size_t(B) * N * c.hid_bytes), hidden(size_t(B) * c.hid_bytes);
  for (auto& x : hid) x = uint8_t(rng.next());
  for (auto& x : hidden) x = uint8_t(rng.next());
  const int n_caches = c.layers * (c.v_caches ? 2 : 1);
  const size_t cache_bytes = size_t(num_pages) * c.page_size * c.row_bytes;
  std::vector<std::vector<uint8_t>> caches(n_caches, std::vector<uint8_t>(cache_bytes));
  for (auto& h : caches)
    for (auto& x : h) x = uint8_t(rng.next());

  // Constant inputs.
  const st::DeviceLogits dev_logits(logits, c.bf16);
  const void* d_logits = dev_logits.ptr;
  const ddtree_dtype_t dt = c.bf16 ? DDTREE_DTYPE_BFLOAT16 : DDTREE_DTYPE_FLOAT32;
  st::DeviceBuffer<int32_t> d_tok(tok), d_fc(fc), d_ns(ns), d_nn(nn), d_bt(bt), d_max(max_new), d_stop(stops);
  st::DeviceBuffer<float> d_temp(temp);
  st::DeviceBuffer<int64_t> d_seed(sd);
  st::DeviceBuffer<uint8_t> d_ign(ignore), d_hid(hid);
  const size_t ws_bytes = ddtree_tree_accept_workspace_size(B, N, V);
  st::DeviceBuffer<uint8_t> ws(ws_bytes);
  st::DeviceBuffer<uint32_t> accept_counters(std::vector<uint32_t>(B, 0u));
  st::DeviceBuffer<int32_t> commit_counters(std::vector<int32_t>(B, 0));

  // Plans: 0 = the three launches, 1 = round_finish, 2 = round_finish with the one-CTA accept where it fits
  // (DDTREE_ACCEPT_ONE_CTA=1, compact scoring; the other plans run with it off), 3 = round_finish with session 6's scoring loop
  // and launch (DDTREE_ACCEPT_SCORE=unrolled, DDTREE_ACCEPT_PDL=0), 4 = round_finish with the compact scoring
  // and the early mode (PDL launch, ctx_len with num_nodes, block-table prefetch: DDTREE_ACCEPT_PDL=1).
  // Plans 0 and 1 use the library's defaults for the last two switches.
  constexpr int kPlans = 5;
  State got[kPlans];
  for (int plan = 0; plan < kPlans; ++plan) {
    const st::ScopedEnv one_cta("DDTREE_ACCEPT_ONE_CTA", plan == 2 ? "1" : "0");
    const st::ScopedEnv score("DDTREE_ACCEPT_SCORE", plan == 3 ? "unrolled" : plan >= 2 ? "compact" : nullptr);
    const st::ScopedEnv pdl("DDTREE_ACCEPT_PDL", plan == 3 ? "0" : plan == 4 ? "1" : nullptr);
    st::DeviceBuffer<int32_t> an(size_t(B) * N), al(B), ci(size_t(B) * N), bo(B), fi(B), d_ctx(ctx),
        d_out(out_len), d_root(root), d_rt(std::vector<int32_t>(size_t(B) * T, 77)), d_rc(std::vector<int32_t>(B, 77)),
        d_rf(std::vector<int32_t>(B, 77)), d_live(live), d_flags(std::vector<int32_t>{0});
    st::DeviceBuffer<uint8_t> d_act(active), d_hidden(hidden);
    std::vector<st::DeviceBuffer<uint8_t>> dc;
    std::vector<void*> kp(c.layers), vp(c.layers);
    for (int i = 0; i < n_caches; ++i) {
      dc.emplace_back(caches[i]);
      (i < c.layers ? kp[i] : vp[i - c.layers]) = dc.back().ptr;
    }
    an.poison();
    ci.poison();
    ws.poison();
    if (plan == 0) {
      ST_CHECK_STATUS(ddtree_tree_accept_fused(d_logits, dt, B, N, V, int64_t(N) * V, V, d_tok.ptr, d_fc.ptr,
                                               d_ns.ptr, d_nn.ptr, d_ctx.ptr, d_temp.ptr, d_seed.ptr, d_stop.ptr,
                                               int(stops.size()), N - 1, an.ptr, al.ptr, ci.ptr, bo.ptr, fi.ptr,
                                               ws.ptr, ws_bytes, accept_counters.ptr, d_flags.ptr, nullptr));
      ST_CHECK_STATUS(ddtree_kv_commit(kp.data(), c.v_caches ? vp.data() : nullptr, c.layers, num_pages,
                                       c.page_size, c.row_bytes, d_bt.ptr, B, max_pages, an.ptr, N, al.ptr,
                                       d_ctx.ptr, commit_counters.ptr, d_flags.ptr, nullptr));
      ST_CHECK_STATUS(ddtree_round_update(B, al.ptr, fi.ptr, bo.ptr, ci.ptr, N, an.ptr, N, d_hid.ptr, N, c.hid_bytes,
                                          d_act.ptr, d_ign.ptr, d_max.ptr, d_out.ptr, d_ctx.ptr, d_root.ptr,
                                          d_hidden.ptr, d_rt.ptr, T, d_rc.ptr, d_rf.ptr, d_flags.ptr, nullptr));
    } else {
      ddtree_round_tail_t tail = {};
      tail.k_caches = kp.data();
      tail.v_caches = c.v_caches ? vp.data() : nullptr;
      tail.num_layers = c.layers;
      tail.num_pages = num_pages;
      tail.page_size = c.page_size;
      tail.max_pages = max_pages;
      tail.kv_row_bytes = c.row_bytes;
      tail.block_table = d_bt.ptr;
      tail.hid = d_hid.ptr;
      tail.hid_rows = N;
      tail.hid_row_bytes = c.hid_bytes;
      tail.active = d_act.ptr;
      tail.ignore_stop = d_ign.ptr;
      tail.max_new = d_max.ptr;
      tail.out_len = d_out.ptr;
      tail.ctx_len = d_ctx.ptr;
      tail.root = d_root.ptr;
      tail.hidden = d_hidden.ptr;
      tail.r_tokens = d_rt.ptr;
      tail.tokens_width = T;
      tail.r_count = d_rc.ptr;
      tail.r_finish = d_rf.ptr;
      tail.live_budget = d_live.ptr;
      ST_CHECK_STATUS(ddtree_round_finish(d_logits, dt, B, N, V, int64_t(N) * V, V, d_tok.ptr, d_fc.ptr, d_ns.ptr,
                                          d_nn.ptr, d_ctx.ptr, d_temp.ptr, d_seed.ptr, d_stop.ptr, int(stops.size()),
                                          N - 1, an.ptr, al.ptr, ci.ptr, bo.ptr, fi.ptr, ws.ptr, ws_bytes, &tail,
                                          accept_counters.ptr, d_flags.ptr, nullptr));
    }
    ST_CUDA(cudaDeviceSynchronize());
    State& s = got[plan];
    s = State{an.download(), al.download(), ci.download(), bo.download(), fi.download(), d_ctx.download(),
              d_out.download(), d_root.download(), d_rt.download(), d_rc.download(), d_rf.download(),
              d_live.download(), d_flags.download(), d_act.download(), d_hidden.download(), {}};
    for (auto& d : dc) s.caches.push_back(d.download());
    if (plan == 0)  // the split path's live budget: the decode loop masks with active instead
      for (int b = 0; b < B; ++b) s.live[b] = s.active[b] ? live[b] : 0;
  }
  for (uint32_t v : accept_counters.download()) ST_REQUIRE(v == 0, "accept counters not back at zero");
  for (int32_t v : commit_counters.download()) ST_REQUIRE(v == 0, "commit counters not back at zero");
  static const char* const kPlanNames[kPlans] = {"three launches", "chunked accept", "one-CTA accept",
                                                  "chunked accept, session 6 scoring", "chunked accept, early mode"};
  for (int plan = 1; plan < kPlans; ++plan) {
    const State &a = got[0], &f = got[plan];
    const char* what = nullptr;
    if (a.an != f.an || a.al != f.al || a.ci != f.ci || a.bo != f.bo || a.fi != f.fi) what = "accept outputs";
    else if (a.caches != f.caches) what = "K/V caches";
    else if (a.ctx != f.ctx) what = "ctx_len";
    else if (a.out_len != f.out_len || a.root != f.root || a.active != f.active) what = "out_len/root/active";
    else if (a.r_tokens != f.r_tokens || a.r_count != f.r_count || a.r_finish != f.r_finish) what = "reported tokens";
    else if (a.hidden != f.hidden) what = "hidden state";
    else if (a.live != f.live) what = "live budget";
    else if (a.flags != f.flags) what = "error flags";
    ST_EXPECT(what == nullptr, "seed %llu (B %d N %d V %d layers %d row %d page %d hid %d %s %s, %s): %s differ",
              static_cast<unsigned long long>(seed), B, N, V, c.layers, c.row_bytes, c.page_size, c.hid_bytes,
              c.bf16 ? "bf16" : "f32", c.v_caches ? "K+V" : "K only", kPlanNames[plan],
              what ? what : "");
  }
  const State& a = got[0];
  // Something happened: some slot committed more than its root (else the cases would test nothing).
  int moved = 0;
  for (int b = 0; b < B; ++b) moved += a.al[b] > 1;
  ST_EXPECT(B < 3 || N < 8 || moved > 0, "seed %llu: no request accepted a node (weak case)", static_cast<unsigned long long>(seed));
}

}  // namespace

DDTREE_SELFTEST(round_finish_matches_three_launches) {
  const Case cases[] = {
      // B  N   V      layers row  page hid   bf16   v
      {1, 17, 320, 2, 256, 16, 512, false, true},    // the small e2e model's shape
      {8, 65, 320, 2, 256, 16, 512, true, true},
      {3, 8, 997, 3, 36, 5, 36, false, true},        // 4-byte units, pages inside trees
      {8, 33, 9000, 1, 6, 1, 6, true, false},        // 1-byte units, page size 1, K only, two vocab chunks
      {5, 2, 320, 4, 128, 16, 256, false, true},     // budget 1
      {4, 1, 320, 2, 256, 16, 512, false, true},     // budget 0: root only
      {2, 129, 1000, 2, 512, 16, 1024, true, true},  // a wide tree
  };
  uint64_t seed = 1;
  for (const Case& c : cases)
    for (int rep = 0; rep < 4; ++rep) run_case(c, seed++);
}

// A few small rounds for compute-sanitizer (memcheck / racecheck), which runs every launch slowly.
DDTREE_SELFTEST(round_finish_sanitizer_sized) {
  run_case({3, 17, 320, 2, 256, 16, 512, false, true}, 101);
  run_case({2, 9, 997, 1, 36, 5, 36, true, false}, 102);
  run_case({2, 33, 9000, 2, 6, 1, 6, false, true}, 103);
}

DDTREE_SELFTEST(round_finish_argument_checks) {
  ST_EXPECT(ddtree_round_finish_fits(2, 256, 16) == 1, "2 layers x 256 B must fit");
  ST_EXPECT(ddtree_round_finish_fits(16, 2048, 16) == 0, "16 layers x 2 KB must not fit (one CTA per request)");
  ST_EXPECT(ddtree_round_finish_fits(33, 16, 16) == 0, "more than the layer table must not fit");
  ST_EXPECT(ddtree_round_finish_fits(2, 36, 16) == 0, "a unit that does not divide the row must not fit");
  // A tail whose ctx_len differs from the accept's is refused before any launch.
  st::DeviceBuffer<int32_t> i32(64), other(4);
  st::DeviceBuffer<float> f(64 * 320);
  st::DeviceBuffer<int64_t> sd(4);
  st::DeviceBuffer<uint8_t> u8(4096), ws(ddtree_tree_accept_workspace_size(1, 4, 320));
  st::DeviceBuffer<uint32_t> cnt(std::vector<uint32_t>(4, 0u));
  void* caches[1] = {u8.ptr};
  ddtree_round_tail_t tail = {};
  tail.k_caches = caches;
  tail.num_layers = 1;
  tail.num_pages = 4;
  tail.page_size = 4;
  tail.max_pages = 4;
  tail.kv_row_bytes = 16;
  tail.block_table = i32.ptr;
  tail.hid = u8.ptr;
  tail.hid_rows = 4;
  tail.hid_row_bytes = 16;
  tail.active = u8.ptr;
  tail.ignore_stop = u8.ptr;
  tail.max_new = i32.ptr;
  tail.out_len = i32.ptr;
  tail.ctx_len = other.ptr;
  tail.root = i32.ptr;
  tail.hidden = u8.ptr;
  tail.r_tokens = i32.ptr;
  tail.tokens_width = 4;
  tail.r_count = i32.ptr;
  tail.r_finish = i32.ptr;
  auto call = [&]() {
    return ddtree_round_finish(f.ptr, DDTREE_DTYPE_FLOAT32, 1, 4, 320, 4 * 320, 320, i32.ptr, i32.ptr, i32.ptr,
                               i32.ptr, i32.ptr, f.ptr, sd.ptr, nullptr, 0, 3, i32.ptr, i32.ptr, i32.ptr, i32.ptr,
                               i32.ptr, ws.ptr, ws.count, &tail, cnt.ptr, i32.ptr, nullptr);
  };
  ST_EXPECT(call() == DDTREE_STATUS_INVALID_ARGUMENT, "a tail ctx_len other than the accept's must be refused");
  tail.ctx_len = i32.ptr;
  tail.num_layers = 1;
  tail.kv_row_bytes = 16 * 4096;  // 4096 work items > 2048
  ST_EXPECT(call() == DDTREE_STATUS_INVALID_ARGUMENT, "a commit too large for one CTA must be refused");
  ST_EXPECT(std::strstr(ddtree_last_error(), "kv_commit") != nullptr, "the message names the fallback: %s",
            ddtree_last_error());
  ST_EXPECT(ddtree_round_finish(f.ptr, DDTREE_DTYPE_FLOAT32, 1, 4, 320, 4 * 320, 320, i32.ptr, i32.ptr, i32.ptr,
                                i32.ptr, i32.ptr, f.ptr, sd.ptr, nullptr, 0, 3, i32.ptr, i32.ptr, i32.ptr, i32.ptr,
                                i32.ptr, ws.ptr, ws.count, nullptr, cnt.ptr, i32.ptr, nullptr) ==
                DDTREE_STATUS_INVALID_ARGUMENT,
            "a null tail must be refused");
}
