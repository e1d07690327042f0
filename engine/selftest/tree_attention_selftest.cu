// ddtree-selftest checks of tree_attention: a host fp64 reference on random paged trees (several head
// dims, GQA ratios, page sizes, forced splits), chain == causal bit for bit, ctx_len 0 + padding rows.
// Every check runs on every back end this device and library can run (mma.sync, wgmma, fa3), each
// selected through ddtree_tree_attention_set_impl; messages name the back end.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ddtree/tree_attention.h"
#include "selftest.h"

namespace {

struct TaCase {
  int hq, hkv, d, page, n_max, max_pages, num_pages;
  std::vector<int> ctx, n, indptr, block_table;
  std::vector<std::vector<int>> parents;  // per request, n entries (padding: -1 at i > 0)
  std::vector<uint32_t> anc;              // [B, n_max, W]
  std::vector<uint16_t> q, k, v;          // bf16 bits
  float sm_scale;
  int B() const { return int(ctx.size()); }
  int W() const { return (n_max + 31) / 32; }
  int T() const { return indptr.back(); }
};

TaCase make_case(int hq, int hkv, int d, int page, std::vector<int> ctx, std::vector<int> n, int kind,
                 uint64_t seed, int pad_every = 0) {
  st::Rng rng(seed);
  TaCase c{};
  c.hq = hq, c.hkv = hkv, c.d = d, c.page = page, c.ctx = ctx, c.n = n;
  c.sm_scale = 1.f / std::sqrt(float(d));
  c.n_max = 1;
  for (int x : n) c.n_max = std::max(c.n_max, x);
  c.indptr.push_back(0);
  for (int x : n) c.indptr.push_back(c.indptr.back() + x);
  c.max_pages = 1;
  for (int b = 0; b < c.B(); ++b) c.max_pages = std::max(c.max_pages, (ctx[b] + n[b] + page - 1) / page);
  c.num_pages = c.B() * c.max_pages + 2;
  // pages in reverse order so that requests interleave in the cache
  c.block_table.assign(size_t(c.B()) * c.max_pages, -1);
  for (int b = 0; b < c.B(); ++b)
    for (int p = 0; p < c.max_pages; ++p) c.block_table[b * c.max_pages + p] = c.num_pages - 1 - (p * c.B() + b);
  c.anc.assign(size_t(c.B()) * c.n_max * c.W(), 0u);
  for (int b = 0; b < c.B(); ++b) {
    std::vector<int> par(n[b], -1);
    for (int i = 1; i < n[b]; ++i) {
      if (pad_every && i % pad_every == 0) { par[i] = -1; continue; }
      int p = kind == 0 ? i - 1 : kind == 1 ? 0 : rng.below(i);
      while (p > 0 && par[p] < 0) --p;  // never hang a node under a padding node
      par[i] = p;
    }
    c.parents.push_back(par);
    for (int i = 0; i < n[b]; ++i) {
      if (i > 0 && par[i] < 0) continue;
      uint32_t* row = &c.anc[(size_t(b) * c.n_max + i) * c.W()];
      if (par[i] >= 0) {
        const uint32_t* prow = &c.anc[(size_t(b) * c.n_max + par[i]) * c.W()];
        for (int w = 0; w < c.W(); ++w) row[w] = prow[w];
      }
      row[i / 32] |= 1u << (i % 32);
    }
  }
  const size_t cache = size_t(c.num_pages) * page * hkv * d;
  c.k.resize(cache), c.v.resize(cache);
  for (auto& x : c.k) x = st::f32_to_bf16(rng.normal());
  for (auto& x : c.v) x = st::f32_to_bf16(rng.normal());
  c.q.resize(size_t(c.T()) * hq * d);
  for (auto& x : c.q) x = st::f32_to_bf16(rng.normal());
  return c;
}

// fp64 reference: o [T, Hq, D], lse [T, Hq] (padding rows: 0 / -inf).
void reference(const TaCase& c, std::vector<double>& o, std::vector<double>& lse) {
  const int G = c.hq / c.hkv, D = c.d;
  o.assign(size_t(c.T()) * c.hq * D, 0.0);
  lse.assign(size_t(c.T()) * c.hq, -INFINITY);
  for (int b = 0; b < c.B(); ++b)
    for (int i = 0; i < c.n[b]; ++i) {
      if (i > 0 && c.parents[b][i] < 0) continue;
      std::vector<int> slots;
      for (int s = 0; s < c.ctx[b]; ++s) slots.push_back(s);
      for (int j = 0; j <= i; ++j)
        if (c.anc[(size_t(b) * c.n_max + i) * c.W() + j / 32] >> (j % 32) & 1u) slots.push_back(c.ctx[b] + j);
      const int t = c.indptr[b] + i;
      for (int h = 0; h < c.hq; ++h) {
        std::vector<double> sc(slots.size());
        double mx = -INFINITY;
        for (size_t x = 0; x < slots.size(); ++x) {
          const int s = slots[x];
          const size_t base =
              ((size_t(c.block_table[b * c.max_pages + s / c.page]) * c.page + s % c.page) * c.hkv + h / G) * D;
          double dot = 0;
          for (int e = 0; e < D; ++e)
            dot += double(st::bf16_to_f32(c.q[(size_t(t) * c.hq + h) * D + e])) * st::bf16_to_f32(c.k[base + e]);
          sc[x] = dot * c.sm_scale;
          mx = std::max(mx, sc[x]);
        }
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        lse[size_t(t) * c.hq + h] = mx + std::log(sum);
        for (size_t x = 0; x < slots.size(); ++x) {
          const int s = slots[x];
          const size_t base =
              ((size_t(c.block_table[b * c.max_pages + s / c.page]) * c.page + s % c.page) * c.hkv + h / G) * D;
          for (int e = 0; e < D; ++e) o[(size_t(t) * c.hq + h) * D + e] += sc[x] / sum * st::bf16_to_f32(c.v[base + e]);
        }
      }
    }
}

struct Result {
  std::vector<uint16_t> o;
  std::vector<float> lse;
};

Result run(const TaCase& c, bool causal, int kv_chunk) {
  st::DeviceBuffer<uint16_t> q(c.q), k(c.k), v(c.v);
  st::DeviceBuffer<int32_t> indptr(c.indptr), bt(c.block_table), ctx(c.ctx);
  st::DeviceBuffer<uint32_t> anc(c.anc);
  st::DeviceBuffer<uint16_t> o(c.q.size());
  st::DeviceBuffer<float> lse(size_t(c.T()) * c.hq);
  o.poison(), lse.poison();
  const size_t ws_bytes = ddtree_tree_attention_workspace_size(c.B(), c.hq, c.hkv, c.d, c.n_max, c.max_pages,
                                                               c.page, kv_chunk);
  ST_REQUIRE(ddtree_tree_attention_plan_chunk(c.B(), c.hq, c.hkv, c.d, c.n_max, c.max_pages, c.page, kv_chunk) > 0,
             "plan: %s", ddtree_last_error());
  const size_t cnt_bytes = ddtree_tree_attention_workspace_counter_bytes(c.B(), c.hq, c.hkv, c.d, c.n_max,
                                                                         c.max_pages, c.page, kv_chunk);
  ST_REQUIRE(cnt_bytes <= ws_bytes, "counter bytes %zu > workspace %zu", cnt_bytes, ws_bytes);
  st::DeviceBuffer<unsigned char> ws(ws_bytes);
  ws.poison(0xFF);  // partials need no initialization: NaN garbage there must not matter
  if (cnt_bytes) ST_CUDA(cudaMemset(ws.ptr, 0, cnt_bytes));  // the arrival counters start at zero, once
  // twice: a launch must not depend on what the last one left (the fused merge's counters must be back
  // at zero after the first)
    ST_CHECK_STATUS(ddtree_tree_attention(q.ptr, k.ptr, v.ptr, indptr.ptr, bt.ptr, ctx.ptr, causal ? nullptr : anc.ptr,
                                          o.ptr, lse.ptr, c.T(), c.B(), c.hq, c.hkv, c.d, c.num_pages, c.page,
                                          c.max_pages, c.n_max, c.sm_scale, kv_chunk, DDTREE_DTYPE_BFLOAT16, ws.ptr,
                                          ws_bytes, nullptr));
  ST_CUDA(cudaDeviceSynchronize());
  return {o.download(), lse.download()};
}

struct Reference {
  std::vector<double> o, lse;
};
Reference reference_of(const TaCase& c) {
  Reference r;
  reference(c, r.o, r.lse);
  return r;
}

void check_against_reference(const TaCase& c, const Result& r, const Reference& ref, const char* what) {
  const std::vector<double>& o_ref = ref.o;
  const std::vector<double>& lse_ref = ref.lse;
  double max_ref = 1e-3, max_err = 0, max_lse = 0;
  int bad_pad = 0;
  for (double x : o_ref) max_ref = std::max(max_ref, std::fabs(x));
  for (size_t i = 0; i < o_ref.size(); ++i) {
    const float got = st::bf16_to_f32(r.o[i]);
    max_err = std::max(max_err, std::isnan(got) ? INFINITY : std::fabs(got - o_ref[i]));
  }
  for (size_t i = 0; i < lse_ref.size(); ++i) {
    if (std::isinf(lse_ref[i])) {
      bad_pad += !(std::isinf(r.lse[i]) && r.lse[i] < 0);
      for (int e = 0; e < c.d; ++e) bad_pad += r.o[i * c.d + e] != 0;
    } else {
      max_lse = std::max(max_lse, std::isnan(r.lse[i]) ? INFINITY : std::fabs(r.lse[i] - lse_ref[i]));
    }
  }
  ST_EXPECT(max_err <= 2e-2 * max_ref, "%s: max |o - ref| %.3e (ref max %.3e)", what, max_err, max_ref);
  ST_EXPECT(max_lse <= 2e-3, "%s: max |lse - ref| %.3e", what, max_lse);
  ST_EXPECT(bad_pad == 0, "%s: %d padding outputs not zero / -inf", what, bad_pad);
}


const char* impl_name(int impl) {
  switch (impl) {
    case DDTREE_TA_IMPL_MMA: return "mma";
    case DDTREE_TA_IMPL_WGMMA: return "wgmma";
    case DDTREE_TA_IMPL_FA3: return "fa3";
  }
  return "auto";
}

// Back ends the checks below run on. The fa3 back end gets its own test, registered last, so that a
// failure there (a trap leaves the CUDA context unusable) cannot mask the results of the others.
std::vector<int> g_impls = {DDTREE_TA_IMPL_MMA, DDTREE_TA_IMPL_WGMMA};

// Runs fn(name) once per back end of g_impls that can run head_dim d here, with that back end
// selected; restores the default afterwards (also when a check aborts).
template <class F>
void for_each_impl(int d, F&& fn) {
  struct Restore {
    ~Restore() { ddtree_tree_attention_set_impl(DDTREE_TA_IMPL_AUTO); }
  } restore;
  for (int impl : g_impls) {
    if (!ddtree_tree_attention_impl_available(impl, d)) continue;
    ST_CHECK_STATUS(ddtree_tree_attention_set_impl(impl));
    ST_REQUIRE(ddtree_tree_attention_impl_for(d) == impl, "back end %s selected but %d reported", impl_name(impl),
               ddtree_tree_attention_impl_for(d));
    fn(impl_name(impl));
  }
}

void random_trees() {
  const int shapes[][3] = {{8, 1, 128}, {4, 2, 64}, {8, 4, 256}, {6, 3, 128}};
  int seed = 1;
  for (auto& s : shapes)
    for (int page : {1, 16, 64})
      for (int chunk : {0, 64}) {
        TaCase c = make_case(s[0], s[1], s[2], page, {130, 0, 71}, {40, 7, 66}, 2, seed++, 9);
        const Reference ref = reference_of(c);
        for_each_impl(s[2], [&](const char* impl) {
          check_against_reference(
              c, run(c, false, chunk), ref,
              st::format("%s hq=%d hkv=%d d=%d page=%d chunk=%d", impl, s[0], s[1], s[2], page, chunk).c_str());
        });
      }
}

void star_and_ctx0() {
  TaCase star = make_case(8, 2, 128, 16, {0, 500}, {65, 1}, 1, 77);
  const Reference ref = reference_of(star);
  for_each_impl(128, [&](const char* impl) {
    check_against_reference(star, run(star, false, 0), ref, st::format("%s star, ctx 0", impl).c_str());
  });
}

// Long key ranges (many tiles per CTA: the pipelines wrap their stage rings several times), large
// GQA groups (several row tiles), mixed requests with a padding-only CTA and an empty one.
void long_pipelines() {
  TaCase c = make_case(8, 2, 128, 16, {1500, 1, 700}, {130, 64, 9}, 2, 99, 7);
  const Reference ref = reference_of(c);
  for_each_impl(128, [&](const char* impl) {
    for (int chunk : {0, 1024, 128})
      check_against_reference(c, run(c, false, chunk), ref, st::format("%s long chunk=%d", impl, chunk).c_str());
  });
}

void chain_equals_causal_bitwise() {
  for (int chunk : {64, 256, 0}) {
    TaCase c = make_case(8, 1, 128, 16, {300, 5}, {100, 37}, 0, 5 + chunk);
    const Reference ref = reference_of(c);
    for_each_impl(128, [&](const char* impl) {
      Result tree = run(c, false, chunk), causal = run(c, true, chunk);
      size_t diff = 0;
      for (size_t i = 0; i < tree.o.size(); ++i) diff += tree.o[i] != causal.o[i];
      for (size_t i = 0; i < tree.lse.size(); ++i) diff += std::memcmp(&tree.lse[i], &causal.lse[i], 4) != 0;
      ST_EXPECT(diff == 0, "%s chunk %d: %zu elements differ between chain bitset and causal mode", impl, chunk, diff);
      check_against_reference(c, causal, ref, st::format("%s causal", impl).c_str());
    });
  }
}

// fa3 merges a split row tile with the merge kernel (default), in its last CTA (opt-in fused merge,
// DDTREE_TA_FA3_FUSED_MERGE=1, 2-4 splits), or (opt-in, DDTREE_TA_CLUSTER_MERGE=1, where the plan allows
// it: 2-8 splits, every cluster resident at once) inside a thread-block cluster. All must give the same
// bits. Chunks 512/192/128 give 2, 5 and 8 splits of the longest
// request; the shorter ones leave CTAs past their length (idle cluster members) or need a single chunk
// (no merge) inside the same launch.
void cluster_merge_matches_kernel_merge() {
  TaCase c = make_case(8, 1, 128, 16, {900, 200, 0}, {60, 33, 17}, 2, 4242, 11);
  const Reference ref = reference_of(c);
  for_each_impl(128, [&](const char* impl) {
    for (int chunk : {512, 192, 128}) {
      unsetenv("DDTREE_TA_CLUSTER_MERGE");
      const Result kern = run(c, false, chunk);
      setenv("DDTREE_TA_CLUSTER_MERGE", "1", 1);
      const Result clus = run(c, false, chunk);
      unsetenv("DDTREE_TA_CLUSTER_MERGE");
      size_t diff = 0;
      for (size_t i = 0; i < kern.o.size(); ++i) diff += kern.o[i] != clus.o[i];
      for (size_t i = 0; i < kern.lse.size(); ++i) diff += std::memcmp(&kern.lse[i], &clus.lse[i], 4) != 0;
      ST_EXPECT(diff == 0, "%s chunk %d: %zu elements differ between the cluster merge and the merge kernel", impl,
                chunk, diff);
      check_against_reference(c, clus, ref, st::format("%s cluster merge chunk=%d", impl, chunk).c_str());
    }
    // Fused merge (opt-in) against the merge kernel: chunks 512 / 320 / 256 split the longest request
    // into 2, 3 and 4 (the fused maximum); the others need one chunk or leave CTAs past their length.
    // Each run launches twice on one workspace (run()), so the counters' self-reset is exercised too.
    for (int chunk : {512, 320, 256}) {
      const Result kern = run(c, false, chunk);
      setenv("DDTREE_TA_FA3_FUSED_MERGE", "1", 1);
      const Result fused = run(c, false, chunk);
      size_t diff = 0;
      for (size_t i = 0; i < kern.o.size(); ++i) diff += kern.o[i] != fused.o[i];
      for (size_t i = 0; i < kern.lse.size(); ++i) diff += std::memcmp(&kern.lse[i], &fused.lse[i], 4) != 0;
      ST_EXPECT(diff == 0, "%s chunk %d: %zu elements differ between the fused merge and the merge kernel", impl,
                chunk, diff);
      check_against_reference(c, fused, ref, st::format("%s fused merge chunk=%d", impl, chunk).c_str());
      // The eager tile-mask wait (DDTREE_TA_FA3_LAZY_MASK=0, v9b's schedule) must not change a bit either.
      setenv("DDTREE_TA_FA3_LAZY_MASK", "0", 1);
      const Result eager = run(c, false, chunk);
      unsetenv("DDTREE_TA_FA3_LAZY_MASK");
      unsetenv("DDTREE_TA_FA3_FUSED_MERGE");
      diff = 0;
      for (size_t i = 0; i < eager.o.size(); ++i) diff += eager.o[i] != fused.o[i];
      for (size_t i = 0; i < eager.lse.size(); ++i) diff += std::memcmp(&eager.lse[i], &fused.lse[i], 4) != 0;
      ST_EXPECT(diff == 0, "%s chunk %d: %zu elements differ between the lazy and the eager mask wait", impl, chunk,
                diff);
    }
  });
}

// fa3 v17: the two tile schedules of a split request (DDTREE_TA_FA3_SCHEDULE=chunked | strided, read per
// launch; the build's default runs every check above). Both against the reference on requests whose tile
// counts leave a partial round (T % nact != 0: the strided schedule's first-tile rule) and whose chunks
// hold tree tiles; under the strided schedule a chain equals causal mode bit for bit, the fused merge gives
// the merge kernel's bits, and a second launch on the same workspace gives the same bits again (run()).
void tile_schedules() {
  struct Env {
    ~Env() { unsetenv("DDTREE_TA_FA3_SCHEDULE"); }
  } env;
  TaCase c = make_case(8, 1, 128, 16, {1000, 300, 0, 2100}, {300, 40, 130, 260}, 2, 917, 13);
  const Reference ref = reference_of(c);
  TaCase chain = make_case(8, 1, 128, 16, {1000, 63}, {300, 130}, 0, 918);
  const Reference ref_chain = reference_of(chain);
  for_each_impl(128, [&](const char* impl) {
    for (int chunk : {0, 384, 1152, 640}) {
      setenv("DDTREE_TA_FA3_SCHEDULE", "chunked", 1);
      const Result chunked = run(c, false, chunk);
      check_against_reference(c, chunked, ref, st::format("%s chunked schedule chunk=%d", impl, chunk).c_str());
      setenv("DDTREE_TA_FA3_SCHEDULE", "strided", 1);
      const Result strided = run(c, false, chunk);
      check_against_reference(c, strided, ref, st::format("%s strided schedule chunk=%d", impl, chunk).c_str());
      const int pinned = chunk ? chunk : 384;  // the planned chunk depends on n_max (anc vs token count)
      const Result tree = run(chain, false, pinned), causal = run(chain, true, pinned);
      size_t diff = 0;
      for (size_t i = 0; i < tree.o.size(); ++i) diff += tree.o[i] != causal.o[i];
      for (size_t i = 0; i < tree.lse.size(); ++i) diff += std::memcmp(&tree.lse[i], &causal.lse[i], 4) != 0;
      ST_EXPECT(diff == 0, "%s strided chunk %d: %zu elements differ between chain bitset and causal mode", impl,
                pinned, diff);
      check_against_reference(chain, causal, ref_chain, st::format("%s strided causal", impl).c_str());
      if (chunk == 1152 || chunk == 640) {  // 3 and 4 splits of the longest request: the fused merge's range
        setenv("DDTREE_TA_FA3_FUSED_MERGE", "1", 1);
        const Result fused = run(c, false, chunk);
        unsetenv("DDTREE_TA_FA3_FUSED_MERGE");
        diff = 0;
        for (size_t i = 0; i < fused.o.size(); ++i) diff += fused.o[i] != strided.o[i];
        for (size_t i = 0; i < fused.lse.size(); ++i) diff += std::memcmp(&fused.lse[i], &strided.lse[i], 4) != 0;
        ST_EXPECT(diff == 0, "%s strided chunk %d: %zu elements differ between the fused merge and the merge kernel",
                  impl, chunk, diff);
      }
    }
  });
}

// fa3 v18: launches chained on one stream with no host sync between them, each one's q the previous one's o,
// so every launch reads what the launch before it wrote. With the early input reads (the PDL wait moved
// behind the block-table and ancestor loads) and the merge kernel's early trigger, a launch's CTAs start
// while the previous grid still runs (the fa3 kernel triggers before its epilogue stores o): a q read
// ahead of the wait would see the poison. Chunk 1024 = one split (fa3 after fa3), 256 = four (fa3 after the
// merge kernel). Each link against the reference of its actual q; both settings give the same bits.
void pdl_chain() {
  struct Env {
    ~Env() {
      unsetenv("DDTREE_TA_FA3_EARLY_INPUTS");
      unsetenv("DDTREE_TA_MERGE_TRIGGER");
    }
  } env;
  constexpr int kLinks = 3;
  TaCase c = make_case(8, 1, 128, 16, {700, 40}, {100, 60}, 2, 4711);
  st::DeviceBuffer<int32_t> indptr(c.indptr), bt(c.block_table), ctx(c.ctx);
  st::DeviceBuffer<uint32_t> anc(c.anc);
  st::DeviceBuffer<uint16_t> k(c.k), v(c.v);
  for_each_impl(128, [&](const char* impl) {
    for (int chunk : {1024, 256}) {
      const size_t ws_bytes = ddtree_tree_attention_workspace_size(c.B(), c.hq, c.hkv, c.d, c.n_max, c.max_pages,
                                                                   c.page, chunk);
      st::DeviceBuffer<unsigned char> ws(std::max<size_t>(ws_bytes, 16));
      std::vector<uint16_t> out[2][kLinks + 1];
      std::vector<float> lse_out[2][kLinks + 1];
      for (int early = 0; early < 2; ++early) {
        // early: the caller's promise (DDTREE_TA_INPUTS_READY: each launch writes only the next one's q) and the
        // merge kernel's early trigger; late: neither.
        unsetenv("DDTREE_TA_FA3_EARLY_INPUTS");
        setenv("DDTREE_TA_MERGE_TRIGGER", early ? "1" : "0", 1);
        std::vector<st::DeviceBuffer<uint16_t>> q;
        std::vector<st::DeviceBuffer<float>> lse;
        q.emplace_back(c.q);
        for (int i = 0; i < kLinks; ++i) {
          q.emplace_back(c.q.size());
          q.back().poison(0xFF);  // NaN: a read ahead of the wait fails the reference check
          lse.emplace_back(size_t(c.T()) * c.hq);
        }
        ST_CUDA(cudaDeviceSynchronize());
        for (int i = 0; i < kLinks; ++i)
          ST_CHECK_STATUS(ddtree_tree_attention_ex(q[i].ptr, k.ptr, v.ptr, indptr.ptr, bt.ptr, ctx.ptr, anc.ptr,
                                                   q[i + 1].ptr, lse[i].ptr, c.T(), c.B(), c.hq, c.hkv, c.d,
                                                   c.num_pages, c.page, c.max_pages, c.n_max, c.sm_scale, chunk,
                                                   DDTREE_DTYPE_BFLOAT16, ws.ptr, ws_bytes, nullptr,
                                                   early ? DDTREE_TA_INPUTS_READY : 0u));
        ST_CUDA(cudaDeviceSynchronize());
        if (early == 0)  // an unknown flag bit is refused before anything is launched
          ST_EXPECT(ddtree_tree_attention_ex(q[0].ptr, k.ptr, v.ptr, indptr.ptr, bt.ptr, ctx.ptr, anc.ptr,
                                             q[1].ptr, lse[0].ptr, c.T(), c.B(), c.hq, c.hkv, c.d, c.num_pages,
                                             c.page, c.max_pages, c.n_max, c.sm_scale, chunk, DDTREE_DTYPE_BFLOAT16,
                                             ws.ptr, ws_bytes, nullptr, 2u) == DDTREE_STATUS_INVALID_ARGUMENT,
                    "%s: flags 2 accepted", impl);
        for (int i = 0; i <= kLinks; ++i) out[early][i] = q[i].download();
        for (int i = 0; i < kLinks; ++i) lse_out[early][i] = lse[i].download();
      }
      for (int i = 1; i <= kLinks; ++i) {
        ST_EXPECT(out[0][i] == out[1][i] && lse_out[0][i - 1] == lse_out[1][i - 1],
                  "%s chunk %d link %d: the early PDL reads change bits", impl, chunk, i);
        TaCase link = c;
        link.q = out[1][i - 1];
        check_against_reference(link, {out[1][i], lse_out[1][i - 1]}, reference_of(link),
                                st::format("%s pdl chain chunk=%d link %d", impl, chunk, i).c_str());
      }
    }
  });
}

}  // namespace

DDTREE_SELFTEST(tree_attention_random_trees) { random_trees(); }
DDTREE_SELFTEST(tree_attention_star_and_ctx0) { star_and_ctx0(); }
DDTREE_SELFTEST(tree_attention_long_pipelines) { long_pipelines(); }
DDTREE_SELFTEST(tree_attention_chain_equals_causal_bitwise) { chain_equals_causal_bitwise(); }

// Every check above on the fa3 back end (sm_90a only; a no-op elsewhere).
DDTREE_SELFTEST(tree_attention_zz_fa3_backend) {
  if (!ddtree_tree_attention_impl_available(DDTREE_TA_IMPL_FA3, 128)) {
    std::printf("  (fa3 back end not available on this device/library: skipped)\n");
    return;
  }
  g_impls = {DDTREE_TA_IMPL_FA3};
  struct Restore {
    ~Restore() { g_impls = {DDTREE_TA_IMPL_MMA, DDTREE_TA_IMPL_WGMMA}; }
  } restore;
  random_trees();
  star_and_ctx0();
  long_pipelines();
  chain_equals_causal_bitwise();
  cluster_merge_matches_kernel_merge();
  tile_schedules();
  pdl_chain();
}
