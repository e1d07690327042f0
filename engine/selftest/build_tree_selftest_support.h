// Shared pieces of the build_tree self-checks: a host port of the reference heap with the kernel's output
// layout, the device call, exact comparison, the tree invariants and the row generators. Included by
// build_tree_selftest.cu (golden, random, fallback and argument cases) and build_tree_paths_selftest.cu (the
// cases that pin each kernel path: medium phases, large/small budgets, warp heap, v11).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <queue>
#include <string>
#include <vector>

#include "ddtree/build_tree.h"
#include "selftest.h"

namespace bt_selftest {

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
inline Tree host_build(const Request& r, int L, int K, int n_max) {
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

inline std::vector<Tree> device_build(const std::vector<Request>& reqs, int L, int K, int n_max) {
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
inline void expect_same(const Tree& got, const Tree& want, const char* what) {
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
inline void expect_invariants(const Tree& t, const Request& r, int L, int K, int n_max) {
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

inline Request make_request(int L, int K, const std::vector<float>& lp, int budget, int root = 99, int ctx = 100) {
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
inline std::vector<float> draft_row(st::Rng& rng, int K, float sharp, int pool) {
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

inline void sort_row_desc(std::vector<float>& lp, int d, int K) {
  std::sort(lp.begin() + size_t(d) * K, lp.begin() + size_t(d + 1) * K, [](float a, float c) { return a > c; });
}

// A request over `lp` with a random root token, context length and token ids (ids do not shape the tree).
inline Request random_request(st::Rng& rng, int L, int K, const std::vector<float>& lp, int budget) {
  Request r = make_request(L, K, lp, budget, rng.below(160000), rng.below(70000));
  for (auto& id : r.ids) id = rng.below(160000);
  return r;
}

// One launch over `reqs`; every tree equals the host heap's, and (except request `no_invariants`, whose rows
// break the rank walk the invariants use) satisfies the tree invariants.
inline void expect_batch_matches_host(const std::vector<Request>& reqs, int L, int K, int n_max, const char* label,
                               int no_invariants = -1) {
  auto got = device_build(reqs, L, K, n_max);
  for (size_t b = 0; b < reqs.size(); ++b) {
    std::string what = st::format("%s L=%d K=%d b=%d budget=%d", label, L, K, int(b), reqs[b].budget);
    expect_same(got[b], host_build(reqs[b], L, K, n_max), what.c_str());
    if (int(b) != no_invariants) expect_invariants(got[b], reqs[b], L, K, n_max);
  }
}

}  // namespace bt_selftest
