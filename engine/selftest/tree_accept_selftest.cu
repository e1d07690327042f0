// Self-checks of tree_accept: a hand-built tree with literal outputs, the Gumbel noise bits pinned to the
// Python reference's values, and random trees against a host walk (greedy and sampled).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "ddtree/kernels/tree_accept.cuh"
#include "ddtree/tree_accept.h"
#include "selftest.h"

namespace {

struct Tree {
  int n;                        // real nodes
  std::vector<int> token, parent, first_child, next_sibling;  // padded to n_max
};

// Child lists from parents (children in increasing index = pop order).
void link(Tree& t, int n_max) {
  t.first_child.assign(n_max, -1);
  t.next_sibling.assign(n_max, -1);
  std::vector<int> last(n_max, -1);
  for (int i = 1; i < t.n; ++i) {
    const int p = t.parent[i];
    if (last[p] < 0) t.first_child[p] = i;
    else t.next_sibling[last[p]] = i;
    last[p] = i;
  }
}

struct Outputs {
  std::vector<int> accept_nodes, accept_len, committed, bonus, finished;
};

Outputs run_gpu(const std::vector<float>& logits, int batch, int n_max, int vocab, bool bf16,
                const std::vector<Tree>& trees, const std::vector<int>& ctx, const std::vector<float>& temp,
                const std::vector<int64_t>& seed, const std::vector<int>& stops, int max_depth, int* flags_out) {
  std::vector<int> tok, fc, ns, nn;
  for (const Tree& t : trees) {
    tok.insert(tok.end(), t.token.begin(), t.token.end());
    fc.insert(fc.end(), t.first_child.begin(), t.first_child.end());
    ns.insert(ns.end(), t.next_sibling.begin(), t.next_sibling.end());
    nn.push_back(t.n);
  }
  const st::DeviceLogits dev_logits(logits, bf16);
  const void* d_logits = dev_logits.ptr;
  st::DeviceBuffer<int32_t> d_tok(tok), d_fc(fc), d_ns(ns), d_nn(nn), d_ctx(ctx), d_flags(std::vector<int>{0});
  st::DeviceBuffer<float> d_temp(temp);
  st::DeviceBuffer<int64_t> d_seed(seed);
  st::DeviceBuffer<int32_t> d_stop(stops.empty() ? std::vector<int>{0} : stops);
  const int width = max_depth + 1;
  const size_t ws_bytes = ddtree_tree_accept_workspace_size(batch, n_max, vocab);
  st::DeviceBuffer<uint8_t> ws(ws_bytes);
  // Arrival counters of the fused plan: zeroed once and shared by every call of the process, so each
  // call also checks that the previous one left them at zero.
  static st::DeviceBuffer<uint32_t> counters(std::vector<uint32_t>(64, 0u));
  ST_REQUIRE(batch <= 64, "run_gpu: batch %d > 64 counters", batch);
  // Both launch plans on the same inputs, the fused one with and without its one-CTA variant
  // (DDTREE_ACCEPT_ONE_CTA, read per call; where the variant does not fit, both run the chunked kernel), and the
  // chunked kernel again with session 6's scoring loop and launch (plan 3: DDTREE_ACCEPT_SCORE=unrolled,
  // DDTREE_ACCEPT_PDL=0) and with the compact scoring in its early mode (plan 4: PDL launch; the one-CTA variant
  // runs the compact scoring too), and with the packed bf16 scoring forced at every vocabulary (plan 5, session 10:
  // the default only above V = 1024; fp32 rows and vectors crossing the vocab score compact). The fused plan's
  // results are returned and every one must equal the split's.
  constexpr int kPlans = 6;
  Outputs out[kPlans];
  int flag_out[kPlans];
  for (int plan = 0; plan < kPlans; ++plan) {
    st::DeviceBuffer<int32_t> an(size_t(batch) * width), al(batch), ci(size_t(batch) * width), bo(batch), fi(batch);
    st::DeviceBuffer<int32_t> d_flags(std::vector<int>{0});
    an.poison();
    ci.poison();
    al.poison();
    ws.poison();
    const ddtree_dtype_t dt = bf16 ? DDTREE_DTYPE_BFLOAT16 : DDTREE_DTYPE_FLOAT32;
    const bool s6 = plan == 3, early = plan == 4, packed = plan == 5;
    const st::ScopedEnv score("DDTREE_ACCEPT_SCORE",
                              s6 ? "unrolled" : early || plan == 2 ? "compact" : packed ? "packed" : nullptr);
    const st::ScopedEnv pdl("DDTREE_ACCEPT_PDL", s6 || packed ? "0" : early ? "1" : nullptr);
    if (plan == 0) {
      ST_CHECK_STATUS(ddtree_tree_accept(d_logits, dt, batch, n_max, vocab, int64_t(n_max) * vocab, vocab, d_tok.ptr,
                                         d_fc.ptr, d_ns.ptr, d_nn.ptr, d_ctx.ptr, d_temp.ptr, d_seed.ptr, d_stop.ptr,
                                         int(stops.size()), max_depth, an.ptr, al.ptr, ci.ptr, bo.ptr, fi.ptr, ws.ptr,
                                         ws_bytes, d_flags.ptr, nullptr));
    } else {
      const st::ScopedEnv one_cta("DDTREE_ACCEPT_ONE_CTA", plan == 2 ? "1" : "0");
      ST_CHECK_STATUS(ddtree_tree_accept_fused(d_logits, dt, batch, n_max, vocab, int64_t(n_max) * vocab, vocab,
                                               d_tok.ptr, d_fc.ptr, d_ns.ptr, d_nn.ptr, d_ctx.ptr, d_temp.ptr,
                                               d_seed.ptr, d_stop.ptr, int(stops.size()), max_depth, an.ptr, al.ptr,
                                               ci.ptr, bo.ptr, fi.ptr, ws.ptr, ws_bytes, counters.ptr, d_flags.ptr,
                                               nullptr));
    }
    ST_CUDA(cudaDeviceSynchronize());
    flag_out[plan] = d_flags.download()[0];
    out[plan] = Outputs{an.download(), al.download(), ci.download(), bo.download(), fi.download()};
  }
  const auto left = counters.download();
  for (int b = 0; b < 64; ++b)
    ST_REQUIRE(left[b] == 0, "fused plan left counter %d at %u (must return to zero)", b, left[b]);
  static const char* const kPlanNames[kPlans] = {
      "split", "fused", "fused (one-CTA variant where it fits)", "fused (session 6 scoring)",
      "fused (compact scoring, early mode)", "fused (packed bf16 scoring)"};
  for (int plan = 1; plan < kPlans; ++plan)
    ST_REQUIRE(out[0].accept_nodes == out[plan].accept_nodes && out[0].accept_len == out[plan].accept_len &&
                   out[0].committed == out[plan].committed && out[0].bonus == out[plan].bonus &&
                   out[0].finished == out[plan].finished && flag_out[0] == flag_out[plan],
               "%s and split plans differ (batch %d, n_max %d, vocab %d, flags 0x%x / 0x%x)", kPlanNames[plan],
               batch, n_max, vocab, flag_out[0], flag_out[plan]);
  *flags_out = flag_out[1];
  return out[1];
}

// Host copies of the noise (plain float operations: IEEE-rounded, no contraction on the host build).
uint32_t h_mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}
float h_log32(float x) {
  int bits;
  std::memcpy(&bits, &x, 4);
  int e = ((bits >> 23) & 0xFF) - 127;
  int mb = (bits & 0x7FFFFF) | 0x3F800000;
  float m;
  std::memcpy(&m, &mb, 4);
  if (m > float(1.41421356237309504880)) {
    m = m * 0.5f;
    e += 1;
  }
  volatile float f = m - 1.0f;
  volatile float s = f / (2.0f + f);
  volatile float z = s * s;
  volatile float poly = float(1.0 / 11.0);
  poly = poly * z; poly = poly + float(1.0 / 9.0);
  poly = poly * z; poly = poly + float(1.0 / 7.0);
  poly = poly * z; poly = poly + float(1.0 / 5.0);
  poly = poly * z; poly = poly + float(1.0 / 3.0);
  poly = poly * z;
  volatile float sp = s * poly;
  volatile float t = s + sp;
  volatile float el = float(e) * float(0.69314718055994530942);
  return el + (t + t);
}
float h_gumbel(uint64_t seed, uint32_t request, uint32_t pos, uint32_t v) {
  uint32_t h = h_mix32(uint32_t(seed) ^ 0x9E3779B9u);
  h = h_mix32(h ^ uint32_t(seed >> 32));
  h = h_mix32(h ^ request);
  h = h_mix32(h ^ pos);
  h = h_mix32(h_mix32(h ^ v) ^ 0x5BD1E995u);
  const float u = float(h >> 8) * 5.9604644775390625e-8f;
  if (u == 0.f) return -INFINITY;
  return -h_log32(-h_log32(u));
}

