"""build_tree kernel (libddtree) vs the reference heap on the GPU: every output integer must be equal.

Covers random draft distributions up to L=15, K=1024, M=1024, dyadic score ties, all-equal scores,
-inf padding, rows that force the exact serial fallback (unsorted, positive, inexact fp64 sums),
B > 1 with mixed budgets including 0, and CUDA graph capture + replay with new inputs."""

from __future__ import annotations

import math
import random

import pytest
import torch

from ddtree_engine.reference.build_tree import BuildTreeOutput
from ddtree_engine.reference.build_tree import build_tree as ref_build_tree

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from ddtree_engine.ops.build_tree import build_tree  # noqa: E402  (loads libddtree lazily)

DEV = torch.device("cuda")


@pytest.fixture(autouse=True, params=["v9auto", "v9", "v9s6", "v8auto", "auto", "v6", "v6dp", "v7", "v8", "v10", "v11"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs on each selection the launcher can pick (DDTREE_BUILD_TREE_IMPL, read per call;
    v9auto is the library default): v6 (chain bound + level pool), v6dp (counting bound + level pool), v7
    (counting bound + deviation rounds + counting order), auto (v6dp where M > 256, else v6), v8 (integer
    scores + warp threshold probes where M <= 64, else auto), v8auto (v8 where M <= 32, else auto), v9 (one
    warp's exact heap for launches with n_max <= 65 and L <= 16, else v8auto), v9auto (the warp heap for
    launches with n_max <= 65, else v8auto), v9s6 (session 6's warp-heap kernel where v9 applies: the A/B
    peer), v10 (build_tree/v10.cuh for requests with M > 64, else v8auto; opt-in), v11 (build_tree/v11.cuh for
    requests with L <= 16, what it hands back v8auto; opt-in)."""
    monkeypatch.setenv("DDTREE_BUILD_TREE_IMPL", request.param)
    return str(request.param)


def draft_lp(bsz: int, depth: int, k: int, seed: int, sharp: float = 3.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(bsz, depth, max(2 * k, 1000), generator=gen) * sharp
    return torch.log_softmax(logits, -1).topk(k, -1).values


def run_both(lp: torch.Tensor, budgets: list[int], n_max: int | None = None, seed: int = 0) -> BuildTreeOutput:
    bsz, depth, k = lp.shape
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 163840, (bsz, depth, k), generator=gen, dtype=torch.int32)
    root = torch.randint(0, 163840, (bsz,), generator=gen, dtype=torch.int32)
    ctx = torch.randint(0, 70000, (bsz,), generator=gen, dtype=torch.int32)
    bud = torch.tensor(budgets, dtype=torch.int32)
    n_max = n_max if n_max is not None else min(1025, max(budgets) + 1)
    want = ref_build_tree(lp, ids, root, ctx, bud, n_max)
    got = build_tree(lp.to(DEV), ids.to(DEV), root.to(DEV), ctx.to(DEV), bud.to(DEV), n_max)
    torch.cuda.synchronize()
    assert_same(got, want, f"B={bsz} L={depth} K={k} budgets={budgets[:8]} n_max={n_max}")
    return got


def assert_same(got: BuildTreeOutput, want: BuildTreeOutput, what: str) -> None:
    for name, g, w in zip(BuildTreeOutput._fields, got, want):
        g = g.cpu()
        assert g.shape == w.shape, f"{what}: {name} shape {tuple(g.shape)} != {tuple(w.shape)}"
        if not torch.equal(g, w):
            bad = (g != w).nonzero()[:5].tolist()
            raise AssertionError(f"{what}: {name} differs at {bad}: got {g[tuple(bad[0])]} want {w[tuple(bad[0])]}")


def test_golden_tree() -> None:
    lp = torch.tensor([[[-0.5, -1.0], [-0.25, -2.0], [-1.0, -1.5]]])
    for budget in (0, 1, 5, 7, 8, 14, 20):
        got = run_both(lp, [budget], n_max=max(budget, 1) + 3)
    # and the literal expectations of the hand-worked example (budget 7)
    got = build_tree(lp.to(DEV), torch.tensor([[[10, 11], [20, 21], [30, 31]]], dtype=torch.int32, device=DEV),
                     torch.tensor([99], dtype=torch.int32, device=DEV), torch.tensor([100], dtype=torch.int32, device=DEV),
                     torch.tensor([7], dtype=torch.int32, device=DEV), 10)
    assert got.node_parent[0].tolist() == [-1, 0, 1, 0, 3, 2, 2, 4, -1, -1]
    assert got.node_token[0].tolist() == [99, 10, 20, 11, 20, 30, 31, 30, -1, -1]
    assert [w[0] for w in got.anc[0].tolist()] == [1, 3, 7, 9, 25, 39, 71, 153, 0, 0]


@pytest.mark.parametrize("depth,k,budget", [(15, 64, 256), (15, 1024, 1024), (15, 32, 1024), (15, 8, 64),
                                            (7, 16, 300), (1, 1024, 1024), (15, 1, 20), (3, 4, 1024),
                                            (31, 4, 256), (40, 3, 200), (20, 512, 200)])
def test_random_draft_distributions(depth: int, k: int, budget: int) -> None:
    for sharp in (0.5, 2.0, 6.0):
        run_both(draft_lp(2, depth, k, seed=depth * 7919 + k + int(sharp * 10), sharp=sharp), [budget, budget // 2])


def test_batch_64_with_mixed_budgets() -> None:
    rng = random.Random(3)
    budgets = [rng.choice([0, 1, 2, 7, 15, 64, 256, 1024]) for _ in range(64)]
    run_both(draft_lp(64, 15, 64, seed=5), budgets, n_max=1025)


def test_dyadic_ties_and_equal_scores() -> None:
    rng = random.Random(11)
    for case in range(30):
        depth, k = rng.randint(1, 15), rng.choice([2, 3, 16, 64])
        lp = -torch.tensor([[[rng.randint(0, 8) / 4 for _ in range(k)] for _ in range(depth)]]).sort(-1).values
        run_both(lp, [rng.choice([1, 9, 100, 1024])], seed=case)
    run_both(torch.zeros(1, 15, 64), [1024])  # every score 0: pure lexicographic (serial fallback)
    run_both(torch.full((2, 15, 64), -1.0), [1024, 300])


def test_fallback_inputs_are_exact() -> None:
    lp = draft_lp(3, 6, 8, seed=3)
    lp[0, 2] = lp[0, 2].flip(0)  # unsorted row
    lp[1, 0, 0] = 0.25  # positive log-prob
    run_both(lp, [40, 40, 40])
    inexact = torch.tensor([[[-6.6857430702782494e-09, -20.0, -21.0],
                             [-5.3228440284729, -24.36475944519043, -34.079593658447266]]])
    run_both(inexact, [12])


def test_minus_inf_ranks() -> None:
    lp = draft_lp(2, 5, 16, seed=9)
    lp[:, :, 9:] = -math.inf
    lp[1, 3, 1:] = -math.inf
    lp[1, 2, :] = -math.inf
    run_both(lp, [500, 500])
    run_both(torch.full((1, 4, 8), -math.inf), [10])


def test_cuda_graph_capture_and_replay() -> None:
    bsz, depth, k, n_max = 4, 15, 64, 257
    lp = draft_lp(bsz, depth, k, seed=1).to(DEV)
    ids = torch.randint(0, 1000, (bsz, depth, k), dtype=torch.int32, device=DEV)
    root = torch.arange(bsz, dtype=torch.int32, device=DEV)
    ctx = torch.full((bsz,), 10, dtype=torch.int32, device=DEV)
    bud = torch.tensor([256, 0, 64, 3], dtype=torch.int32, device=DEV)
    build_tree(lp, ids, root, ctx, bud, n_max)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = build_tree(lp, ids, root, ctx, bud, n_max)
    for seed in range(3):
        lp.copy_(draft_lp(bsz, depth, k, seed=100 + seed, sharp=1.0 + seed))
        bud.copy_(torch.tensor([seed * 100, 256, 1, 17], dtype=torch.int32))
        ctx.add_(5)
        graph.replay()
        torch.cuda.synchronize()
        want = ref_build_tree(lp.cpu(), ids.cpu(), root.cpu(), ctx.cpu(), bud.cpu(), n_max)
        assert_same(out, want, f"graph replay {seed}")


def test_rejects_bad_arguments() -> None:
    lp = torch.zeros(1, 2, 4, device=DEV)
    ids = torch.zeros(1, 2, 4, dtype=torch.int32, device=DEV)
    one = torch.zeros(1, dtype=torch.int32, device=DEV)
    with pytest.raises(ValueError, match="float32"):
        build_tree(lp.double(), ids, one, one, one, 8)
    with pytest.raises(ValueError, match="n_max"):
        build_tree(lp, ids, one, one, one, 2000)
    with pytest.raises(ValueError, match="budget"):
        build_tree(lp, ids, one, one, one.long(), 8)
    with pytest.raises(ValueError, match="contiguous"):
        build_tree(torch.zeros(1, 4, 2, device=DEV).transpose(1, 2), ids, one, one, one, 8)


@pytest.mark.parametrize("m", [16, 64, 256, 1024])
def test_bench_shaped_rows(m: int) -> None:
    # What bench_build_tree.py times: L = 15, top-K of log_softmax(randn(32000) * sharp), B = 8.
    # (M = 16 and 64 with K = M are the end-to-end decoder's shapes.)
    for k in sorted({min(m, 64), m if m <= 64 else 1024, 1024}):
        for sharp in (8.0, 4.0, 1.0):
            gen = torch.Generator().manual_seed(m + k + int(sharp))
            lp = torch.log_softmax(torch.randn(8, 15, 32000, generator=gen) * sharp, -1).topk(k, -1).values
            run_both(lp, [m] * 8, n_max=m + 1, seed=m + k)


def test_small_budgets_with_zero_heads_and_ties() -> None:
    # v8's range (M <= 64): row heads of exactly 0 (ties inside a family, ordered by v8), dyadic ties
    # across families (handed to the older paths), mixed budgets 1..64 in one launch.
    gen = torch.Generator().manual_seed(77)
    lp = torch.log_softmax(torch.randn(6, 15, 4000, generator=gen) * 4.0, -1).topk(64, -1).values
    lp[1, 2:6, 0] = 0.0
    lp[2] = -(torch.randint(0, 9, (15, 64), generator=gen).float() / 4)
    lp = lp.sort(-1, descending=True).values
    run_both(lp, [64, 64, 64, 1, 33, 16], n_max=65)


def test_small_launches_edges_and_graph_replay() -> None:
    # The warp heap's range (n_max <= 65, L <= 16) and its edges: -inf padding, K < M, L = 16 and 17 (the
    # big kernel), n_max = 66 (the big kernel), scores one ulp apart and exact ties (the exact mode), then
    # a captured graph replayed on new rows and budgets.
    lp = draft_lp(4, 15, 64, seed=41, sharp=4.0)
    lp[1, :, 40:] = -math.inf
    lp[2, 0, 1] = torch.nextafter(lp[2, 0, 0], torch.tensor(-math.inf))
    lp[3, 1, 1] = lp[3, 1, 0]
    run_both(lp, [64, 64, 64, 64], n_max=65)
    run_both(draft_lp(2, 16, 8, seed=42), [64, 40], n_max=65)
    run_both(draft_lp(2, 17, 8, seed=43), [64, 40], n_max=65)
    run_both(draft_lp(2, 15, 64, seed=44), [64, 16], n_max=66)
    bsz, depth, k, n_max = 8, 15, 64, 65
    lp = draft_lp(bsz, depth, k, seed=45).to(DEV)
    ids = torch.randint(0, 1000, (bsz, depth, k), dtype=torch.int32, device=DEV)
    root = torch.arange(bsz, dtype=torch.int32, device=DEV)
    ctx = torch.full((bsz,), 10, dtype=torch.int32, device=DEV)
    bud = torch.tensor([64, 0, 16, 3, 64, 33, 1, 64], dtype=torch.int32, device=DEV)
    build_tree(lp, ids, root, ctx, bud, n_max)  # warm-up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = build_tree(lp, ids, root, ctx, bud, n_max)
    for seed in range(3):
        lp.copy_(draft_lp(bsz, depth, k, seed=200 + seed, sharp=1.0 + 3 * seed))
        bud.copy_(torch.tensor([seed * 20, 64, 1, 17, 64, 64, 32, 5], dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want = ref_build_tree(lp.cpu(), ids.cpu(), root.cpu(), ctx.cpu(), bud.cpu(), n_max)
        assert_same(out, want, f"small graph replay {seed}")
