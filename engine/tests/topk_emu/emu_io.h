// The stdin/stdout protocol shared by the draft_topk_lse emulator binaries (topk_emu.cpp, topk_v4_emu.cpp,
// topk_small_emu.cpp) and tests/topk_emu_harness.py: after each binary's own text header and its newline,
// rows*vocab little-endian float32 logits; per row one output line "lse_hex | lp_hex... | id...".
#pragma once
#include <cstdio>
#include <vector>

namespace topk_emu_io {

// The kernel's outputs, poisoned so that a slot the kernel forgets to write shows up in the comparison.
struct Outputs {
  std::vector<float> lp, lse;
  std::vector<int> id;
  int flags = 0;
  Outputs(int rows, int kk) : lp(size_t(rows) * kk, 12345.f), lse(rows, 12345.f), id(size_t(rows) * kk, 0x5A5A5A5A) {}
};

// Reads the binary payload; false on a short read.
inline bool read_logits(int rows, int vocab, std::vector<float>& xf) {
  xf.resize(size_t(rows) * vocab);
  return std::fread(xf.data(), 4, xf.size(), stdin) == xf.size();
}

inline void print_rows(int rows, int kk, const Outputs& out) {
  for (int r = 0; r < rows; ++r) {
    std::printf("%a |", double(out.lse[r]));
    for (int j = 0; j < kk; ++j) std::printf(" %a", double(out.lp[size_t(r) * kk + j]));
    std::printf(" |");
    for (int j = 0; j < kk; ++j) std::printf(" %d", out.id[size_t(r) * kk + j]);
    std::printf("\n");
  }
}

}  // namespace topk_emu_io
