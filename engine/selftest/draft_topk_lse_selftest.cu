// Self-checks of draft_topk_lse against a host reference (long double lse, stable order by logit then id).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "ddtree/draft_topk_lse.h"
#include "ddtree/kernels/draft_topk_lse_small.cuh"  // kSmallMaxV
#include "selftest.h"

namespace {

struct Case {
  int batch, positions, vocab, k;
  bool bf16;
  int64_t row_pad;  // row_stride = vocab + row_pad
  int kind;         // 0 normal, 1 few distinct values (ties), 2 with -inf, 3 dyadic, 4 one NaN row
  uint64_t seed;
};

// Runs one case on the GPU with implementation `impl` (DDTREE_TOPK_IMPL_V2/V3/V4; v3 with k > 64 runs v2,
// v4 with k > 64 or without cluster launch runs v3 or v2)
// and compares with the host reference.
void run_case_impl(const Case& c, int32_t impl) {
  const int rows = c.batch * c.positions;
  const int64_t row_stride = c.vocab + c.row_pad;
  const int64_t batch_stride = row_stride * c.positions;
  st::Rng rng(c.seed);
  std::vector<float> x(size_t(rows) * row_stride, 0.f);
  for (int r = 0; r < rows; ++r) {
    for (int v = 0; v < c.vocab; ++v) {
      float f;
      switch (c.kind) {
        case 1: f = float(rng.below(4)); break;
        case 2: f = rng.below(5) == 0 ? -INFINITY : 3.f * rng.normal(); break;
        case 3: f = float(rng.below(16)) * 0.25f - 2.f; break;
        default: f = 4.f * rng.normal(); break;
      }
      if (c.bf16) f = st::bf16_to_f32(st::f32_to_bf16(f));
      x[size_t(r) * row_stride + v] = f;
    }
  }
  int nan_row = -1;
  if (c.kind == 4) {
    nan_row = rows / 2;
    x[size_t(nan_row) * row_stride + c.vocab / 3] = NAN;
  }
  // Device input in the requested dtype.
  const st::DeviceLogits dev_logits(x, c.bf16);
  const void* d_logits = dev_logits.ptr;
  st::DeviceBuffer<float> lp(size_t(rows) * c.k), lse(rows);
  st::DeviceBuffer<int32_t> id(size_t(rows) * c.k), flags(1);
  lp.poison();
  id.poison();
  lse.poison();
  flags.upload({0});
  const size_t ws_bytes = ddtree_draft_topk_lse_workspace_size(c.batch, c.positions, c.vocab, c.k);
  st::DeviceBuffer<uint8_t> ws(ws_bytes);
  ws.poison();
  ST_CHECK_STATUS(ddtree_draft_topk_lse_impl(d_logits, c.bf16 ? DDTREE_DTYPE_BFLOAT16 : DDTREE_DTYPE_FLOAT32,
                                             c.batch, c.positions, c.vocab, batch_stride, row_stride, c.k, lp.ptr,
                                             id.ptr, lse.ptr, ws.ptr, ws_bytes, flags.ptr, nullptr, impl));
  ST_CUDA(cudaDeviceSynchronize());
  const auto h_lp = lp.download();
  const auto h_id = id.download();
  const auto h_lse = lse.download();
  const auto h_flags = flags.download();
  const float tol = c.vocab > 100000 ? 4e-6f : 2e-6f;
  int bad = 0;
  for (int r = 0; r < rows && bad < 3; ++r) {
    const float* xr = &x[size_t(r) * row_stride];
    if (r == nan_row) {
      bool ok = std::isnan(h_lse[r]);
      for (int j = 0; j < c.k; ++j) ok = ok && std::isnan(h_lp[size_t(r) * c.k + j]) && h_id[size_t(r) * c.k + j] == -1;
      ST_EXPECT(ok, "row %d with NaN: expected NaN lse/lp and id -1", r);
      bad += !ok;
      continue;
    }
    long double m = -INFINITY;
    for (int v = 0; v < c.vocab; ++v) m = std::max<long double>(m, xr[v]);
    long double s = 0;
    if (m > -INFINITY)
      for (int v = 0; v < c.vocab; ++v) s += std::exp((long double)xr[v] - m);
    const long double lse_ref = m > -INFINITY ? m + std::log(s) : m;
    std::vector<int> order(c.vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return xr[a] > xr[b]; });
    bool ok = std::fabs(double(h_lse[r]) - double(lse_ref)) <= tol || (std::isinf(double(lse_ref)) && h_lse[r] == float(lse_ref));
    ST_EXPECT(ok, "row %d lse %.9g want %.9Lg", r, h_lse[r], lse_ref);
    bad += !ok;
    for (int j = 0; j < c.k; ++j) {
      const int got_id = h_id[size_t(r) * c.k + j];
      const float got_lp = h_lp[size_t(r) * c.k + j];
      if (j >= c.vocab) {
        const bool pad_ok = got_id == -1 && got_lp == -INFINITY;
        ST_EXPECT(pad_ok, "row %d rank %d past vocab: got id %d lp %g", r, j, got_id, got_lp);
        bad += !pad_ok;
        if (!pad_ok) break;
        continue;
      }
      const int want_id = order[j];
      const long double want_lp = xr[want_id] == -INFINITY ? -INFINITY : (long double)xr[want_id] - lse_ref;
      const bool id_ok = got_id == want_id;
      const bool lp_ok = std::isinf(double(want_lp)) ? got_lp == float(want_lp)
                                                      : std::fabs(double(got_lp) - double(want_lp)) <= tol;
      ST_EXPECT(id_ok && lp_ok, "v%d B%d L%d V%d k%d %s row %d rank %d: id %d (want %d) lp %.9g (want %.9Lg)",
                ddtree_draft_topk_lse_resolve_impl(c.k, impl), c.batch, c.positions, c.vocab, c.k,
                c.bf16 ? "bf16" : "f32", r, j, got_id, want_id, got_lp, want_lp);
      if (!(id_ok && lp_ok)) {
        ++bad;
        break;
      }
    }
  }
  ST_EXPECT((h_flags[0] & DDTREE_FLAG_NAN_INPUT) == (nan_row >= 0 ? DDTREE_FLAG_NAN_INPUT : 0),
            "error flag 0x%x, NaN row %d", h_flags[0], nan_row);
}

