// Self-checks of build_tree: hand-built golden trees with literal expected outputs, then randomized
// cases compared with a host port of the reference heap (exact equality of every output) plus the tree
// invariants (prefix-closed, parent < child, depth, ancestor bits = path, positions, sibling lists).
// The cases that pin each kernel path live in build_tree_paths_selftest.cu.
#include "build_tree_selftest_support.h"

using namespace bt_selftest;

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
