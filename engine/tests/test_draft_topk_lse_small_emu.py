"""The real small-vocabulary draft_topk_lse kernel (include/ddtree/kernels/draft_topk_lse_small.cuh, one warp
per row; the default for V <= 1024 and k <= 64 with DDTREE_TOPK_SMALL=1) executed on the CPU, against the
reference (CI, no GPU).

tests/topk_emu/topk_small_emu.cpp compiles the kernel with g++ and the cluster emulator (one POSIX thread per
CUDA thread, 128-thread CTAs of four rows, warp shuffles/ballots/reduxes) and compares with the reference:
ids exactly, log-probs and lse within the GPU tests' tolerances. The emulator's exp2 is exact, so this checks
the logic (the bound, the candidate compaction, the ranks, -inf/NaN/+inf rows, V < k, partial CTAs), not
the GPU's rounding; the GPU tests (test_draft_topk_lse.py, "default" at V = 997, 5 and 1, with
DDTREE_TOPK_SMALL=1) run the same comparisons on the device (session 5's H200 run: 204 passed with it on)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from topk_emu_harness import build_emulator, compare_with_reference as compare, logits, run_emulator as run_emu

INF = float("inf")


@pytest.fixture(scope="module")
def emu_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_emulator(tmp_path_factory, "topk_small_emu.cpp", "fake_cuda_v4")


@pytest.mark.parametrize("k", [1, 2, 16, 17, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_small_emulated_random_rows(emu_binary: Path, k: int, dtype: torch.dtype) -> None:
    # 7 rows: one full CTA of four and a partial one; V = 320 (the end-to-end model), 997 (V % 32 != 0) and
    # 1024 (the largest); 256/384/512/513: both sides of each logits-per-lane instantiation (8, 12, 16, 32).
    for vocab in (320, 997, 1024, 256, 384, 512, 513):
        compare(emu_binary, logits((1, 7, vocab), "normal", dtype, seed=vocab + k), k)


@pytest.mark.parametrize("kind", ["ties", "dyadic", "neginf"])
@pytest.mark.parametrize("k", [1, 16, 64])
def test_small_emulated_tie_heavy_rows(emu_binary: Path, kind: str, k: int) -> None:
    # Four distinct values in 1000 logits: the k-th key is shared by hundreds; the lowest ids must win.
    compare(emu_binary, logits((2, 3, 1000), kind, torch.float32, seed=300 + k), k)
    compare(emu_binary, logits((1, 5, 320), kind, torch.bfloat16, seed=400 + k), k)


def test_small_emulated_vocab_below_k_and_tiny_rows(emu_binary: Path) -> None:
    for vocab, k in ((1, 1), (1, 16), (5, 16), (31, 64), (32, 64), (33, 64), (64, 64), (65, 64)):
        compare(emu_binary, logits((1, 6, vocab), "normal", torch.float32, seed=vocab * 100 + k), k)


def test_small_emulated_neg_inf_rows_and_signed_zeros(emu_binary: Path) -> None:
    x = torch.full((1, 4, 300), -5.0)
    x[0, 0, :] = -INF  # all -inf: lse -inf, the lowest ids, lp -inf
    x[0, 1, :] = -INF
    x[0, 1, 299] = -150.0  # one finite logit among -inf, at the last id
    x[0, 2, 0], x[0, 2, 7] = -0.0, 0.0  # -0 == +0: the lower id first
    x[0, 3, 299], x[0, 3, 150], x[0, 3, 40] = 0.0, -0.0, -0.0
    for dtype in (torch.float32, torch.bfloat16):
        for k in (1, 2, 16):
            compare(emu_binary, x.to(dtype), k)


def test_small_emulated_nan_and_inf_rows_flag(emu_binary: Path) -> None:
    x = logits((1, 5, 400), "normal", torch.float32, seed=7)
    x[0, 1, 123] = float("nan")
    x[0, 3, 399] = INF
    lp, ids, lse, events = run_emu(emu_binary, x, 16)
    assert events["flags"] == 1
    for r in (1, 3):
        assert torch.isnan(lse[0, r]) and torch.isnan(lp[0, r]).all() and ids[0, r].eq(-1).all()
    for r in (0, 2, 4):  # the finite rows beside them stay exact
        compare(emu_binary, x[:, r:r + 1], 16)
