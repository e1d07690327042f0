// Self-checks of build_tree: hand-built golden trees with literal expected outputs, then randomized
// cases compared with a host port of the reference heap (exact equality of every output) plus the tree
// invariants (prefix-closed, parent < child, depth, ancestor bits = path, positions, sibling lists).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <queue>
#include <string>
#include <vector>

#include "ddtree/build_tree.h"
#include "selftest.h"

namespace {

struct Tree {
  int n = 0;
  std::vector<int32_t> token, parent, depth, pos, fc, ns;
  std::vector<uint32_t> anc;
};

struct Request {
  std::vector<float> lp;  // [L][K]
  std::vector<int32_t> ids;
  int root = 0, ctx = 0, budget = 0;
};

// Host port of reference/build_tree.py::heap_pop_order + the output layout.
Tree host_build(const Request& r, int L, int K, int n_max) {
  struct Entry {
    double score;
    std::vector<int> ranks;
    int parent, depth, rank;
  };
  auto worse = [](const Entry& a, const Entry& b) {  // priority_queue keeps the "largest" on top
    if (a.score != b.score) return a.score < b.score;
    return a.ranks > b.ranks;  // lexicographic, a prefix before its extensions
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(worse)> heap(worse);
  const int W = (n_max + 31) / 32;
  const int M = std::min(std::max(r.budget, 0), n_max - 1);
  Tree t;
  t.token.assign(n_max, -1);
  t.parent.assign(n_max, -1);
  t.depth.assign(n_max, 0);
  t.pos.assign(n_max, r.ctx);
  t.fc.assign(n_max, -1);
  t.ns.assign(n_max, -1);
  t.anc.assign(size_t(n_max) * W, 0u);
  t.token[0] = r.root;
  t.anc[0] = 1u;
  t.n = 1;
  auto lp = [&](int d, int k) { return double(r.lp[size_t(d) * K + k]); };
  if (M > 0 && L > 0 && lp(0, 0) != -INFINITY) heap.push({lp(0, 0), {0}, 0, 1, 0});
  std::vector<int> last_child(n_max, -1);
  while (!heap.empty() && t.n <= M) {
    Entry e = heap.top();
    heap.pop();
    const int i = t.n++;
    t.token[i] = r.ids[size_t(e.depth - 1) * K + e.rank];
    t.parent[i] = e.parent;
    t.depth[i] = e.depth;
    t.pos[i] = r.ctx + e.depth;
    for (int w = 0; w < W; ++w) t.anc[size_t(i) * W + w] = t.anc[size_t(e.parent) * W + w];
    t.anc[size_t(i) * W + i / 32] |= 1u << (i % 32);
    if (last_child[e.parent] < 0) t.fc[e.parent] = i; else t.ns[last_child[e.parent]] = i;
    last_child[e.parent] = i;
    if (e.rank + 1 < K && lp(e.depth - 1, e.rank + 1) != -INFINITY) {
      Entry s{e.score - lp(e.depth - 1, e.rank) + lp(e.depth - 1, e.rank + 1), e.ranks, e.parent, e.depth, e.rank + 1};
      s.ranks.back() = e.rank + 1;
      heap.push(s);
    }
    if (e.depth < L && lp(e.depth, 0) != -INFINITY) {
      Entry c{e.score + lp(e.depth, 0), e.ranks, i, e.depth + 1, 0};
      c.ranks.push_back(0);
      heap.push(c);
    }
  }
  return t;
}

std::vector<Tree> device_build(const std::vector<Request>& reqs, int L, int K, int n_max) {
  const int B = int(reqs.size()), W = (n_max + 31) / 32;
  std::vector<float> lp;
  std::vector<int32_t> ids, root, ctx, budget;
  for (const auto& r : reqs) {
    lp.insert(lp.end(), r.lp.begin(), r.lp.end());
    ids.insert(ids.end(), r.ids.begin(), r.ids.end());
    root.push_back(r.root);
    ctx.push_back(r.ctx);
    budget.push_back(r.budget);
  }
  if (lp.empty()) { lp.push_back(0.f); ids.push_back(0); }  // L = 0: keep the pointers valid
  st::DeviceBuffer<float> d_lp(lp);
  st::DeviceBuffer<int32_t> d_ids(ids), d_root(root), d_ctx(ctx), d_budget(budget);
  const size_t nn = size_t(B) * n_max;
  st::DeviceBuffer<int32_t> token(nn), parent(nn), depth(nn), num(B), pos(nn), fc(nn), ns(nn);
  st::DeviceBuffer<uint32_t> anc(nn * W);
  for (auto* b : {&token, &parent, &depth, &num, &pos, &fc, &ns}) b->poison();  // unwritten shows up
  anc.poison();
  ST_CHECK_STATUS(ddtree_build_tree(d_lp.ptr, d_ids.ptr, d_root.ptr, d_ctx.ptr, d_budget.ptr, B, L, K, n_max,
                                    token.ptr, parent.ptr, depth.ptr, num.ptr, anc.ptr, pos.ptr, fc.ptr, ns.ptr,
                                    nullptr));
  ST_CUDA(cudaDeviceSynchronize());
  auto h_token = token.download(), h_parent = parent.download(), h_depth = depth.download(),
       h_num = num.download(), h_pos = pos.download(), h_fc = fc.download(), h_ns = ns.download();
  auto h_anc = anc.download();
  std::vector<Tree> out(B);
  for (int b = 0; b < B; ++b) {
    auto slice = [&](const std::vector<int32_t>& v) {
      return std::vector<int32_t>(v.begin() + size_t(b) * n_max, v.begin() + size_t(b + 1) * n_max);
    };
    Tree& t = out[b];
    t.n = h_num[b];
    t.token = slice(h_token); t.parent = slice(h_parent); t.depth = slice(h_depth);
    t.pos = slice(h_pos); t.fc = slice(h_fc); t.ns = slice(h_ns);
    t.anc.assign(h_anc.begin() + size_t(b) * n_max * W, h_anc.begin() + size_t(b + 1) * n_max * W);
  }
  return out;
}

// Every output equal, element by element (first differences are reported).
void expect_same(const Tree& got, const Tree& want, const char* what) {
  ST_EXPECT(got.n == want.n, "%s: num_nodes %d want %d", what, got.n, want.n);
  auto cmp = [&](const std::vector<int32_t>& g, const std::vector<int32_t>& w, const char* name) {
    for (size_t i = 0; i < w.size(); ++i)
      if (g[i] != w[i]) { ST_EXPECT(false, "%s: %s[%zu] = %d want %d", what, name, i, g[i], w[i]); return; }
    ST_EXPECT(true, "");
  };
  cmp(got.token, want.token, "node_token");
  cmp(got.parent, want.parent, "node_parent");
  cmp(got.depth, want.depth, "node_depth");
  cmp(got.pos, want.pos, "positions");
  cmp(got.fc, want.fc, "first_child");
  cmp(got.ns, want.ns, "next_sibling");
  bool anc_ok = got.anc == want.anc;
  ST_EXPECT(anc_ok, "%s: anc differs", what);
}

// Structural invariants that hold for any correct tree (independent of the host heap).
void expect_invariants(const Tree& t, const Request& r, int L, int K, int n_max) {
  const int W = (n_max + 31) / 32;
  bool ok = t.n >= 1 && t.n <= n_max && t.parent[0] == -1 && t.depth[0] == 0 && t.token[0] == r.root;
  std::vector<std::vector<int>> ranks(t.n);
  for (int p = 0; p < t.n && ok; ++p) {  // walk sibling lists: ranks 0, 1, 2, ... in order
    int c = t.fc[p], rank = 0;
    while (c != -1 && ok) {
      ok = c > p && c < t.n && t.parent[c] == p && t.depth[c] == t.depth[p] + 1 && t.depth[c] <= L;
      if (!ok) break;
      ranks[c] = ranks[p];
      ranks[c].push_back(rank);
      ok = t.token[c] == r.ids[size_t(t.depth[c] - 1) * K + rank] && t.pos[c] == r.ctx + t.depth[c];
      c = t.ns[c];
      ++rank;
    }
  }
  for (int i = 1; i < t.n && ok; ++i) ok = int(ranks[i].size()) == t.depth[i];  // reached from the root
  for (int i = 0; i < n_max && ok; ++i) {
    std::vector<uint32_t> want(W, 0u);
    for (int j = i < t.n ? i : -1; j >= 0; j = t.parent[j]) want[j / 32] |= 1u << (j % 32);
    for (int w = 0; w < W; ++w) ok = ok && t.anc[size_t(i) * W + w] == want[w];
    if (i >= t.n) ok = ok && t.parent[i] == -1 && t.token[i] == -1 && t.pos[i] == r.ctx && t.fc[i] == -1 && t.ns[i] == -1;
  }
  ST_EXPECT(ok, "tree invariants violated (n=%d)", t.n);
}

Request make_request(int L, int K, const std::vector<float>& lp, int budget, int root = 99, int ctx = 100) {
  Request r;
  r.lp = lp;
  r.ids.resize(size_t(L) * K);
  for (int d = 0; d < L; ++d)
    for (int k = 0; k < K; ++k) r.ids[size_t(d) * K + k] = 10 * (d + 1) + k;
  r.root = root;
  r.ctx = ctx;
  r.budget = budget;
  return r;
}

// The K largest log-probs, descending, of one draft-like row: log_softmax of `pool` >= K logits drawn as
// sharp * N(0, 1) (sharper rows put more mass on the head, so trees grow deeper).
std::vector<float> draft_row(st::Rng& rng, int K, float sharp, int pool) {
  std::vector<float> logits(std::max(K, pool));
  for (auto& x : logits) x = sharp * rng.normal();
  float mx = -INFINITY;
  for (float x : logits) mx = std::max(mx, x);
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x - mx));
  const float lse = mx + float(std::log(sum));
  std::sort(logits.begin(), logits.end(), [](float a, float c) { return a > c; });
  std::vector<float> row(static_cast<size_t>(K));
  for (int k = 0; k < K; ++k) row[size_t(k)] = logits[size_t(k)] - lse;
  return row;
}