__global__ void gumbel_probe(const int64_t* seed, const int* req, const int* pos, const int* vid, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = ddtree::kernels::gumbel(ddtree::kernels::gumbel_key(uint64_t(seed[i]), uint32_t(req[i]),
                                                                          uint32_t(pos[i])), uint32_t(vid[i]));
}

}  // namespace

DDTREE_SELFTEST(tree_accept_gumbel_bits_match_python_reference) {
  // Literal values printed by ddtree_engine.reference.tree_accept.gumbel_noise (float32 bits).
  const std::vector<int64_t> seed = {0, 1, 123456789012345LL, -5, 42};
  const std::vector<int> req = {0, 0, 3, 7, 1}, pos = {0, 5, 1000, 99999, 17}, vid = {0, 7, 163839, 42, 31999};
  const uint32_t want[5] = {0x3f4f029au, 0xbd82aa69u, 0xbf96f373u, 0x403a772eu, 0xbecd0a66u};
  st::DeviceBuffer<int64_t> d_seed(seed);
  st::DeviceBuffer<int> d_req(req), d_pos(pos), d_vid(vid);
  st::DeviceBuffer<float> out(5);
  gumbel_probe<<<1, 32>>>(d_seed.ptr, d_req.ptr, d_pos.ptr, d_vid.ptr, out.ptr, 5);
  ST_CUDA(cudaGetLastError());
  const auto got = out.download();
  for (int i = 0; i < 5; ++i) {
    uint32_t bits, hbits;
    std::memcpy(&bits, &got[i], 4);
    const float h = h_gumbel(uint64_t(seed[i]), req[i], pos[i], vid[i]);
    std::memcpy(&hbits, &h, 4);
    ST_EXPECT(bits == want[i], "case %d: device bits 0x%08x, python 0x%08x", i, bits, want[i]);
    ST_EXPECT(hbits == want[i], "case %d: host bits 0x%08x, python 0x%08x", i, hbits, want[i]);
  }
}

