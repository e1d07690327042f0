"""build_tree v10 (build_tree/v10.cuh: M > 64) on the GPU vs the reference heap: bench-shaped rows at the budgets
v10 takes, mixed budgets in one launch, sibling ties it orders itself and ties it hands back. Every test of
test_build_tree_gpu.py also runs under DDTREE_BUILD_TREE_IMPL=v10."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from test_build_tree_gpu import run_both  # noqa: E402


@pytest.fixture(autouse=True, params=["v10"])
def v10(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDTREE_BUILD_TREE_IMPL", request.param)


def bench_rows(bsz: int, k: int, sharp: float, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(bsz, 15, 32000, generator=gen) * sharp, -1).topk(k, -1).values


@pytest.mark.parametrize("m", [65, 100, 256, 512, 1024])
def test_v10_bench_rows(m: int) -> None:
    for k in (64, 1024):
        for sharp in (8.0, 4.0, 1.0):
            run_both(bench_rows(8, k, sharp, seed=m * 7 + k + int(sharp)), [m] * 8, n_max=m + 1, seed=m + k)


def test_v10_mixed_budgets_one_launch() -> None:
    lp = bench_rows(8, 128, 4.0, seed=5)
    run_both(lp, [300, 0, 16, 64, 65, 1024, 130, 1], n_max=1025, seed=3)


def test_v10_ties() -> None:
    lp = bench_rows(3, 256, 4.0, seed=31)
    lp[0, 0, 90:94] = lp[0, 0, 90]  # sibling ties (v10 orders them)
    lp[0, 0, 95:99] = lp[0, 0, 95]
    lp[1] = ((lp[1] * 64).round() / 64).sort(-1, descending=True).values  # ties across branches
    lp[2, 3, 0] = 0.0  # a zero row head
    run_both(lp, [200, 200, 200], n_max=201, seed=4)
