// Runs the real draft_topk_lse v4 kernel source (include/ddtree/kernels/draft_topk_lse_v4.cuh) on the CPU
// through cluster_emu.h: one cluster per row, its CTAs concurrently, as the launcher configures them.
// stdin: a text header "rows vocab k dtype threads async [max_cluster]" (dtype 0 = fp32, 1 = bf16; threads
// 128 or 512 = the kernel's CTA size: the library runs 512, 128 splits small rows over more CTAs; async 1 =
// the st.async/mbarrier exchange (the library's default), 0 = the closing cluster barrier; max_cluster =
// the launcher's largest cluster, 8 unless given: 4 when rows are many) and a newline, then
// rows*vocab little-endian float32 logits (bf16 inputs must already be bf16-exact). stdout: per row one
// line "lse_hex | lp_hex... | id...". stderr: "events flags=F barriers=B cluster=C [cta_radix=N]".
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <vector>

static std::map<std::string, int> g_events;
static std::mutex g_events_mu;
#define DDTREE_TOPK_V4_EVENT(name)                    \
  do {                                                \
    std::lock_guard<std::mutex> lock_(g_events_mu);   \
    ++g_events[#name];                                \
  } while (0)

#include "ddtree/kernels/draft_topk_lse_v4.cuh"
#include "emu_io.h"

namespace k = ddtree::kernels;
static int g_max_cluster = k::kV4MaxCluster;
// The kernel options of the st.async instantiations: the library's default unless the build sets them
// (test_draft_topk_lse_v4_emu.py builds a second binary with the opt-in k > 1 options).
#ifndef DDTREE_TOPK_V4_EMU_OPT
#define DDTREE_TOPK_V4_EMU_OPT k::kV4OptDefault
#endif
template <bool ASYNC>
constexpr unsigned kEmuOpt = ASYNC ? unsigned(DDTREE_TOPK_V4_EMU_OPT) : k::kV4OptDefault;

template <typename T, int THREADS, bool ASYNC>
static int run(const std::vector<T>& x, int rows, int vocab, int kk, std::vector<float>& lp, std::vector<int>& id,
               std::vector<float>& lse, int& flags) {
  const auto split = k::v4_split<T, THREADS>(vocab, g_max_cluster);
  // As the launcher: 16-byte loads only when every row starts 16-byte aligned (rows are contiguous here).
  const bool vec = vocab % (16 / int(sizeof(T))) == 0;
  emu4::launch_clusters(split.cluster, rows, THREADS, [&] {
    if (vec)
      k::draft_topk_lse_v4_kernel<T, true, THREADS, ASYNC, kEmuOpt<ASYNC>>(x.data(), rows, vocab, int64_t(rows) * vocab, vocab, kk,
                                                    split.cluster, split.pv, lp.data(), id.data(), lse.data(),
                                                    &flags);
    else
      k::draft_topk_lse_v4_kernel<T, false, THREADS, ASYNC, kEmuOpt<ASYNC>>(x.data(), rows, vocab, int64_t(rows) * vocab, vocab, kk,
                                                     split.cluster, split.pv, lp.data(), id.data(), lse.data(),
                                                     &flags);
  });
  return split.cluster;
}

template <typename T>
static int run_threads(int threads, bool async, const std::vector<T>& x, int rows, int vocab, int kk,
                       std::vector<float>& lp, std::vector<int>& id, std::vector<float>& lse, int& flags) {
  if (threads == 128)
    return async ? run<T, 128, true>(x, rows, vocab, kk, lp, id, lse, flags)
                 : run<T, 128, false>(x, rows, vocab, kk, lp, id, lse, flags);
  return async ? run<T, k::kV4Threads, true>(x, rows, vocab, kk, lp, id, lse, flags)
               : run<T, k::kV4Threads, false>(x, rows, vocab, kk, lp, id, lse, flags);
}

int main() {
  int rows = 0, vocab = 0, kk = 0, dtype = 0, threads = 0, async = 0;
  if (std::scanf("%d %d %d %d %d %d", &rows, &vocab, &kk, &dtype, &threads, &async) != 6) return 2;
  if (threads != 128 && threads != k::kV4Threads) return 4;
  // An optional max_cluster before the newline that ends the header.
  int ch = std::getchar();
  while (ch == ' ') ch = std::getchar();
  if (ch != '\n') {
    std::ungetc(ch, stdin);
    if (std::scanf("%d", &g_max_cluster) != 1 || g_max_cluster < 1 || g_max_cluster > k::kV4MaxCluster) return 5;
    std::getchar();  // the newline before the binary payload
  }
  std::vector<float> xf;
  if (!topk_emu_io::read_logits(rows, vocab, xf)) return 3;
  topk_emu_io::Outputs out(rows, kk);
  int cluster = 0;
  if (dtype == 1) {
    std::vector<__nv_bfloat16> xb(xf.begin(), xf.end());
    cluster = run_threads(threads, async != 0, xb, rows, vocab, kk, out.lp, out.id, out.lse, out.flags);
  } else {
    cluster = run_threads(threads, async != 0, xf, rows, vocab, kk, out.lp, out.id, out.lse, out.flags);
  }
  topk_emu_io::print_rows(rows, kk, out);
  std::fprintf(stderr, "events flags=%d barriers=%ld cluster=%d", out.flags, emu4::barrier_count.load(), cluster);
  for (const auto& [name, count] : g_events) std::fprintf(stderr, " %s=%d", name.c_str(), count);
  std::fprintf(stderr, "\n");
  return 0;
}
