// Runs the real draft_topk_lse v3 kernel source (include/ddtree/kernels/draft_topk_lse_v3.cuh) on the
// CPU through build_tree_emu/simt_emu.h: phase 1 over every (chunk, row) block, then the merge.
// stdin: a text header "rows vocab k dtype" (dtype 0 = fp32, 1 = bf16) and a newline, then rows*vocab
// little-endian float32 logits (bf16 inputs must already be bf16-exact). stdout: per row one line
// "lse_hex | lp_hex... | id...". stderr: "events fallback1=N fallback2=M barriers=B".
#include <cstdio>
#include <map>
#include <string>
#include <vector>

static std::map<std::string, int> g_events;
#define DDTREE_TOPK_V3_EVENT(name) (++g_events[#name])

#include "ddtree/kernels/draft_topk_lse_v3.cuh"
#include "emu_io.h"

namespace k = ddtree::kernels;

template <typename F>
static void launch(int gx, int gy, int threads, F&& kernel) {
  for (int y = 0; y < gy; ++y)
    for (int x = 0; x < gx; ++x) {
      blockIdx.x = unsigned(x);
      blockIdx.y = unsigned(y);
      emu::block_barrier = std::make_unique<std::barrier<>>(threads);
      emu::warp_barriers.clear();
      for (int w = 0; w < threads / 32; ++w) emu::warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
      emu::warp_slots.assign(size_t(threads), 0);
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([t, &kernel] {
          threadIdx.x = unsigned(t);
          kernel();
        });
      for (auto& th : pool) th.join();
    }
}

template <typename T>
static void run(const std::vector<T>& x, int rows, int vocab, int kk, std::vector<float>& lp, std::vector<int>& id,
                std::vector<float>& lse, int& flags) {
  constexpr int CHUNK = k::v3_chunk<T>();
  const int chunks = (vocab + CHUNK - 1) / CHUNK;
  std::vector<uint64_t> cand(size_t(rows) * chunks * k::kV3Slot, 0xA5A5A5A5A5A5A5A5ull);  // poisoned
  std::vector<float2> partial(size_t(rows) * chunks, float2{-1234.f, -1234.f});
  // As the launcher: 16-byte loads only when every row starts 16-byte aligned.
  const bool vec = vocab % (16 / int(sizeof(T))) == 0;
  launch(chunks, rows, k::kV3Threads, [&] {
    if (vec)
      k::draft_topk_partial_v3_kernel<T, true>(x.data(), rows, vocab, int64_t(rows) * vocab, vocab, kk, chunks,
                                              cand.data(), partial.data(), &flags);
    else
      k::draft_topk_partial_v3_kernel<T, false>(x.data(), rows, vocab, int64_t(rows) * vocab, vocab, kk, chunks,
                                               cand.data(), partial.data(), &flags);
  });
  launch(rows, 1, k::kV3MergeThreads, [&] {
    k::draft_topk_merge_v3_kernel<CHUNK>(cand.data(), partial.data(), chunks, kk, vocab, lp.data(), id.data(),
                                         lse.data());
  });
}

int main() {
  int rows = 0, vocab = 0, kk = 0, dtype = 0;
  if (std::scanf("%d %d %d %d", &rows, &vocab, &kk, &dtype) != 4) return 2;
  std::getchar();  // the newline before the binary payload
  std::vector<float> xf;
  if (!topk_emu_io::read_logits(rows, vocab, xf)) return 3;
  topk_emu_io::Outputs out(rows, kk);
  if (dtype == 1) {
    // 16-byte aligned storage like a CUDA allocation.
    std::vector<__nv_bfloat16> xb(xf.begin(), xf.end());
    run(xb, rows, vocab, kk, out.lp, out.id, out.lse, out.flags);
  } else {
    run(xf, rows, vocab, kk, out.lp, out.id, out.lse, out.flags);
  }
  topk_emu_io::print_rows(rows, kk, out);
  std::fprintf(stderr, "events flags=%d barriers=%ld", out.flags, emu::barrier_count);
  for (const auto& [name, count] : g_events) std::fprintf(stderr, " %s=%d", name.c_str(), count);
  std::fprintf(stderr, "\n");
  return 0;
}
