// Runs the real small-vocabulary draft_topk_lse kernel source (include/ddtree/kernels/draft_topk_lse_small.cuh)
// on the CPU through cluster_emu.h: grid (1, ceil(rows / 4)) of 128-thread CTAs, one warp per row, as the
// launcher configures it. stdin: a text header "rows vocab k dtype" (dtype 0 = fp32, 1 = bf16) and a newline,
// then rows*vocab little-endian float32 logits (bf16 inputs must already be bf16-exact). stdout: per row one
// line "lse_hex | lp_hex... | id...". stderr: "events flags=F barriers=B".
#include <cstdio>
#include <vector>

#include "ddtree/kernels/draft_topk_lse_small.cuh"

namespace k = ddtree::kernels;

template <typename T>
static void run(const std::vector<T>& x, int rows, int vocab, int kk, std::vector<float>& lp, std::vector<int>& id,
                std::vector<float>& lse, int& flags) {
  const int blocks = (rows + k::kSmallWarps - 1) / k::kSmallWarps;
  emu4::launch_clusters(1, blocks, 32 * k::kSmallWarps, [&] {
    k::draft_topk_lse_small_kernel<T>(x.data(), rows, rows, vocab, int64_t(rows) * vocab, vocab, kk, lp.data(),
                                      id.data(), lse.data(), &flags);
  });
}

int main() {
  int rows = 0, vocab = 0, kk = 0, dtype = 0;
  if (std::scanf("%d %d %d %d", &rows, &vocab, &kk, &dtype) != 4) return 2;
  if (vocab > k::kSmallMaxV || kk > k::kV4MaxK) return 4;
  std::getchar();  // the newline before the binary payload
  std::vector<float> xf(size_t(rows) * vocab);
  if (std::fread(xf.data(), 4, xf.size(), stdin) != xf.size()) return 3;
  std::vector<float> lp(size_t(rows) * kk, 12345.f), lse(rows, 12345.f);  // poisoned
  std::vector<int> id(size_t(rows) * kk, 0x5A5A5A5A);
  int flags = 0;
  if (dtype == 1) {
    std::vector<__nv_bfloat16> xb(xf.begin(), xf.end());
    run(xb, rows, vocab, kk, lp, id, lse, flags);
  } else {
    run(xf, rows, vocab, kk, lp, id, lse, flags);
  }
  for (int r = 0; r < rows; ++r) {
    std::printf("%a |", double(lse[r]));
    for (int j = 0; j < kk; ++j) std::printf(" %a", double(lp[size_t(r) * kk + j]));
    std::printf(" |");
    for (int j = 0; j < kk; ++j) std::printf(" %d", id[size_t(r) * kk + j]);
    std::printf("\n");
  }
  std::fprintf(stderr, "events flags=%d barriers=%ld\n", flags, emu4::barrier_count.load());
  return 0;
}
