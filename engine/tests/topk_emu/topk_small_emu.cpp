// Runs the real small-vocabulary draft_topk_lse kernel source (include/ddtree/kernels/draft_topk_lse_small.cuh)
// on the CPU through cluster_emu.h: grid (1, ceil(rows / 4)) of 128-thread CTAs, one warp per row, as the
// launcher configures it. stdin: a text header "rows vocab k dtype" (dtype 0 = fp32, 1 = bf16) and a newline,
// then rows*vocab little-endian float32 logits (bf16 inputs must already be bf16-exact). stdout: per row one
// line "lse_hex | lp_hex... | id...". stderr: "events flags=F barriers=B".
#include <cstdio>
#include <vector>

#include "ddtree/kernels/draft_topk_lse_small.cuh"
#include "emu_io.h"

namespace k = ddtree::kernels;

template <typename T>
static void run(const std::vector<T>& x, int rows, int vocab, int kk, std::vector<float>& lp, std::vector<int>& id,
                std::vector<float>& lse, int& flags) {
  const int blocks = (rows + k::kSmallWarps - 1) / k::kSmallWarps;
  auto go = [&](auto kernel) {  // the launcher's choice of logits per lane
    emu4::launch_clusters(1, blocks, 32 * k::kSmallWarps, [&] {
      kernel(x.data(), rows, rows, vocab, int64_t(rows) * vocab, vocab, kk, lp.data(), id.data(), lse.data(), &flags);
    });
  };
  switch (k::small_per_lane(vocab)) {
    case 8: go(k::draft_topk_lse_small_kernel<T, 8>); break;
    case 12: go(k::draft_topk_lse_small_kernel<T, 12>); break;
    case 16: go(k::draft_topk_lse_small_kernel<T, 16>); break;
    default: go(k::draft_topk_lse_small_kernel<T, 32>); break;
  }
}

int main() {
  int rows = 0, vocab = 0, kk = 0, dtype = 0;
  if (std::scanf("%d %d %d %d", &rows, &vocab, &kk, &dtype) != 4) return 2;
  if (vocab > k::kSmallMaxV || kk > k::kV4MaxK) return 4;
  std::getchar();  // the newline before the binary payload
  std::vector<float> xf;
  if (!topk_emu_io::read_logits(rows, vocab, xf)) return 3;
  topk_emu_io::Outputs out(rows, kk);
  if (dtype == 1) {
    std::vector<__nv_bfloat16> xb(xf.begin(), xf.end());
    run(xb, rows, vocab, kk, out.lp, out.id, out.lse, out.flags);
  } else {
    run(xf, rows, vocab, kk, out.lp, out.id, out.lse, out.flags);
  }
  topk_emu_io::print_rows(rows, kk, out);
  std::fprintf(stderr, "events flags=%d barriers=%ld\n", out.flags, emu4::barrier_count.load());
  return 0;
}
