// Self-checks that pin each build_tree kernel path (the medium phases, large and small budgets, the warp
// heap's edges, the opt-in v11 search) against the host port of the reference heap, output for output.
#include "build_tree_selftest_support.h"

using namespace bt_selftest;

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