void sort_row_desc(std::vector<float>& lp, int d, int K) {
  std::sort(lp.begin() + size_t(d) * K, lp.begin() + size_t(d + 1) * K, [](float a, float c) { return a > c; });
}

// A request over `lp` with a random root token, context length and token ids (ids do not shape the tree).
Request random_request(st::Rng& rng, int L, int K, const std::vector<float>& lp, int budget) {
  Request r = make_request(L, K, lp, budget, rng.below(160000), rng.below(70000));
  for (auto& id : r.ids) id = rng.below(160000);
  return r;
}

// One launch over `reqs`; every tree equals the host heap's, and (except request `no_invariants`, whose rows
// break the rank walk the invariants use) satisfies the tree invariants.
void expect_batch_matches_host(const std::vector<Request>& reqs, int L, int K, int n_max, const char* label,
                               int no_invariants = -1) {
  auto got = device_build(reqs, L, K, n_max);
  for (size_t b = 0; b < reqs.size(); ++b) {
    std::string what = st::format("%s L=%d K=%d b=%d budget=%d", label, L, K, int(b), reqs[b].budget);
    expect_same(got[b], host_build(reqs[b], L, K, n_max), what.c_str());
    if (int(b) != no_invariants) expect_invariants(got[b], reqs[b], L, K, n_max);
  }
}

}  // namespace