bool device_has_clusters() {
  int dev = 0, yes = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&yes, cudaDevAttrClusterLaunch, dev) == cudaSuccess && yes != 0;
}

// Every case runs on every implementation where they differ (v3 and v4 apply to k <= 64).
void run_case(const Case& c) {
  run_case_impl(c, DDTREE_TOPK_IMPL_V2);
  if (ddtree_draft_topk_lse_resolve_impl(c.k, DDTREE_TOPK_IMPL_V3) == DDTREE_TOPK_IMPL_V3)
    run_case_impl(c, DDTREE_TOPK_IMPL_V3);
  if (ddtree_draft_topk_lse_resolve_impl(c.k, DDTREE_TOPK_IMPL_V4) == DDTREE_TOPK_IMPL_V4) {
    run_case_impl(c, DDTREE_TOPK_IMPL_V4);
    // Where v4 is the default, rows up to kSmallMaxV take the small-row kernel with DDTREE_TOPK_SMALL=1
    // (read on every call): the default call runs it here whatever the process environment says.
    if (c.vocab <= ddtree::kernels::kSmallMaxV) {
      const st::ScopedEnv small("DDTREE_TOPK_SMALL", "1");
      run_case_impl(c, DDTREE_TOPK_IMPL_DEFAULT);
    }
  }
}

}  // namespace

