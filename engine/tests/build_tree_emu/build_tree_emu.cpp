// Runs the real build_tree kernel source (include/ddtree/kernels/build_tree.cuh) on the CPU through
// simt_emu.h. Input (stdin, whitespace separated): B L K n_max, then B*L*K log-probs as C hex floats,
// B*L*K ids, B root tokens, B ctx_len, B budgets. Output: per request one line
// "path num_nodes | token... | parent... | depth... | position... | first_child... | next_sibling... | anc...".
#include "simt_emu.h"

#include <cstdio>
#include <string>

// Which path decided each request (1 = the serial fallback), printed first on each output line.
static std::vector<int> g_fallback;
#define DDTREE_BUILD_TREE_TRACE(b, fell_back) (g_fallback[(b)] = (fell_back) ? 1 : 0)
// How often each internal step ran (only thread 0 of the running block records; blocks run one by one).
#include <map>
static std::map<std::string, int> g_events;
#define DDTREE_BUILD_TREE_EVENT(name) (++g_events[#name])
#include <cstdlib>
#include <string>

#include "ddtree/kernels/build_tree.cuh"
#include "ddtree/kernels/build_tree/warp_heap.cuh"

namespace ddtree {
namespace build_tree_k {
alignas(16) unsigned char smem_raw[kSmemBytes];
}  // namespace build_tree_k
}  // namespace ddtree

namespace bt = ddtree::build_tree_k;

static std::string next_token() {
  std::string s;
  int c;
  while ((c = std::getchar()) != EOF && std::isspace(c)) {
  }
  while (c != EOF && !std::isspace(c)) {
    s.push_back(static_cast<char>(c));
    c = std::getchar();
  }
  return s;
}

int main() {
  const int B = std::atoi(next_token().c_str());
  const int L = std::atoi(next_token().c_str());
  const int K = std::atoi(next_token().c_str());
  const int n_max = std::atoi(next_token().c_str());
  const size_t nlp = static_cast<size_t>(B) * L * K;
  std::vector<float> lp(nlp);
  std::vector<int32_t> ids(nlp), root(B), ctx(B), budget(B);
  for (auto& x : lp) x = std::strtof(next_token().c_str(), nullptr);
  for (auto& x : ids) x = std::atoi(next_token().c_str());
  for (auto& x : root) x = std::atoi(next_token().c_str());
  for (auto& x : ctx) x = std::atoi(next_token().c_str());
  for (auto& x : budget) x = std::atoi(next_token().c_str());
  const int W = (n_max + 31) / 32;
  const size_t nn = static_cast<size_t>(B) * n_max;
  // Poison every output so that an unwritten element shows up.
  std::vector<int32_t> token(nn, 0x5A5A5A5A), parent(nn, 0x5A5A5A5A), depth(nn, 0x5A5A5A5A),
      pos(nn, 0x5A5A5A5A), fc(nn, 0x5A5A5A5A), ns(nn, 0x5A5A5A5A), num(B, 0x5A5A5A5A);
  std::vector<uint32_t> anc(nn * W, 0x5A5A5A5Au);
  bt::Params p{lp.data(), ids.data(), root.data(), ctx.data(), budget.data(), L, K, n_max, W,
               token.data(), parent.data(), depth.data(), num.data(), anc.data(), pos.data(),
               fc.data(), ns.data()};
  // The selection, as the library's launcher reads it (DDTREE_BUILD_TREE_IMPL; unset: v6).
  if (const char* v = std::getenv("DDTREE_BUILD_TREE_IMPL")) {
    const std::string s(v);
    p.impl = s == "v7" ? bt::kImplV7 : s == "v6dp" ? bt::kImplV6Dp : s == "auto" ? bt::kImplAuto
             : s == "v8" ? bt::kImplV8 : s == "v8p8" ? bt::kImplV8P8 : s == "v8auto" ? bt::kImplV8Auto
             : s == "v9" ? bt::kImplV9 : s == "v9auto" ? bt::kImplV9Auto : s == "v9s6" ? bt::kImplV9S6
             : s == "v10" ? bt::kImplV10 : s == "v11" ? bt::kImplV11 : bt::kImplV6;
  }
  // The survivors' order, as the launcher reads it (=bitonic: tighten + sorts; =rankt: tighten + rank).
  if (const char* v = std::getenv("DDTREE_BUILD_TREE_ORDER"))
    p.order = std::string(v) == "bitonic" ? bt::kOrderBitonic : std::string(v) == "rankt" ? bt::kOrderRankTighten : bt::kOrderRank;
  g_fallback.assign(B, -1);
  if (bt::warp_heap_applies(p.impl, n_max, L)) {  // as the launcher: the warp-heap kernel (never falls back)
    static_assert(sizeof(bt::WhSmem) <= bt::kSmemBytes, "the emulator's shared buffer holds the warp heap's");
    static_assert(sizeof(bt::WhSmemS6) <= bt::kSmemBytes, "the emulator's shared buffer holds the warp heap's");
    for (int b = 0; b < B; ++b) g_fallback[b] = std::min(std::max(p.budget[b], 0), n_max - 1) > 0 && L > 0 ? 0 : -1;
    if (p.impl == bt::kImplV9S6) emu_launch(B, bt::kWhThreads, [&p] { bt::build_tree_warp_heap_s6_kernel(p); });
    else emu_launch(B, bt::kWhThreads, [&p] { bt::build_tree_warp_heap_kernel(p); });
  } else {
    if (p.impl == bt::kImplV9 || p.impl == bt::kImplV9Auto || p.impl == bt::kImplV9S6) p.impl = bt::kImplV8Auto;
    if (p.impl == bt::kImplV10) emu_launch(B, bt::kThreads, [&p] { bt::build_tree_v10_kernel(p); });
    else if (p.impl == bt::kImplV11) emu_launch(B, bt::kThreads, [&p] { bt::build_tree_v11_kernel(p); });
    else emu_launch(B, bt::kThreads, [&p] { bt::build_tree_kernel(p); });
  }
  for (int b = 0; b < B; ++b) {
    const size_t o = static_cast<size_t>(b) * n_max;
    std::printf("%d %d |", g_fallback[b], num[b]);
    for (auto* arr : {&token, &parent, &depth, &pos, &fc, &ns}) {
      for (int i = 0; i < n_max; ++i) std::printf(" %d", (*arr)[o + i]);
      std::printf(" |");
    }
    for (size_t i = 0; i < static_cast<size_t>(n_max) * W; ++i) std::printf(" %u", anc[o * W + i]);
    std::printf("\n");
  }
  std::fprintf(stderr, "events barriers=%ld", emu::barrier_count);
  for (const auto& [name, count] : g_events) std::fprintf(stderr, " %s=%d", name.c_str(), count);
  std::fprintf(stderr, "\n");
  return 0;
}