// The hand-worked 3-level example of the reference tests (dyadic scores, one exact tie at -2.25).
DDTREE_SELFTEST(build_tree_golden_three_levels) {
  Request r = make_request(3, 2, {-0.5f, -1.0f, -0.25f, -2.0f, -1.0f, -1.5f}, 7);
  Tree t = device_build({r}, 3, 2, 10)[0];
  ST_EXPECT(t.n == 8, "num_nodes %d", t.n);
  ST_EXPECT((t.token == std::vector<int32_t>{99, 10, 20, 11, 20, 30, 31, 30, -1, -1}), "node_token");
  ST_EXPECT((t.parent == std::vector<int32_t>{-1, 0, 1, 0, 3, 2, 2, 4, -1, -1}), "node_parent");
  ST_EXPECT((t.depth == std::vector<int32_t>{0, 1, 2, 1, 2, 3, 3, 3, 0, 0}), "node_depth");
  ST_EXPECT((t.pos == std::vector<int32_t>{100, 101, 102, 101, 102, 103, 103, 103, 100, 100}), "positions");
  ST_EXPECT((t.anc == std::vector<uint32_t>{1, 3, 7, 9, 25, 39, 71, 153, 0, 0}), "anc");
  ST_EXPECT((t.fc == std::vector<int32_t>{1, 2, 5, 4, 7, -1, -1, -1, -1, -1}), "first_child");
  ST_EXPECT((t.ns == std::vector<int32_t>{-1, 3, -1, -1, -1, 6, -1, -1, -1, -1}), "next_sibling");
}