DDTREE_SELFTEST(draft_topk_lse_golden) {
  ST_EXPECT(ddtree_draft_topk_lse_resolve_impl(16, DDTREE_TOPK_IMPL_V3) == DDTREE_TOPK_IMPL_V3 &&
                ddtree_draft_topk_lse_resolve_impl(65, DDTREE_TOPK_IMPL_V3) == DDTREE_TOPK_IMPL_V2 &&
                ddtree_draft_topk_lse_resolve_impl(16, DDTREE_TOPK_IMPL_V2) == DDTREE_TOPK_IMPL_V2,
            "implementation resolution");
  const int32_t v4_or_v3 = device_has_clusters() ? DDTREE_TOPK_IMPL_V4 : DDTREE_TOPK_IMPL_V3;
  ST_EXPECT(ddtree_draft_topk_lse_resolve_impl(1, DDTREE_TOPK_IMPL_V4) == v4_or_v3 &&
                ddtree_draft_topk_lse_resolve_impl(64, DDTREE_TOPK_IMPL_V4) == v4_or_v3 &&
                ddtree_draft_topk_lse_resolve_impl(65, DDTREE_TOPK_IMPL_V4) == DDTREE_TOPK_IMPL_V2,
            "v4 resolution (clusters: %d)", int(device_has_clusters()));
  for (const int32_t impl : {DDTREE_TOPK_IMPL_V2, DDTREE_TOPK_IMPL_V3, DDTREE_TOPK_IMPL_V4, DDTREE_TOPK_IMPL_DEFAULT}) {
  // Row: ids 0..9. Sorted by logit desc, ties lower id first: 3(5) 7(5) 1(4) 9(2) 0(1) ...
  const std::vector<float> x = {1.f, 4.f, -INFINITY, 5.f, 0.f, 0.f, -1.f, 5.f, -3.f, 2.f};
  st::DeviceBuffer<float> d_x(x), lp(6), lse(1);
  st::DeviceBuffer<int32_t> id(6);
  const size_t ws_bytes = ddtree_draft_topk_lse_workspace_size(1, 1, 10, 6);
  st::DeviceBuffer<uint8_t> ws(ws_bytes);
  ST_CHECK_STATUS(ddtree_draft_topk_lse_impl(d_x.ptr, DDTREE_DTYPE_FLOAT32, 1, 1, 10, 10, 10, 6, lp.ptr, id.ptr,
                                             lse.ptr, ws.ptr, ws_bytes, nullptr, nullptr, impl));
  const auto h_id = id.download();
  const auto h_lp = lp.download();
  const auto h_lse = lse.download();
  const int want[6] = {3, 7, 1, 9, 0, 4};
  for (int j = 0; j < 6; ++j) ST_EXPECT(h_id[j] == want[j], "rank %d: id %d want %d", j, h_id[j], want[j]);
  // lse = log(e^1 + e^4 + 2 e^5 + 2 e^0 + e^-1 + e^-3 + e^2) = 5.8712... (computed in long double below)
  long double s = 0;
  for (float f : x) s += std::exp((long double)f);
  const double lse_ref = double(std::log(s));
  ST_EXPECT(std::fabs(h_lse[0] - lse_ref) < 2e-6, "lse %.9g want %.9g", h_lse[0], lse_ref);
  ST_EXPECT(std::fabs(h_lp[0] - (5.0 - lse_ref)) < 2e-6 && h_lp[0] == h_lp[1], "lp[0] %.9g lp[1] %.9g", h_lp[0], h_lp[1]);
  }
}

DDTREE_SELFTEST(draft_topk_lse_rejects_bad_arguments) {
  st::DeviceBuffer<float> x(64), lp(64), lse(4);
  st::DeviceBuffer<int32_t> id(64);
  const size_t ws_bytes = ddtree_draft_topk_lse_workspace_size(1, 1, 64, 4);
  st::DeviceBuffer<uint8_t> ws(ws_bytes);
  ST_EXPECT(ddtree_draft_topk_lse(x.ptr, DDTREE_DTYPE_FLOAT32, 1, 1, 64, 64, 64, 0, lp.ptr, id.ptr, lse.ptr, ws.ptr,
                                  ws_bytes, nullptr, nullptr) == DDTREE_STATUS_INVALID_ARGUMENT, "k = 0 accepted");
  ST_EXPECT(ddtree_draft_topk_lse(x.ptr, DDTREE_DTYPE_FLOAT32, 1, 1, 64, 64, 32, 4, lp.ptr, id.ptr, lse.ptr, ws.ptr,
                                  ws_bytes, nullptr, nullptr) == DDTREE_STATUS_INVALID_ARGUMENT, "row_stride < vocab accepted");
  ST_EXPECT(ddtree_draft_topk_lse(x.ptr, DDTREE_DTYPE_FLOAT32, 1, 1, 64, 64, 64, 4, lp.ptr, id.ptr, lse.ptr, ws.ptr,
                                  ws_bytes - 1, nullptr, nullptr) == DDTREE_STATUS_WORKSPACE_TOO_SMALL, "small workspace accepted");
  ST_EXPECT(std::strlen(ddtree_last_error()) > 0, "no error message");
  ST_EXPECT(ddtree_draft_topk_lse(x.ptr, DDTREE_DTYPE_FLOAT16, 1, 1, 64, 64, 64, 4, lp.ptr, id.ptr, lse.ptr, ws.ptr,
                                  ws_bytes, nullptr, nullptr) == DDTREE_STATUS_INVALID_ARGUMENT, "fp16 accepted");
  ST_EXPECT(ddtree_draft_topk_lse_impl(x.ptr, DDTREE_DTYPE_FLOAT32, 1, 1, 64, 64, 64, 4, lp.ptr, id.ptr, lse.ptr,
                                       ws.ptr, ws_bytes, nullptr, nullptr, 7) == DDTREE_STATUS_INVALID_ARGUMENT,
            "impl 7 accepted");
}

