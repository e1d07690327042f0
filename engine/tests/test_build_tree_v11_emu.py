"""build_tree v11 (build_tree/v11.cuh: one warp's banded threshold search, exact final order) in the CPU
emulation of the real kernel source, against the reference heap: which requests v11 decides itself (the
`v11` event) and which it hands back (`v11_rows`, `v11_handback`), always with outputs equal to the
reference. test_build_tree_emu.py runs every older test under DDTREE_BUILD_TREE_IMPL=v11 as well."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from test_build_tree_emu import bench_rows, check, compile_emu, draft_lp


@pytest.fixture(scope="module")
def emu_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_emu(tmp_path_factory)


@pytest.fixture(autouse=True)
def v11(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDTREE_BUILD_TREE_IMPL", "v11")


@pytest.mark.parametrize("budget,k", [(64, 64), (64, 1024), (256, 64), (256, 1024), (1024, 64), (1024, 1024)])
def test_v11_decides_bench_rows(emu_binary: Path, budget: int, k: int) -> None:
    # The bench's rows (L = 15, top-K of log_softmax(randn(32000) * sharp)) at sharpness 8 / 4 / 1, two draws.
    for sharp in (8.0, 4.0, 1.0):
        for draw in range(2):
            ev: dict[str, int] = {}
            lp = bench_rows(1, k, sharp, seed=budget * 31 + k + int(sharp) + 7 * draw)
            assert check(emu_binary, lp, budget=[budget], seed=k + draw, events=ev) == [0]
            assert ev.get("v11") == 1, (budget, k, sharp, draw, ev)


def test_v11_batch_budgets_zero_to_m(emu_binary: Path) -> None:
    # One launch, B = 18: budgets 0..M (M = 64) including 0 (plain decode), 1, K < M and n_max padding.
    budgets = [0, 1, 2, 3, 5, 8, 13, 16, 17, 21, 31, 32, 33, 40, 50, 63, 64, 64]
    lp = bench_rows(len(budgets), 32, 4.0, seed=77)
    ev: dict[str, int] = {}
    paths = check(emu_binary, lp, budget=budgets, n_max=70, seed=5, events=ev)
    assert paths == [-1] + [0] * (len(budgets) - 1)
    assert ev.get("v11") == len(budgets) - 1, ev


def test_v11_sibling_and_cross_branch_ties(emu_binary: Path) -> None:
    # Equal log-probs inside a row (bf16-like duplicates): sibling ties; 1/64-quantized rows: ties across
    # branches, ordered by walking the rank tuples. Both decided by v11.
    lp = bench_rows(1, 256, 4.0, seed=31)
    lp[0, 0, 90:94] = lp[0, 0, 90]
    lp[0, 0, 95:99] = lp[0, 0, 95]
    lp[0, 1, 3:9] = lp[0, 1, 3]
    ev: dict[str, int] = {}
    assert check(emu_binary, lp, budget=[200], seed=2, events=ev) == [0]
    assert ev.get("v11") == 1, ev
    q = ((bench_rows(1, 64, 4.0, seed=8) * 64).round() / 64).sort(-1, descending=True).values
    ev = {}
    assert check(emu_binary, q, budget=[200], events=ev) == [0]
    assert ev.get("v11") == 1, ev
    gen = torch.Generator().manual_seed(8)
    dy = (-torch.randint(1, 40, (1, 15, 64), generator=gen).float() / 8).sort(-1, descending=True).values
    ev = {}
    assert check(emu_binary, dy, budget=[300], events=ev) == [0]  # massive dyadic ties
    assert ev.get("v11") == 1 or ev.get("v11_handback") == 1, ev


def test_v11_minus_inf_and_small_candidate_spaces(emu_binary: Path) -> None:
    # -inf padding (V < K), a depth whose row is all -inf, fewer candidates than M, L = 1, K = 1.
    lp = bench_rows(1, 128, 4.0, seed=11)
    lp[0, 4, 90:] = -math.inf
    lp[0, 9, :] = -math.inf
    ev: dict[str, int] = {}
    check(emu_binary, lp, budget=[128], events=ev)
    assert ev.get("v11") == 1, ev
    ev = {}
    check(emu_binary, draft_lp(1, 3, 4, seed=5), budget=[100], events=ev)  # 4 + 16 + 64 = 84 < 100
    assert ev.get("v11") == 1, ev
    for depth, k, budget in ((1, 50, 40), (15, 1, 20), (16, 3, 64)):
        ev = {}
        check(emu_binary, draft_lp(2, depth, k, seed=depth + k), budget=[budget, budget // 2], events=ev)
        assert ev.get("v11") == 2, (depth, k, ev)
    lp = bench_rows(1, 8, 4.0, seed=3)
    lp[0, 0, 0] = -math.inf
    lp[0, 0, :] = -math.inf
    check(emu_binary, lp, budget=[10])  # no candidate at all: the root only


def test_v11_hands_back_rows_it_cannot_order(emu_binary: Path) -> None:
    # Unsorted, positive or NaN-free-but-increasing rows go to the v8auto choice, equal to the reference.
    for edit in ("unsorted", "positive"):
        lp = bench_rows(1, 64, 4.0, seed=13)
        if edit == "unsorted":
            lp[0, 2, 5], lp[0, 2, 6] = lp[0, 2, 6].item(), lp[0, 2, 5].item() + 0.5
        else:
            lp[0, 3, 0] = 0.25
        ev: dict[str, int] = {}
        check(emu_binary, lp, budget=[100], events=ev)
        assert "v11" not in ev and ev.get("v11_rows") == 1, (edit, ev)
    # Small budgets handed back (M <= 32: v8 first, which refuses such rows too, then auto's row check and the
    # serial heap) after v11 has used the shared memory, next to a request v11 decides, in one launch.
    lp = bench_rows(3, 64, 4.0, seed=14)
    lp[0, 1, 0] = 0.5
    lp[2, 2, 0] = 0.5
    ev = {}
    check(emu_binary, lp, budget=[16, 30, 32], events=ev)
    assert ev.get("v11_rows") == 2 and ev.get("v11") == 1 and ev.get("invalid_rows") == 2, ev


@pytest.mark.parametrize("seed", range(6))
def test_v11_randomized(emu_binary: Path, seed: int) -> None:
    gen = torch.Generator().manual_seed(1000 + seed)
    depth = int(torch.randint(1, 17, (1,), generator=gen))
    k = int(torch.randint(1, 300, (1,), generator=gen))
    bsz = 3
    budgets = [int(x) for x in torch.randint(0, 400, (bsz,), generator=gen)]
    sharp = float(torch.rand(1, generator=gen) * 8 + 0.5)
    lp = draft_lp(bsz, depth, k, seed=seed, sharp=sharp)
    if seed % 2:
        lp = lp.to(torch.bfloat16).float()  # bf16 log-probs: many equal values
    check(emu_binary, lp, budget=budgets, seed=seed)