DDTREE_SELFTEST(build_tree_golden_ties_chain_star_root) {
  // (0,0) and (1) both score -2: the prefix-ordered tuple (0,0) pops first.
  Tree a = device_build({make_request(2, 2, {-1.f, -2.f, -1.f, -3.f}, 4)}, 2, 2, 5)[0];
  ST_EXPECT((a.parent == std::vector<int32_t>{-1, 0, 1, 0, 3}), "tie: node_parent");
  // K = 1: a chain that stops when candidates run out.
  Tree c = device_build({make_request(4, 1, {-0.1f, -0.2f, -0.3f, -0.4f}, 10)}, 4, 1, 12)[0];
  ST_EXPECT(c.n == 5, "chain: num_nodes %d", c.n);
  ST_EXPECT((c.parent == std::vector<int32_t>{-1, 0, 1, 2, 3, -1, -1, -1, -1, -1, -1, -1}), "chain: node_parent");
  // L = 1: a star of the best ranks.
  Tree s = device_build({make_request(1, 5, {-0.5f, -1.f, -1.5f, -2.f, -2.5f}, 3)}, 1, 5, 4)[0];
  ST_EXPECT((s.token == std::vector<int32_t>{99, 10, 11, 12}), "star: node_token");
  ST_EXPECT((s.ns == std::vector<int32_t>{-1, 2, 3, -1}), "star: next_sibling");
  // Budget 0: root only, padding everywhere else.
  Tree z = device_build({make_request(2, 2, {-1.f, -2.f, -1.f, -3.f}, 0, 7, 0)}, 2, 2, 4)[0];
  ST_EXPECT(z.n == 1 && (z.token == std::vector<int32_t>{7, -1, -1, -1}) &&
                (z.anc == std::vector<uint32_t>{1, 0, 0, 0}) && (z.pos == std::vector<int32_t>{0, 0, 0, 0}),
            "budget 0: root-only tree");
  // -inf ranks are not candidates.
  Tree m = device_build({make_request(2, 3, {-0.5f, -1.f, -INFINITY, -1.f, -INFINITY, -INFINITY}, 10)}, 2, 3, 8)[0];
  ST_EXPECT(m.n == 5 && (m.parent == std::vector<int32_t>{-1, 0, 0, 1, 2, -1, -1, -1}), "-inf: node_parent (n=%d)", m.n);
}

