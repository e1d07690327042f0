"""build_tree's survivor order by the bucketed rank (build_tree/rank.cuh, the default since session 13) in the CPU
emulation of the real kernel source, against the reference heap, next to DDTREE_BUILD_TREE_ORDER=bitonic (the
tighten and the sorts, the default before) and =rankt (the tighten, then the rank): the `rank` event says the rank ran, `rank_full` that a bin over kRankBinCap handed the order back
to the sorts. test_build_tree_emu.py runs every older test under the default order (the rank) as well."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from test_build_tree_emu import bench_rows, check, compile_emu


@pytest.fixture(scope="module")
def emu_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_emu(tmp_path_factory)


@pytest.fixture(autouse=True, params=["rank", "bitonic", "rankt"])
def order(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("DDTREE_BUILD_TREE_IMPL", "v9auto")  # the library default
    monkeypatch.setenv("DDTREE_BUILD_TREE_ORDER", request.param)
    return str(request.param)


@pytest.mark.parametrize("budget,k,sharp", [(256, 64, 8.0), (256, 64, 1.0), (256, 1024, 8.0), (256, 1024, 1.0),
                                            (100, 64, 4.0), (1024, 64, 4.0), (1024, 1024, 1.0)])
def test_rank_orders_bench_rows(emu_binary: Path, order: str, budget: int, k: int, sharp: float) -> None:
    # The bench's rows (L = 15): the rank orders every survivor set itself, with the reference's output.
    ev: dict[str, int] = {}
    lp = bench_rows(1, k, sharp, seed=budget * 31 + k + int(sharp))
    assert check(emu_binary, lp, budget=[budget], seed=k, events=ev) == [0]
    if order != "bitonic":
        assert ev.get("rank") == 1 and "rank_full" not in ev, ev
    else:
        assert "rank" not in ev, ev


def test_bunched_scores_hand_the_order_back_to_the_sort(emu_binary: Path, order: str) -> None:
    # One greedy chain near 0 and every other candidate within ~0.1 of -20: the bins span [-20.1, 0], so the
    # ~240 survivors off the chain share one or two bins (> kRankBinCap) and the sorts decide.
    k, depth = 64, 15
    row = [-1e-3] + [-20.0 - 1e-3 * r for r in range(1, k)]
    lp = torch.tensor([[row] * depth], dtype=torch.float32)
    ev: dict[str, int] = {}
    assert check(emu_binary, lp, budget=[256], seed=1, events=ev) == [0]
    if order != "bitonic":
        assert ev.get("rank") == 1 and ev.get("rank_full") == 1, ev
    else:
        assert "rank" not in ev, ev


def test_rank_batch_of_budgets(emu_binary: Path, order: str) -> None:
    # One launch with M from 65 to 1024 (the rank's one- and two-slot instances) and K = 64 / 1024 rows mixed.
    budgets = [65, 128, 200, 256, 511, 700, 1024]
    lp = torch.cat([bench_rows(1, 1024, s, seed=40 + i) for i, s in enumerate((8.0, 4.0, 1.0, 2.0, 4.0, 8.0, 1.0))])
    ev: dict[str, int] = {}
    assert check(emu_binary, lp, budget=budgets, seed=5, events=ev) == [0] * len(budgets)
    assert (ev.get("rank") == len(budgets)) == (order != "bitonic"), ev
