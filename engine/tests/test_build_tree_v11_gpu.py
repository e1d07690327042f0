"""build_tree v11 (build_tree/v11.cuh: one warp's banded threshold search, exact final order) on the GPU vs the
reference heap: the bench's rows at M = 64 / 256 / 1024 (B = 8), budgets 0..M in one launch, sibling ties and
ties across branches, -inf padding, rows it hands back. Every test of test_build_tree_gpu.py also runs under
DDTREE_BUILD_TREE_IMPL=v11."""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from test_build_tree_gpu import run_both  # noqa: E402


@pytest.fixture(autouse=True)
def v11(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDTREE_BUILD_TREE_IMPL", "v11")


def bench_rows(bsz: int, k: int, sharp: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(bsz, 15, 32000, generator=gen) * sharp, -1).topk(k, -1).values


@pytest.mark.parametrize("m", [16, 64, 256, 1024])
def test_v11_bench_rows(m: int) -> None:
    for k in sorted({min(m, 64), 1024}):
        for sharp in (8.0, 4.0, 1.0):
            run_both(bench_rows(8, k, sharp, seed=m * 11 + k + int(sharp)), [m] * 8, n_max=m + 1, seed=m + k)


def test_v11_budgets_zero_to_m_one_launch() -> None:
    budgets = list(range(0, 257, 16)) + [1, 2, 255]
    lp = bench_rows(len(budgets), 128, 4.0, seed=6)
    run_both(lp, budgets, n_max=257, seed=7)


def test_v11_ties_inf_and_hand_backs() -> None:
    lp = bench_rows(5, 256, 4.0, seed=33)
    lp[0, 0, 90:94] = lp[0, 0, 90]  # sibling ties
    lp[0, 1, 3:9] = lp[0, 1, 3]
    lp[1] = ((lp[1] * 64).round() / 64).sort(-1, descending=True).values  # ties across branches
    lp[2, 4, 100:] = -math.inf  # -inf padding
    lp[2, 9, :] = -math.inf  # a depth without candidates
    lp[3, 3, 0] = 0.25  # positive: handed back
    lp[4] = lp[4].to(torch.bfloat16).float()  # bf16 log-probs: many equal values
    run_both(lp, [200, 200, 200, 200, 256], n_max=257, seed=8)