DDTREE_SELFTEST(tree_accept_golden_greedy_and_stop) {
  // Root 0 -> {1: tok 5, 2: tok 3}; 1 -> {3: tok 2}; 2 -> {4: tok 7}. Target argmax: node0 -> 3,
  // node2 -> 7, node4 -> 1 (no child holds 1): accept [0, 2, 4], new tokens [3, 7, 1], bonus 1.
  const int n_max = 6, vocab = 8;
  Tree t;
  t.n = 5;
  t.token = {9, 5, 3, 2, 7, -1};
  t.parent = {-1, 0, 0, 1, 2, -1};
  link(t, n_max);
  std::vector<float> logits(size_t(n_max) * vocab, 0.f);
  logits[0 * vocab + 3] = 2.f;
  logits[2 * vocab + 7] = 1.f;
  logits[4 * vocab + 1] = 3.f;
  logits[4 * vocab + 6] = 3.f;  // tie with id 1: the lower id wins
  logits[1 * vocab + 2] = 5.f;  // node 1 is never reached
  int flags = 0;
  Outputs o = run_gpu(logits, 1, n_max, vocab, false, {t}, {10}, {0.f}, {1}, {}, 5, &flags);
  const std::vector<int> want_an = {0, 2, 4, -1, -1, -1}, want_ci = {3, 7, 1, -1, -1, -1};
  ST_EXPECT(o.accept_nodes == want_an, "accept_nodes [%d %d %d %d]", o.accept_nodes[0], o.accept_nodes[1],
            o.accept_nodes[2], o.accept_nodes[3]);
  ST_EXPECT(o.committed == want_ci, "committed [%d %d %d %d]", o.committed[0], o.committed[1], o.committed[2],
            o.committed[3]);
  ST_EXPECT(o.accept_len[0] == 3 && o.bonus[0] == 1 && o.finished[0] == 0, "len %d bonus %d finished %d",
            o.accept_len[0], o.bonus[0], o.finished[0]);
  ST_EXPECT(flags == 0, "flags 0x%x", flags);
  // Stop id 7: cut after it.
  o = run_gpu(logits, 1, n_max, vocab, true, {t}, {10}, {0.f}, {1}, {11, 7}, 5, &flags);
  ST_EXPECT(o.accept_len[0] == 2 && o.bonus[0] == 7 && o.finished[0] == 1, "stop: len %d bonus %d finished %d",
            o.accept_len[0], o.bonus[0], o.finished[0]);
  ST_EXPECT(o.accept_nodes[0] == 0 && o.accept_nodes[1] == 2 && o.accept_nodes[2] == -1, "stop: accept_nodes");
  ST_EXPECT(o.committed[0] == 3 && o.committed[1] == 7 && o.committed[2] == -1, "stop: committed");
  // Width 2 (max_depth 1): the walk stops at depth 1, bonus = node 2's target.
  o = run_gpu(logits, 1, n_max, vocab, false, {t}, {10}, {0.f}, {1}, {}, 1, &flags);
  ST_EXPECT(o.accept_len[0] == 2 && o.bonus[0] == 7 && o.committed[0] == 3 && o.committed[1] == 7,
            "max_depth 1: len %d bonus %d", o.accept_len[0], o.bonus[0]);
}