// Random draft-like log-probs (sorted log-softmax of normal logits), mixed budgets, L up to 15,
// K up to 1024, B up to 8: exact equality with the host heap + invariants.
DDTREE_SELFTEST(build_tree_random_vs_host_heap) {
  struct Shape { int B, L, K, n_max; };
  const Shape shapes[] = {{1, 15, 64, 257}, {8, 15, 32, 1025}, {2, 15, 1024, 1025}, {3, 7, 16, 301},
                          {4, 1, 128, 65}, {2, 15, 1, 21}, {2, 3, 4, 1025}, {1, 40, 3, 201}};
  st::Rng rng(12345);
  for (const Shape& s : shapes) {
    for (int kind = 0; kind < 3; ++kind) {  // 0: draft-like, 1: dyadic ties, 2: flat (many near-ties)
      std::vector<Request> reqs;
      for (int b = 0; b < s.B; ++b) {
        std::vector<float> lp(size_t(s.L) * s.K);
        for (int d = 0; d < s.L; ++d) {
          std::vector<float> logits(std::max(s.K, 256));
          for (auto& x : logits) x = kind == 1 ? float(rng.below(6)) * 0.5f : (kind == 2 ? 0.3f : 3.f) * rng.normal();
          float mx = -INFINITY;
          for (float x : logits) mx = std::max(mx, x);
          double sum = 0;
          for (float x : logits) sum += std::exp(double(x - mx));
          const float lse = mx + float(std::log(sum));
          std::sort(logits.begin(), logits.end(), [](float a, float b) { return a > b; });
          for (int k = 0; k < s.K; ++k) {
            float v = logits[k] - lse;
            if (kind == 1) v = -float(rng.below(9)) * 0.25f;  // dyadic: exact ties
            lp[size_t(d) * s.K + k] = v;
          }
          if (kind == 1) std::sort(lp.begin() + size_t(d) * s.K, lp.begin() + size_t(d + 1) * s.K, [](float a, float b) { return a > b; });
        }
        Request r = make_request(s.L, s.K, lp, 0, rng.below(160000), rng.below(70000));
        for (auto& id : r.ids) id = rng.below(160000);
        const int choices[] = {0, 1, 2, 7, 15, 64, 256, 1024};
        r.budget = choices[rng.below(8)];
        reqs.push_back(r);
      }
      auto got = device_build(reqs, s.L, s.K, s.n_max);
      for (int b = 0; b < s.B; ++b) {
        std::string what = st::format("B=%d L=%d K=%d kind=%d b=%d budget=%d", s.B, s.L, s.K, kind, b, reqs[b].budget);
        expect_same(got[b], host_build(reqs[b], s.L, s.K, s.n_max), what.c_str());
        expect_invariants(got[b], reqs[b], s.L, s.K, s.n_max);
      }
    }
  }
}

// One mid-size batch that runs every parallel phase at once (chain bound, block levels, pool raises,
// the tighten, the packed sort's shared-memory stages and its tie runs): small enough for
// compute-sanitizer racecheck, which the device script runs on it.
DDTREE_SELFTEST(build_tree_medium_all_phases) {
  const int L = 15, K = 64, n_max = 257;
  st::Rng rng(777);
  std::vector<Request> reqs;
  for (int kind = 0; kind < 3; ++kind) {  // draft-like, dyadic ties, flat
    std::vector<float> lp(size_t(L) * K);
    for (int d = 0; d < L; ++d) {
      std::vector<float> logits(256);
      for (auto& x : logits) x = (kind == 2 ? 0.3f : 3.f) * rng.normal();
      float mx = -INFINITY;
      for (float x : logits) mx = std::max(mx, x);
      double sum = 0;
      for (float x : logits) sum += std::exp(double(x - mx));
      const float lse = mx + float(std::log(sum));
      std::sort(logits.begin(), logits.end(), [](float a, float b) { return a > b; });
      for (int k = 0; k < K; ++k) lp[size_t(d) * K + k] = kind == 1 ? -float(rng.below(9)) * 0.25f : logits[k] - lse;
      if (kind == 1) std::sort(lp.begin() + size_t(d) * K, lp.begin() + size_t(d + 1) * K, [](float a, float b) { return a > b; });
    }
    Request r = make_request(L, K, lp, 256, rng.below(160000), rng.below(70000));
    for (auto& id : r.ids) id = rng.below(160000);
    reqs.push_back(r);
  }
  auto got = device_build(reqs, L, K, n_max);
  for (size_t b = 0; b < reqs.size(); ++b) {
    std::string what = st::format("medium kind=%d", int(b));
    expect_same(got[b], host_build(reqs[b], L, K, n_max), what.c_str());
    expect_invariants(got[b], reqs[b], L, K, n_max);
  }
}

