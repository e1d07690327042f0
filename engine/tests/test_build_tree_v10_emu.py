"""build_tree v10 (build_tree/v10.cuh: M > 64) in the CPU emulation of the real kernel source, against the
reference heap: which requests v10 decides itself (the `v10` event) and which it hands back (`v10_*`
events), always with outputs equal to the reference. test_build_tree_emu.py runs every older test under
DDTREE_BUILD_TREE_IMPL=v10 as well."""

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
def v10(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDTREE_BUILD_TREE_IMPL", "v10")


@pytest.mark.parametrize("budget,k", [(65, 64), (100, 128), (256, 64), (256, 1024), (512, 1024)])
def test_v10_decides_bench_rows(emu_binary: Path, budget: int, k: int) -> None:
    # The bench's rows (L = 15, top-K of log_softmax(randn(32000) * sharp)) at sharpness 8 / 4 / 1.
    for sharp in (8.0, 4.0, 1.0):
        ev: dict[str, int] = {}
        lp = bench_rows(1, k, sharp, seed=budget * 31 + k + int(sharp))
        assert check(emu_binary, lp, budget=[budget], seed=k, events=ev) == [0]
        assert ev.get("v10") == 1, (budget, k, sharp, ev)


def test_v10_batch_mixed_budgets(emu_binary: Path) -> None:
    # One launch: v10 for M > 64, v8 for M <= 32, auto for 33..64, plain decode for 0; the last request's
    # K = 32 < M keeps the one-deviation count below M over the first grid (linear rounds follow).
    ev: dict[str, int] = {}
    lp = bench_rows(6, 64, 4.0, seed=4242)
    lp[5, :, 32:] = lp[5, :, 32:] - 30.0
    paths = check(emu_binary, lp, budget=[300, 0, 16, 64, 130, 200], n_max=301, seed=9, events=ev)
    assert paths == [0, -1, 0, 0, 0, 0]
    assert ev.get("v10") == 3 and ev.get("v8") == 1, ev


def test_v10_sibling_ties_stay_on_v10(emu_binary: Path) -> None:
    # Equal log-probs inside a row (duplicate logits): siblings tie, and the heap orders them by rank,
    # which is the order of the key's candidate index; v10 decides those itself. Here depth-1 ranks 0..97
    # are nodes: one tie group inside, one across the cut (95..97 in, 98 out). (Duplicates whose
    # children are nodes too tie across branches: those go back to the older paths, as in the next test.)
    lp = bench_rows(1, 256, 4.0, seed=31)
    lp[0, 0, 90:94] = lp[0, 0, 90]
    lp[0, 0, 95:99] = lp[0, 0, 95]
    ev: dict[str, int] = {}
    assert check(emu_binary, lp, budget=[200], seed=2, events=ev) == [0]
    assert ev.get("v10") == 1, ev


def test_v10_hands_hard_rows_back(emu_binary: Path) -> None:
    # Ties across branches (dyadic rows), -inf padding, zero row heads, a range too wide for the integer
    # scores, and too few one-deviation candidates: another path decides, equal to the reference.
    ev: dict[str, int] = {}
    lp = bench_rows(1, 64, 4.0, seed=8)
    lp = ((lp * 64).round() / 64).sort(-1, descending=True).values  # 1/64-quantized: ties across branches
    check(emu_binary, lp, budget=[200], events=ev)
    assert "v10" not in ev and ev.get("v10_tie") == 1, ev
    ev = {}
    gen = torch.Generator().manual_seed(8)
    dy = (-torch.randint(1, 40, (1, 15, 64), generator=gen).float() / 8).sort(-1, descending=True).values
    check(emu_binary, dy, budget=[300], events=ev)  # massive dyadic ties: over the candidate cap
    assert "v10" not in ev and ev.get("v10_cap") == 1, ev
    for edit in ("inf", "zero_head", "wide"):
        lp = bench_rows(1, 128, 4.0, seed=11)
        if edit == "inf":
            lp[0, 4, 90:] = -math.inf
        elif edit == "zero_head":
            lp[0, 3, 0] = 0.0
        else:
            lp[0, 0, 0] = -6.6857430702782494e-09
        ev = {}
        check(emu_binary, lp, budget=[128], events=ev)
        assert "v10" not in ev and ev.get("v10_rows") == 1, (edit, ev)
    ev = {}
    check(emu_binary, draft_lp(1, 3, 4, seed=5), budget=[100], events=ev)  # 4 + 4*4 + 4*4*4 = 84 < 100
    assert "v10" not in ev and ev.get("v10_count1") == 1, ev


def test_v10_caps_hand_back(emu_binary: Path) -> None:
    # K = 64 < M = 1024: the one-deviation bound leaves far more than 3072 candidates above it.
    ev: dict[str, int] = {}
    assert check(emu_binary, bench_rows(1, 64, 4.0, seed=17), budget=[1024], seed=3, events=ev) == [0]
    assert "v10" not in ev and ev.get("v10_cap") == 1, ev
