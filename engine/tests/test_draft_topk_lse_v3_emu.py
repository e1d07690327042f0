"""The real draft_topk_lse v3 CUDA kernel source, executed on the CPU, against the reference (CI, no GPU).

tests/topk_emu/ compiles include/ddtree/kernels/draft_topk_lse_v3.cuh with g++ and the SIMT emulator of
tests/build_tree_emu/ (one std::thread per CUDA thread, std::barrier for __syncthreads, per-warp barriers
for shuffles and ballots), runs phase 1 over every (chunk, row) block and then the merge kernel, and
compares with the reference: ids exactly, log-probs and lse within the GPU tests' tolerances. The emulator
uses std::exp for __expf, so it checks the logic (bounds, candidates, ranks, fallbacks, NaN handling),
not the GPU's rounding. The GPU tests (test_draft_topk_lse.py) run the same comparisons on the device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from topk_emu_harness import build_emulator, compare_with_reference as compare, logits, run_emulator as run_emu

INF = float("inf")


@pytest.fixture(scope="module")
def emu_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_emulator(tmp_path_factory, "topk_emu.cpp", "fake_cuda")

@pytest.mark.parametrize("k", [1, 2, 16, 17, 32, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_v3_emulated_random_rows(emu_binary: Path, k: int, dtype: torch.dtype) -> None:
    # 20011 = several chunks with a partial last one (bf16 3, fp32 5). Normal logits take the fast path
    # (warp bound up to k = 16, block bound above) without any radix fallback.
    events = compare(emu_binary, logits((1, 3, 20011), "normal", dtype, seed=k), k)
    assert events.get("merge_radix", 0) == 0 and events.get("partial_radix", 0) == 0


@pytest.mark.parametrize("kind", ["ties", "dyadic", "neginf"])
@pytest.mark.parametrize("k", [1, 16, 32, 64])
def test_v3_emulated_tie_heavy_rows(emu_binary: Path, kind: str, k: int) -> None:
    events = compare(emu_binary, logits((2, 1, 9000), kind, torch.float32, seed=100 + k), k)
    if kind == "ties" and k > 1:
        assert events.get("partial_radix", 0) > 0  # 4 distinct values: more than 256 candidates per chunk
    compare(emu_binary, logits((1, 2, 997), kind, torch.bfloat16, seed=200 + k), k)


@pytest.mark.parametrize("k", [16, 64])
def test_v3_emulated_full_vocab_row(emu_binary: Path, k: int) -> None:
    events = compare(emu_binary, logits((1, 1, 163840), "normal", torch.bfloat16, seed=5), k)
    assert events.get("partial_radix", 0) == 0


def test_v3_emulated_small_vocab_and_edges(emu_binary: Path) -> None:
    compare(emu_binary, logits((2, 1, 5), "normal", torch.float32, seed=1), 16)  # V < k: padded ranks
    compare(emu_binary, logits((1, 1, 1), "normal", torch.bfloat16, seed=2), 1)
    x = torch.full((1, 2, 5000), -INF)
    x[0, 1, 4321] = 0.5  # one finite logit in a row of -inf
    compare(emu_binary, x, 8)  # row 0 all -inf: lse -inf, lp -inf, ids 0..7


def test_v3_emulated_merge_overflow_takes_radix_path(emu_binary: Path) -> None:
    # 34 fp32 chunks, each holding the values 31..1 once: every chunk's 32nd item is 0 or below, so more
    # than 1024 items clear the merge's bound and the merge falls back to its radix select.
    vocab = 34 * 4096
    x = torch.full((1, 1, vocab), -1.0)
    gen = torch.Generator().manual_seed(9)
    for c in range(34):
        pos = torch.randperm(4096, generator=gen)[:32] + c * 4096
        x[0, 0, pos] = torch.arange(32, dtype=torch.float32)
    events = compare(emu_binary, x, 32)
    assert events.get("merge_radix", 0) == 1


def test_v3_emulated_nan_row(emu_binary: Path) -> None:
    x = logits((1, 3, 9000), "normal", torch.float32, seed=3)
    x[0, 1, 4444] = float("nan")
    x[0, 2, 17] = INF  # +inf is treated like NaN
    lp, ids, lse, events = run_emu(emu_binary, x, 16)
    assert events["flags"] == 1
    for r in (1, 2):
        assert torch.isnan(lse[0, r]) and torch.isnan(lp[0, r]).all() and ids[0, r].eq(-1).all()
    compare(emu_binary, x[:, :1], 16)


@pytest.mark.parametrize("k", [1, 2, 16])
def test_v3_emulated_signed_zeros_tie_by_id(emu_binary: Path, k: int) -> None:
    # -0 == +0 in the reference's order (by value, then lower id); raw ordered keys put +0 above -0.
    x = torch.full((1, 2, 3000), -5.0)
    x[0, 0, 0], x[0, 0, 7] = -0.0, 0.0
    x[0, 1, 2999], x[0, 1, 1500], x[0, 1, 40] = 0.0, -0.0, -0.0
    compare(emu_binary, x, k)
    compare(emu_binary, x.to(torch.bfloat16), k)