// Large budgets (v10's range, M > 64, L = 15): draft-like rows at M = 100 / 256 / 512 and sharpness 1 / 4 / 8,
// duplicate log-probs at the edge of the tree (sibling ties v10 orders itself), 1/64-quantized rows (ties
// across branches, handed back to the older paths). Small enough for racecheck.
DDTREE_SELFTEST(build_tree_large_budgets) {
  const int L = 15, n_max = 513;
  st::Rng rng(9090);
  for (int K : {64, 1024}) {
    std::vector<Request> reqs;
    const float sharp[] = {1.f, 4.f, 8.f, 4.f, 4.f};
    const int budgets[] = {256, 512, 100, 256, 200};
    for (int b = 0; b < 5; ++b) {
      std::vector<float> lp(size_t(L) * K);
      for (int d = 0; d < L; ++d) {
        const std::vector<float> row = draft_row(rng, K, sharp[b], 2048);
        for (int k = 0; k < K; ++k)  // b = 4 quantized: exact ties across branches
          lp[size_t(d) * K + k] = b == 4 ? std::round(row[size_t(k)] * 64.f) / 64.f : row[size_t(k)];
        if (b == 3 && d == 0) for (int k = 40; k < 44; ++k) lp[k] = lp[40];  // duplicate depth-1 log-probs
        sort_row_desc(lp, d, K);
      }
      reqs.push_back(random_request(rng, L, K, lp, budgets[b]));
    }
    expect_batch_matches_host(reqs, L, K, n_max, "large");
  }
}

// Small budgets (v8's range, M <= 64, L = 15): draft-like rows at several sharpnesses (one needs v8's
// second probe stage), a row head of exactly 0 (a tie inside a family), dyadic ties (handed back to the
// older paths), K = M and K = 1024 shapes of the decoder and the bench. Small enough for racecheck.
DDTREE_SELFTEST(build_tree_small_budgets) {
  const int L = 15, n_max = 65;
  st::Rng rng(4242);
  for (int K : {16, 64, 1024}) {
    std::vector<Request> reqs;
    const float sharp[] = {1.f, 3.f, 8.f, 8.f, 3.f, 3.f};
    const int budgets[] = {64, 16, 64, 63, 64, 40};
    for (int b = 0; b < 6; ++b) {
      std::vector<float> lp(size_t(L) * K);
      for (int d = 0; d < L; ++d) {
        const std::vector<float> row = draft_row(rng, K, sharp[b], 2048);
        for (int k = 0; k < K; ++k)  // b = 5 dyadic: exact ties across families
          lp[size_t(d) * K + k] = b == 5 ? -float(rng.below(9)) * 0.25f : row[size_t(k)];
        if (b == 4 && d >= 1 && d <= 3) lp[size_t(d) * K] = 0.f;  // probability 1 in fp32: a zero row head
        sort_row_desc(lp, d, K);
      }
      reqs.push_back(random_request(rng, L, K, lp, budgets[b]));
    }
    expect_batch_matches_host(reqs, L, K, n_max, "small");
  }
}