DDTREE_SELFTEST(tree_accept_random_trees_vs_host) {
  st::Rng rng(77);
  struct Cfg { int batch, n_max, vocab; bool bf16; float temp; };
  const Cfg cfgs[] = {{3, 64, 32000, true, 0.f}, {2, 33, 997, false, 0.f}, {4, 48, 20000, false, 0.8f},
                      {2, 16, 997, true, 1.5f}, {1, 256, 151936, true, 0.f}};
  for (const Cfg& c : cfgs) {
    std::vector<Tree> trees(c.batch);
    std::vector<int> ctx(c.batch);
    std::vector<float> temp(c.batch);
    std::vector<int64_t> seed(c.batch);
    std::vector<float> logits(size_t(c.batch) * c.n_max * c.vocab);
    for (int b = 0; b < c.batch; ++b) {
      Tree& t = trees[b];
      t.n = 1 + rng.below(c.n_max);
      t.token.assign(c.n_max, -1);
      t.parent.assign(c.n_max, -1);
      t.token[0] = rng.below(c.vocab);
      std::vector<std::vector<int>> kids(c.n_max);
      for (int i = 1; i < t.n; ++i) {
        const int p = rng.below(std::min(i, 1 + i / 2 + 1));  // bias toward deep chains
        int tok;
        bool dup;
        do {  // tokens unique among siblings
          tok = rng.below(c.vocab);
          dup = false;
          for (int s : kids[p]) dup |= t.token[s] == tok;
        } while (dup);
        t.parent[i] = p;
        t.token[i] = tok;
        kids[p].push_back(i);
      }
      link(t, c.n_max);
      ctx[b] = rng.below(5000);
      temp[b] = (b % 2 == 0) ? c.temp : 0.f;
      seed[b] = int64_t(rng.next());
      float* lb = &logits[size_t(b) * c.n_max * c.vocab];
      for (size_t i = 0; i < size_t(c.n_max) * c.vocab; ++i) lb[i] = 2.f * rng.normal();
      for (int i = 0; i < t.n; ++i)  // usually favour one child so that walks go deep
        if (!kids[i].empty() && rng.below(5) != 0) lb[size_t(i) * c.vocab + t.token[kids[i][rng.below(int(kids[i].size()))]]] += 12.f;
    }
    const std::vector<int> stops = {int(rng.below(c.vocab))};
    const int max_depth = c.n_max - 1;
    int flags = 0;
    const Outputs o = run_gpu(logits, c.batch, c.n_max, c.vocab, c.bf16, trees, ctx, temp, seed, stops, max_depth, &flags);
    ST_EXPECT(flags == 0, "flags 0x%x", flags);
    for (int b = 0; b < c.batch; ++b) {
      const Tree& t = trees[b];
      std::vector<int> depth(t.n, 0);
      for (int i = 1; i < t.n; ++i) depth[i] = depth[t.parent[i]] + 1;
      auto target = [&](int i) {
        const float* row = &logits[(size_t(b) * c.n_max + i) * c.vocab];
        int best = 0;
        float bv = -INFINITY;
        for (int v = 0; v < c.vocab; ++v) {
          float x = c.bf16 ? st::bf16_to_f32(st::f32_to_bf16(row[v])) : row[v];
          if (temp[b] > 0.f) {
            volatile float q = x / temp[b];
            x = q + h_gumbel(uint64_t(seed[b]), b, uint32_t(ctx[b] + depth[i] + 1), v);
          }
          if (x > bv || v == 0) {
            bv = x;
            best = v;
          }
        }
        return best;
      };
      std::vector<int> path = {0};
      int bonus = 0;
      while (true) {
        const int want = target(path.back());
        bonus = want;
        int child = -1;
        for (int j = 1; j < t.n; ++j)
          if (t.parent[j] == path.back() && t.token[j] == want) child = j;
        if (child < 0 || int(path.size()) == max_depth + 1) break;
        path.push_back(child);
      }
      std::vector<int> toks;
      for (size_t i = 1; i < path.size(); ++i) toks.push_back(t.token[path[i]]);
      toks.push_back(bonus);
      int fin = 0;
      for (size_t i = 0; i < toks.size(); ++i)
        if (toks[i] == stops[0]) {
          toks.resize(i + 1);
          path.resize(i + 1);
          bonus = toks[i];
          fin = 1;
          break;
        }
      const int width = max_depth + 1;
      bool ok = o.accept_len[b] == int(path.size()) && o.bonus[b] == bonus && o.finished[b] == fin;
      for (int i = 0; i < width && ok; ++i) {
        ok &= o.accept_nodes[size_t(b) * width + i] == (i < int(path.size()) ? path[i] : -1);
        ok &= o.committed[size_t(b) * width + i] == (i < int(toks.size()) ? toks[i] : -1);
      }
      ST_EXPECT(ok, "N%d V%d T%.2f b%d: len %d (want %zu) bonus %d (want %d) finished %d (want %d)", c.n_max, c.vocab,
                temp[b], b, o.accept_len[b], path.size(), o.bonus[b], bonus, o.finished[b], fin);
    }
  }
}