DDTREE_SELFTEST(draft_topk_lse_random) {
  const Case cases[] = {
      {1, 15, 163840, 16, true, 0, 0, 1},   {1, 15, 163840, 1024, true, 0, 0, 2}, {1, 15, 151936, 1, false, 0, 0, 3},
      {2, 7, 32000, 1024, false, 3, 0, 4},  {3, 1, 997, 16, true, 5, 0, 5},       {1, 7, 997, 1024, false, 0, 0, 6},
      {2, 3, 32000, 16, false, 0, 1, 7},    {1, 3, 20000, 1024, true, 0, 1, 8},   {1, 4, 50000, 64, false, 1, 2, 9},
      {1, 5, 16384, 16, false, 0, 3, 10},   {2, 3, 9000, 8, true, 7, 4, 11},      {1, 2, 8192, 1024, false, 0, 3, 12},
      {1, 1, 1, 1, false, 0, 0, 13},        {1, 2, 5, 16, true, 3, 2, 14},
      // v3's range (k <= 64): fast path, tie fallbacks, partial chunks, unaligned rows.
      {1, 15, 163840, 1, true, 0, 0, 31},   {1, 15, 163840, 32, true, 0, 0, 32}, {1, 3, 151936, 8, false, 0, 0, 33},
      {2, 3, 40000, 32, true, 8, 1, 34},    {1, 3, 20011, 16, true, 3, 3, 35},   {1, 4, 30000, 2, false, 1, 2, 36},
      {1, 15, 163840, 64, true, 0, 0, 37},  {1, 4, 50000, 48, false, 0, 2, 38},  {1, 3, 9000, 64, true, 1, 1, 39},
      // v4: batches of rows (one cluster each), fp32 two-round rows, small clusters, NaN among batches.
      {8, 15, 163840, 16, true, 0, 0, 41},  {2, 15, 163840, 1, false, 0, 0, 42}, {3, 5, 4100, 17, true, 1, 2, 43},
      {2, 7, 131072, 64, true, 0, 3, 44},   {4, 3, 60000, 16, true, 0, 4, 45},
      // session 13: 2-CTA clusters of four register rounds where 67..132 rows take them (v4_max_cluster), -inf.
      {8, 15, 151936, 64, true, 0, 2, 46},
  };
  for (const Case& c : cases) run_case(c);
}

// Small enough for compute-sanitizer (memcheck, racecheck), large enough that every kernel runs its
// radix select (several chunks, k below the candidate count) and the id digits (ties); v4 runs its fast
// path (clusters of 5 and 8 CTAs), its tie fallback (case 24), a NaN row (case 23) and, with many rows,
// clusters of 4 CTAs of two register rounds (case 27: 36 rows, the launcher's row-count rule), of 2 CTAs (33-35:
// 67..132 rows, session 13); v6's k = 1
// warp path on two rounds with ties (28), a NaN row (29) and -inf (30); small rows (51-54: v4 and the
// small-row kernel).
DDTREE_SELFTEST(draft_topk_lse_sanitizer_sized) {
  const Case cases[] = {{1, 2, 20000, 16, false, 0, 0, 21}, {1, 2, 20000, 1024, true, 0, 1, 22},
                        {2, 1, 9000, 8, false, 3, 4, 23},     {1, 2, 20000, 32, true, 0, 1, 24},
                        {1, 2, 20000, 64, true, 0, 0, 25},    {1, 2, 163840, 1, true, 0, 2, 26},
                        {3, 12, 163840, 16, true, 0, 0, 27}, {3, 12, 163840, 1, true, 0, 1, 28},
                        {2, 1, 9000, 1, false, 3, 4, 29},     {1, 3, 20000, 1, true, 0, 2, 30},
                        // one CTA per SM (8-CTA clusters, one wave: NOTES "v14 (session 10"): k > 1 under it.
                        {1, 2, 163840, 16, true, 0, 2, 31},   {1, 2, 163840, 64, true, 0, 0, 32},
                        // 2-CTA clusters (67..132 rows, session 13): three rounds with -inf at k = 64, the tie
                        // fallback over two rounds at k = 16, k = 1's warp path with ties.
                        {5, 14, 100000, 64, true, 0, 2, 33},  {4, 17, 50000, 16, true, 0, 1, 34},
                        {6, 12, 40000, 1, true, 0, 1, 35},
                        // small rows (v4 and the small-row kernel): partial CTA, ties, NaN, -inf.
                        {3, 5, 320, 16, true, 0, 0, 51},      {2, 3, 997, 64, false, 3, 1, 52},
                        {2, 3, 300, 8, false, 0, 4, 53},      {1, 5, 320, 64, true, 0, 2, 54}};
  for (const Case& c : cases) run_case(c);
}