// The warp heap's range (launches with n_max <= 65, L <= 16: v9 under the default): -inf padding and a
// depth without candidates, K < M, unsorted and positive rows (the heap's own arithmetic), one-ulp-apart
// and exactly tied scores (its exact mode), L = 1 and 16, budgets 0..64 mixed in one launch.
DDTREE_SELFTEST(build_tree_warp_heap_edges) {
  st::Rng rng(606);
  auto drafted = [&](int L, int K, float sharp) {
    std::vector<float> lp;
    for (int d = 0; d < L; ++d) {
      const std::vector<float> row = draft_row(rng, K, sharp, 512);
      lp.insert(lp.end(), row.begin(), row.end());
    }
    return lp;
  };
  for (int L : {1, 15, 16}) {
    for (int K : {8, 64}) {
      std::vector<Request> reqs;
      const int budgets[] = {64, 0, 1, 33, 17, 64, 64, 64};
      for (int b = 0; b < 8; ++b) {
        std::vector<float> lp = drafted(L, K, b < 4 ? 3.f : 6.f);
        if (b == 5) {  // -inf padding, and (L > 2) a depth with no candidate at all
          for (int d = 0; d < L; ++d)
            for (int k = K / 2; k < K; ++k) lp[size_t(d) * K + k] = -INFINITY;
          if (L > 2) for (int k = 0; k < K; ++k) lp[size_t(2) * K + k] = -INFINITY;
        }
        if (b == 6) {  // unsorted and positive
          std::reverse(lp.begin(), lp.begin() + K);
          lp[size_t(L - 1) * K] = 0.5f;
        }
        if (b == 7) {  // one ulp apart at the head, and an exact tie between two branches
          if (K > 1) lp[1] = std::nextafter(lp[0], -INFINITY);
          if (L > 1 && K > 1) lp[size_t(1) * K + 1] = lp[size_t(1) * K];
        }
        reqs.push_back(random_request(rng, L, K, lp, budgets[b]));
      }
      expect_batch_matches_host(reqs, L, K, 65, "warp heap", /*no_invariants=*/6);  // 6: unsorted rows
    }
  }
}

// v11 (build_tree/v11.cuh, opt-in: DDTREE_BUILD_TREE_IMPL=v11, set here for the case and restored): the
// bench's shapes (M = 64 / 256 / 1024, K = 64 / 1024, sharpness 1 / 4 / 8), sibling ties (duplicate
// log-probs) and ties across branches (1/64-quantized rows), -inf padding, K < M, budgets 0..M in one launch,
// and unsorted / positive rows (handed back to the v8auto choice in the same launch).
DDTREE_SELFTEST(build_tree_v11) {
  const char* before = std::getenv("DDTREE_BUILD_TREE_IMPL");
  const std::string saved = before ? before : "";
  setenv("DDTREE_BUILD_TREE_IMPL", "v11", 1);
  const int L = 15;
  st::Rng rng(1111);
  for (int K : {64, 1024}) {
    std::vector<Request> reqs;
    const float sharp[] = {1.f, 4.f, 8.f, 4.f, 4.f, 3.f, 6.f, 4.f};
    const int budgets[] = {256, 256, 256, 200, 200, 130, 0, 64};
    for (int b = 0; b < 8; ++b) {
      std::vector<float> lp(size_t(L) * K);
      for (int d = 0; d < L; ++d) {
        const std::vector<float> row = draft_row(rng, K, sharp[b], 2048);
        for (int k = 0; k < K; ++k)  // b = 4 quantized: exact ties across branches
          lp[size_t(d) * K + k] = b == 4 ? std::round(row[size_t(k)] * 64.f) / 64.f : row[size_t(k)];
        if (b == 3) for (int k = 3; k < 9; ++k) lp[size_t(d) * K + k] = lp[size_t(d) * K + 3];  // sibling ties
        if (b == 5) for (int k = K / 3; k < K; ++k) lp[size_t(d) * K + k] = -INFINITY;  // -inf padding
        sort_row_desc(lp, d, K);
      }
      if (b == 7) lp[size_t(2) * K] = 0.25f;  // positive: handed back
      reqs.push_back(random_request(rng, L, K, lp, budgets[b]));
    }
    expect_batch_matches_host(reqs, L, K, 257, "v11", /*no_invariants=*/7);
  }
  for (int K : {64, 1024}) {
    std::vector<Request> reqs;
    for (int b = 0; b < 2; ++b) {
      std::vector<float> lp(size_t(L) * K);
      for (int d = 0; d < L; ++d) {
        const std::vector<float> row = draft_row(rng, K, b == 0 ? 4.f : 8.f, 2048);
        std::copy(row.begin(), row.end(), lp.begin() + size_t(d) * K);
      }
      reqs.push_back(random_request(rng, L, K, lp, b == 0 ? 1024 : 700));
    }
    expect_batch_matches_host(reqs, L, K, 1025, "v11 M=1024");
  }
  std::vector<Request> reqs;  // budgets 0..64 in one launch, K = 16 < M
  for (int b = 0; b <= 64; b += 4) {
    std::vector<float> lp(size_t(L) * 16);
    for (int d = 0; d < L; ++d) {
      const std::vector<float> row = draft_row(rng, 16, 3.f, 512);
      std::copy(row.begin(), row.end(), lp.begin() + size_t(d) * 16);
    }
    reqs.push_back(random_request(rng, L, 16, lp, b));
  }
  expect_batch_matches_host(reqs, L, 16, 65, "v11 budgets");
  if (before) setenv("DDTREE_BUILD_TREE_IMPL", saved.c_str(), 1); else unsetenv("DDTREE_BUILD_TREE_IMPL");
}

// Inputs that the parallel path must hand to the exact serial fallback.
DDTREE_SELFTEST(build_tree_fallback_inputs) {
  const int L = 15, K = 64, n_max = 1025;
  std::vector<Request> reqs;
  reqs.push_back(make_request(L, K, std::vector<float>(size_t(L) * K, 0.f), 1024));  // all scores tie
  std::vector<float> unsorted(size_t(L) * K);
  for (size_t i = 0; i < unsorted.size(); ++i) unsorted[i] = -float((i * 37) % 101) * 0.125f;
  reqs.push_back(make_request(L, K, unsorted, 300));
  std::vector<float> inexact(size_t(L) * K, -40.f);
  inexact[0] = -6.6857430702782494e-09f; inexact[1] = -20.f; inexact[2] = -21.f;
  inexact[K + 0] = -5.3228440284729f; inexact[K + 1] = -24.36475944519043f; inexact[K + 2] = -34.079593658447266f;
  reqs.push_back(make_request(L, K, inexact, 200));
  auto got = device_build(reqs, L, K, n_max);
  const char* names[] = {"all-zero", "unsorted", "inexact"};
  for (size_t b = 0; b < reqs.size(); ++b) {
    expect_same(got[b], host_build(reqs[b], L, K, n_max), names[b]);
    expect_invariants(got[b], reqs[b], L, K, n_max);
  }
}

DDTREE_SELFTEST(build_tree_rejects_bad_arguments) {
  int32_t* p = reinterpret_cast<int32_t*>(16);
  uint32_t* u = reinterpret_cast<uint32_t*>(16);
  const float* f = reinterpret_cast<const float*>(16);
  ST_EXPECT(ddtree_build_tree(f, p, p, p, p, 1, 64, 4, 8, p, p, p, p, u, p, p, p, nullptr) == DDTREE_STATUS_INVALID_ARGUMENT, "L=64");
  ST_EXPECT(ddtree_build_tree(f, p, p, p, p, 1, 4, 0, 8, p, p, p, p, u, p, p, p, nullptr) == DDTREE_STATUS_INVALID_ARGUMENT, "K=0");
  ST_EXPECT(ddtree_build_tree(f, p, p, p, p, 1, 4, 4, 1026, p, p, p, p, u, p, p, p, nullptr) == DDTREE_STATUS_INVALID_ARGUMENT, "n_max=1026");
  ST_EXPECT(ddtree_build_tree(f, p, p, p, p, 1, 4, 4, 8, p, p, p, p, nullptr, p, p, p, nullptr) == DDTREE_STATUS_INVALID_ARGUMENT, "anc NULL");
  ST_EXPECT(ddtree_build_tree(f, p, p, p, p, 0, 4, 4, 8, p, p, p, p, u, p, p, p, nullptr) == DDTREE_STATUS_SUCCESS, "B=0 is a no-op");
}
