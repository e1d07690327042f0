"""The real build_tree CUDA kernel source, executed on the CPU, against the reference heap (CI, no GPU).

tests/build_tree_emu/ compiles include/ddtree/kernels/build_tree.cuh with g++ and a small SIMT emulator
(one std::thread per CUDA thread, std::barrier for __syncthreads, per-warp barriers for shuffles), so the
kernel's selection, compaction, sort and fallback logic — barriers included — run on every CI run. The
GPU tests (test_build_tree_gpu.py) run the same comparisons on the device."""

from __future__ import annotations

import math
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from ddtree_engine.reference.build_tree import BuildTreeOutput, build_tree

ENGINE = Path(__file__).resolve().parents[1]
EMU = ENGINE / "tests" / "build_tree_emu"
V9 = ("v9", "v9s6")  # the warp heap (session 7's pop; session 6's, kept as the A/B peer)


def compile_emu(tmp_path_factory: pytest.TempPathFactory, *defines: str) -> Path:
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ not found: the CPU emulation of the kernel needs a C++20 compiler")
    out = tmp_path_factory.mktemp("emu") / "build_tree_emu"
    cmd = [gxx, "-std=c++20", "-O2", "-pthread", *(f"-D{d}" for d in defines), f"-I{ENGINE / 'include'}",
           f"-I{EMU / 'fake_cuda'}", f"-I{EMU}", str(EMU / "build_tree_emu.cpp"), "-o", str(out)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-5000:]
    return out


@pytest.fixture(autouse=True, params=["v6", "v6dp", "v7", "v8", "v9", "v9s6", "v10", "v11"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs each selection (DDTREE_BUILD_TREE_IMPL, read by the emulator as by the launcher):
    v6 (chain bound + level pool), v6dp (counting bound + level pool), v7 (counting bound + deviation
    rounds + counting order), v8 (integer scores + warp threshold probes for M <= 64, else auto), v9 (the
    warp heap of build_tree/warp_heap.cuh for launches with n_max <= 65 and L <= 16, else v8auto; v9s6 the
    same range with session 6's warp-heap kernel, build_tree/warp_heap_s6.cuh), v10
    (build_tree/v10.cuh for requests with M > 64, else v8auto; test_build_tree_v10_emu.py has its own), v11
    (build_tree/v11.cuh for requests with L <= 16, else v8auto; test_build_tree_v11_emu.py has its own)."""
    monkeypatch.setenv("DDTREE_BUILD_TREE_IMPL", request.param)
    return str(request.param)


@pytest.fixture(scope="module")
def emu_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_emu(tmp_path_factory)


@pytest.fixture(scope="module")
def emu_binary_chain_bound(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The kernel without the counting bound (-DDDTREE_BUILD_TREE_NO_DP_BOUND): the chain-bound
    selection, pool raises, refinements and compactions it makes rare still have to be right."""
    return compile_emu(tmp_path_factory, "DDTREE_BUILD_TREE_NO_DP_BOUND")


def run_emu(binary: Path, lp: torch.Tensor, ids: torch.Tensor, root: torch.Tensor, ctx: torch.Tensor,
            budget: torch.Tensor, n_max: int) -> tuple[BuildTreeOutput, list[int], dict[str, int]]:
    """Kernel outputs (as a BuildTreeOutput of int32 tensors); per request 1 if the serial fallback
    decided, 0 for the parallel path, -1 if no selection ran (budget 0 or L = 0); and how often each
    internal step ran (raise, refine, compact, tighten, overflow, invalid_rows, inexact)."""
    bsz, depth, k = lp.shape
    words = (n_max + 31) // 32
    parts = [f"{bsz} {depth} {k} {n_max}",
             " ".join(float(x).hex() for x in lp.to(torch.float32).flatten().tolist()),
             " ".join(str(int(x)) for x in ids.flatten().tolist()),
             " ".join(str(int(x)) for x in root.tolist()),
             " ".join(str(int(x)) for x in ctx.tolist()),
             " ".join(str(int(x)) for x in budget.tolist())]
    proc = subprocess.run([str(binary)], input="\n".join(parts) + "\n", stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = proc.stdout.strip().splitlines()
    assert len(rows) == bsz
    paths, fields = [], [[] for _ in range(8)]
    for line in rows:
        head, *cols = line.split("|")
        path, num = head.split()
        paths.append(int(path))
        fields[3].append(int(num))
        arrays = [[int(x) for x in c.split()] for c in cols]
        for slot, arr in zip((0, 1, 2, 5, 6, 7), arrays[:6]):
            fields[slot].append(arr)
        fields[4].append([[(v - (1 << 32)) if v >= (1 << 31) else v for v in arrays[6][i * words:(i + 1) * words]]
                          for i in range(n_max)])
    out = BuildTreeOutput(*(torch.tensor(f, dtype=torch.int32) for f in fields))
    events = {}
    for line in proc.stderr.splitlines():
        if line.startswith("events"):
            events = {k: int(v) for k, v in (item.split("=") for item in line.split()[1:])}
    return out, paths, events


def assert_same(got: BuildTreeOutput, want: BuildTreeOutput, what: str) -> None:
    for name, g, w in zip(BuildTreeOutput._fields, got, want):
        assert g.shape == w.shape, f"{what}: {name} shape {tuple(g.shape)} != {tuple(w.shape)}"
        if not torch.equal(g, w.to(g.dtype)):
            bad = (g != w).nonzero()[:5].tolist()
            raise AssertionError(f"{what}: {name} differs at {bad}: got {g[tuple(bad[0])]} want {w[tuple(bad[0])]}")


def check(binary: Path, lp: torch.Tensor, ids: torch.Tensor | None = None, budget: list[int] | None = None,
          n_max: int | None = None, seed: int = 0, events: dict[str, int] | None = None) -> list[int]:
    bsz, depth, k = lp.shape
    gen = torch.Generator().manual_seed(seed)
    if ids is None:
        ids = torch.randint(0, 160000, (bsz, depth, k), generator=gen, dtype=torch.int32)
    root = torch.randint(0, 160000, (bsz,), generator=gen, dtype=torch.int32)
    ctx = torch.randint(0, 5000, (bsz,), generator=gen, dtype=torch.int32)
    if budget is None:
        budget = [k] * bsz
    n_max = n_max if n_max is not None else max(budget) + 1
    bud = torch.tensor(budget, dtype=torch.int32)
    want = build_tree(lp, ids, root, ctx, bud, n_max)
    got, paths, ev = run_emu(binary, lp, ids, root, ctx, bud, n_max)
    assert_same(got, want, f"B={bsz} L={depth} K={k} budgets={budget} n_max={n_max}")
    if events is not None:
        events.update(ev)
    return paths


def draft_lp(bsz: int, depth: int, k: int, seed: int, sharp: float = 3.0) -> torch.Tensor:
    """Top-k of fp32 log-softmax over random logits (what draft_topk_lse produces)."""
    gen = torch.Generator().manual_seed(seed)
    vocab = max(2 * k, 1000)
    logits = torch.randn(bsz, depth, vocab, generator=gen) * sharp
    return torch.log_softmax(logits, -1).topk(k, -1).values


def test_golden_tree(emu_binary: Path) -> None:
    lp = torch.tensor([[[-0.5, -1.0], [-0.25, -2.0], [-1.0, -1.5]]])
    for budget in (0, 1, 5, 7, 8, 14, 20):
        check(emu_binary, lp, budget=[budget], n_max=max(budget, 1) + 3)


def test_batch_with_mixed_budgets_takes_the_parallel_path(emu_binary: Path) -> None:
    lp = draft_lp(4, 15, 64, seed=1)
    paths = check(emu_binary, lp, budget=[0, 1, 63, 256], n_max=257)
    assert paths == [-1, 0, 0, 0]


@pytest.mark.parametrize("depth,k,budget", [(15, 32, 1024), (15, 1024, 1024), (7, 16, 300), (1, 64, 64),
                                            (15, 1, 20), (3, 4, 1024), (15, 8, 256)])
def test_random_draft_distributions(emu_binary: Path, depth: int, k: int, budget: int) -> None:
    for sharp in (1.0, 4.0):
        lp = draft_lp(1, depth, k, seed=depth * 1000 + k + int(sharp), sharp=sharp)
        paths = check(emu_binary, lp, budget=[budget], seed=k)
        assert paths == [0]


def test_dyadic_ties(emu_binary: Path) -> None:
    rng = random.Random(5)
    for case in range(12):
        depth, k = rng.randint(1, 6), rng.choice([2, 3, 5, 16])
        rows = [[sorted((-rng.randint(0, 8) / 4 for _ in range(k)), reverse=True) for _ in range(depth)]]
        lp = torch.tensor(rows, dtype=torch.float32)
        budget = rng.choice([1, 7, 40, 300])
        paths = check(emu_binary, lp, budget=[budget], seed=case)
        assert paths[0] in (0, 1)


def test_wide_score_ties_use_the_large_sort(emu_binary: Path) -> None:
    # 64 depth-1 nodes at -1 and ~2400 depth-2 candidates tied at -2: the cutoff cannot split the tie,
    # so more than 2048 survivors reach the sort (the shared-memory bitonic path), ordered by tuple.
    ev: dict[str, int] = {}
    assert check(emu_binary, torch.full((1, 2, 64), -1.0), budget=[1024], events=ev) == [0]
    assert ev.get("tighten") == 1 and "overflow" not in ev, ev
    assert check(emu_binary, draft_lp(1, 15, 64, seed=77, sharp=3.0), budget=[700]) == [0]


def test_all_zero_log_probs_fall_back_exactly(emu_binary: Path) -> None:
    # Every score ties at 0: the pool cannot separate them by score, the serial heap decides.
    lp = torch.zeros(1, 15, 64)
    ev: dict[str, int] = {}
    assert check(emu_binary, lp, budget=[1024], events=ev) == [1]
    assert ev.get("overflow") == 1
    assert check(emu_binary, torch.zeros(1, 3, 2), budget=[14]) == [0]  # small enough for the pool


def test_unsorted_or_positive_rows_fall_back(emu_binary: Path, impl: str) -> None:
    lp = draft_lp(2, 6, 8, seed=3)
    lp[0, 2] = lp[0, 2].flip(0)  # ascending row
    lp[1, 0, 0] = 0.25  # a positive log-prob
    ev: dict[str, int] = {}
    if impl in V9:  # n_max 41: the warp heap, which follows the reference's arithmetic on any row
        assert check(emu_binary, lp, budget=[40, 40], events=ev) == [0, 0]
        assert ev.get("v9") == 2 and "invalid_rows" not in ev, ev
        return
    assert check(emu_binary, lp, budget=[40, 40], events=ev) == [1, 1]
    assert ev.get("invalid_rows") == 2


def test_inexact_fp64_sums_fall_back(emu_binary: Path, impl: str) -> None:
    lp = torch.tensor([[[-6.6857430702782494e-09, -20.0, -21.0],
                        [-5.3228440284729, -24.36475944519043, -34.079593658447266]]])
    ev: dict[str, int] = {}
    if impl in V9:  # the warp heap computes the heap's own (inexact) sums: nothing to fall back from
        assert check(emu_binary, lp, budget=[12], events=ev) == [0]
        assert ev.get("v9") == 1 and "inexact" not in ev, ev
        return
    if impl == "v11":  # v11 scores each entry from its heap parent as the heap does (runs are checked)
        assert check(emu_binary, lp, budget=[12], events=ev) == [0]
        assert ev.get("v11") == 1, ev
        return
    assert check(emu_binary, lp, budget=[12], events=ev) == [1]
    assert ev.get("inexact") == 1


def test_minus_inf_padding_and_k_beyond_vocab(emu_binary: Path) -> None:
    lp = draft_lp(1, 5, 8, seed=9)
    lp[0, :, 5:] = -math.inf
    lp[0, 3, 1:] = -math.inf
    assert check(emu_binary, lp, budget=[500]) == [0]
    lp[0, 2, :] = -math.inf  # depth 3 has no candidate: the tree stops at depth 2
    assert check(emu_binary, lp, budget=[500]) == [0]


def test_deep_trees_use_the_serial_heap_beyond_the_code_width(emu_binary: Path) -> None:
    lp = draft_lp(1, 40, 4, seed=11, sharp=6.0)
    assert check(emu_binary, lp, budget=[300]) == [1]  # 2*40 + 2*8 bits > 64
    lp = draft_lp(1, 22, 4, seed=12, sharp=6.0)
    assert check(emu_binary, lp, budget=[1024]) == [0]  # 2*22 + 2*10 = 64 bits: fits


def test_pool_raises_refines_and_compacts(emu_binary_chain_bound: Path, impl: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    emu_binary = emu_binary_chain_bound
    if impl == "v11":
        pytest.skip("the level pool's raises: v11 decides these rows without the pool")
    # Scores packed in [-3, 0] plus one far outlier per row: the first histogram over the whole range
    # puts nearly everything in one bucket, so the cutoff must be refined inside it.
    gen = torch.Generator().manual_seed(21)
    lp = -(torch.rand(1, 15, 64, generator=gen) * 3).sort(-1).values
    lp[0, :, -1] = -1000.0
    ev: dict[str, int] = {}
    assert check(emu_binary, lp, budget=[256], events=ev) == [0]
    # The default order ranks the up to 514 survivors itself (no tighten); DDTREE_BUILD_TREE_ORDER=rankt (and
    # bitonic) cut them to ~M first, so the tighten's pool_select is checked there.
    assert ev.get("raise", 0) >= 1 and ev.get("refine", 0) >= 1 and "tighten" not in ev, ev
    monkeypatch.setenv("DDTREE_BUILD_TREE_ORDER", "rankt")
    ev = {}
    assert check(emu_binary, lp, budget=[256], events=ev) == [0]
    assert ev.get("tighten", 0) >= 1, ev
    monkeypatch.delenv("DDTREE_BUILD_TREE_ORDER")
    ev = {}
    assert check(emu_binary, draft_lp(1, 15, 64, seed=2, sharp=4.0), budget=[1024], events=ev) == [0]
    assert ev.get("compact", 0) >= 1, ev  # 15 * 64 < 1024: no chain bound, so the pool fills up
    ev = {}
    assert check(emu_binary, draft_lp(1, 15, 1024, seed=16028, sharp=4.0), budget=[1024], events=ev) == [0]
    assert ev.get("chain_bound") == 1, ev


def test_randomized_against_reference(emu_binary: Path) -> None:
    rng = random.Random(2024)
    for case in range(16):
        bsz = rng.randint(1, 3)
        depth = rng.choice([1, 2, 5, 15])
        k = rng.choice([1, 2, 7, 32, 64])
        sharp = rng.choice([0.5, 2.0, 6.0])
        lp = draft_lp(bsz, depth, k, seed=case, sharp=sharp)
        if rng.random() < 0.3:  # quantize to 1/8: exact score ties across branches
            lp = (lp * 8).round() / 8
            lp = lp.sort(-1, descending=True).values
        budgets = [rng.choice([0, 1, 3, 31, 64, 200, 700, 1024]) for _ in range(bsz)]
        n_max = max(budgets) + 1 + rng.randint(0, 40)
        if n_max > 1025:
            n_max = 1025
        check(emu_binary, lp, budget=budgets, n_max=n_max, seed=case)


@pytest.mark.parametrize("k,budget,sharp", [(64, 256, 8.0), (64, 256, 1.0), (1024, 256, 4.0), (64, 64, 4.0),
                                            (64, 1024, 8.0), (1024, 1024, 1.0)])
def test_counting_bound_on_draft_rows(emu_binary: Path, impl: str, k: int, budget: int, sharp: float) -> None:
    # Bench-like rows (L = 15): the counting bound decides the threshold in one shot, so the pool never
    # needs a raise or a compaction and the chain-bound selection does not run; v7 takes every case
    # whose ranks fit the shared rows.
    ev: dict[str, int] = {}
    lp = draft_lp(1, 15, k, seed=k + budget + int(sharp), sharp=sharp)
    assert check(emu_binary, lp, budget=[budget], seed=3, events=ev) == [0]
    if impl == "v6":
        assert "dp_bound" not in ev, ev
        return
    if impl in V9:  # the warp heap for n_max <= 65; v8auto (v8 for M <= 32, else auto) for the others
        assert ("v9" in ev) == (budget <= 64) and ("dp_bound" in ev) == (budget > 256), ev
        return
    if impl == "v8":  # v8 for M <= 64; auto (counting bound only where M > 256) for the others
        assert ("v8" in ev) == (budget <= 64) and ("dp_bound" in ev) == (budget > 256), ev
        return
    if impl == "v10":  # v10 for M > 64 where it decides; otherwise auto (counting bound where M > 256)
        assert "v10" not in ev or budget > 64, ev
        assert "v10" in ev or ("dp_bound" in ev) == (budget > 256), ev
        return
    if impl == "v11":  # v11 decides drafted rows itself
        assert ev.get("v11") == 1 and "dp_bound" not in ev, ev
        return
    assert ev.get("dp_bound") == 1 and "chain_bound" not in ev, ev
    assert "raise" not in ev and "compact" not in ev, ev
    assert ("v7_round" in ev) == (impl == "v7" and min(k, budget) <= 273), ev


def test_auto_picks_the_counting_bound_per_request(emu_binary: Path, impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The library default ("auto"): the counting bound for requests with M > 256, v6 for the others,
    # decided per request inside one launch.
    if impl != "v6":
        pytest.skip("one run is enough: the test sets the selection itself")
    monkeypatch.setenv("DDTREE_BUILD_TREE_IMPL", "auto")
    ev: dict[str, int] = {}
    lp = draft_lp(3, 15, 64, seed=31, sharp=4.0)
    assert check(emu_binary, lp, budget=[1024, 256, 700], n_max=1025, seed=4, events=ev) == [0, 0, 0]
    assert ev.get("dp_bound") == 2 and ev.get("chain_bound") == 1, ev


def bench_rows(bsz: int, k: int, sharp: float, seed: int) -> torch.Tensor:
    """What bench_build_tree.py times: top-K of log_softmax(randn(32000) * sharp), L = 15."""
    gen = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(bsz, 15, 32000, generator=gen) * sharp, -1).topk(k, -1).values


@pytest.mark.parametrize("budget", [1, 2, 16, 63, 64])
def test_v8_decides_bench_rows(emu_binary: Path, impl: str, budget: int) -> None:
    # v8's own path (no fallback) on the bench's and the decoder's shapes: K = M, 64 and 1024.
    if impl != "v8":
        pytest.skip("v8 only")
    for k in sorted({budget, 64, 1024}):
        for sharp in (8.0, 4.0, 1.0):
            ev: dict[str, int] = {}
            lp = bench_rows(1, k, sharp, seed=budget * 31 + k + int(sharp))
            assert check(emu_binary, lp, budget=[budget], seed=k, events=ev) == [0]
            assert ev.get("v8") == 1, (k, sharp, ev)


def test_v8_batch_mixed_budgets_and_second_stage(emu_binary: Path, impl: str) -> None:
    # One launch: v8 for the requests with M <= 64, the older paths for the others; with K = 32 < M
    # the probes span the whole score range an octave apart, and these rows need the linear second stage.
    if impl != "v8":
        pytest.skip("v8 only")
    ev: dict[str, int] = {}
    lp = bench_rows(5, 32, 4.0, seed=1985)
    assert check(emu_binary, lp, budget=[64, 0, 200, 17, 64], n_max=201, seed=7, events=ev) == [0, -1, 0, 0, 0]
    assert ev.get("v8") == 3 and ev.get("v8_stage2", 0) >= 1, ev


def test_v8_exact_zero_heads_tie_inside_a_family(emu_binary: Path, impl: str) -> None:
    # lp[d][0] == 0 exactly (a draft position with probability 1 in fp32): a member and its rank-0
    # extension score the same; the prefix comes first, and v8 orders that tie itself.
    if impl != "v8":
        pytest.skip("v8 only")
    lp = bench_rows(1, 64, 4.0, seed=5)
    lp[0, 1:4, 0] = 0.0
    lp[0, 1:4] = lp[0, 1:4].sort(-1, descending=True).values
    ev: dict[str, int] = {}
    assert check(emu_binary, lp, budget=[64], events=ev) == [0]
    assert ev.get("v8") == 1, ev


def test_v8_hands_hard_rows_to_the_older_paths(emu_binary: Path, impl: str) -> None:
    # Exact ties across families (dyadic rows), -inf padding, an fp64 range too wide for the integer
    # scores: v8 gives the request back and the older paths decide, still equal to the reference.
    if impl != "v8":
        pytest.skip("v8 only")
    ev: dict[str, int] = {}
    dy = torch.tensor([[[-0.25, -0.5, -0.75, -1.0]] * 4])
    check(emu_binary, dy, budget=[40], events=ev)
    assert "v8" not in ev and ev.get("v8_tie", 0) + ev.get("v8_overflow", 0) >= 1, ev
    lp = bench_rows(1, 64, 4.0, seed=9)
    lp[0, 5, 20:] = -math.inf
    ev = {}
    assert check(emu_binary, lp, budget=[64], events=ev) == [0]
    assert "v8" not in ev, ev
    lp = torch.tensor([[[-6.6857430702782494e-09, -20.0, -21.0],
                        [-5.3228440284729, -24.36475944519043, -34.079593658447266]]])
    ev = {}
    assert check(emu_binary, lp, budget=[12], events=ev) == [1]
    assert "v8" not in ev and ev.get("inexact") == 1, ev


def test_default_takes_v8_up_to_m_32(emu_binary: Path, impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The library default (v8auto): v8 for requests with M <= 32, auto for the others, per request.
    if impl != "v8":
        pytest.skip("one run is enough: the test sets the selection itself")
    monkeypatch.setenv("DDTREE_BUILD_TREE_IMPL", "v8auto")
    ev: dict[str, int] = {}
    lp = bench_rows(4, 64, 4.0, seed=3)
    assert check(emu_binary, lp, budget=[16, 32, 33, 64], n_max=65, seed=5, events=ev) == [0, 0, 0, 0]
    assert ev.get("v8") == 2, ev


# ---- v9: the warp heap (build_tree/warp_heap.cuh), launches with n_max <= 65 and L <= 16 ----------------


@pytest.mark.parametrize("budget", [1, 2, 16, 32, 33, 63, 64])
def test_v9_decides_bench_rows_in_the_fast_mode(emu_binary: Path, impl: str, budget: int) -> None:
    # The bench's and the decoder's shapes (K = M, 64, 1024; B = 2 with a smaller second budget): every
    # pop decided by the quantized key, no exact rerun.
    if impl not in V9:
        pytest.skip("v9 only")
    for k in sorted({budget, 64, 1024}):
        for sharp in (8.0, 4.0, 1.0):
            ev: dict[str, int] = {}
            lp = bench_rows(2, k, sharp, seed=budget * 31 + k + int(sharp))
            assert check(emu_binary, lp, budget=[budget, budget // 2], n_max=budget + 1, seed=k, events=ev) == \
                [0, 0 if budget // 2 > 0 else -1]
            assert ev.get("v9") == (2 if budget // 2 > 0 else 1) and "v9_exact" not in ev, (k, sharp, ev)


def test_v9_exact_mode_orders_ties_by_rank_tuple(emu_binary: Path, impl: str) -> None:
    # Real score ties (dyadic rows, all-zero rows, equal rows) and scores one fp32 ulp apart (the same
    # quantized key): the fast pass sees a shared key and the exact mode rebuilds the request.
    if impl not in V9:
        pytest.skip("v9 only")
    rng = random.Random(9)
    for case in range(6):
        depth, k = rng.randint(1, 16), rng.choice([2, 3, 16, 64])
        lp = -torch.tensor([[[rng.randint(0, 8) / 4 for _ in range(k)] for _ in range(depth)]]).sort(-1).values
        ev: dict[str, int] = {}
        budget = rng.choice([9, 31, 64])
        assert check(emu_binary, lp, budget=[budget], n_max=65, seed=case, events=ev) == [0]
    ev = {}
    assert check(emu_binary, torch.zeros(2, 15, 64), budget=[64, 20], n_max=65, events=ev) == [0, 0]
    assert ev.get("v9_exact") == 2, ev
    ev = {}
    assert check(emu_binary, torch.full((1, 16, 16), -1.0), budget=[64], n_max=65, events=ev) == [0]
    assert ev.get("v9_exact") == 1, ev
    near = bench_rows(1, 64, 4.0, seed=3)
    near[0, 0, 1] = torch.nextafter(near[0, 0, 0], torch.tensor(-math.inf))  # one ulp below the head
    near[0, 1, 0] = near[0, 1, 1] = -0.5  # (0, 0) and (0, 1) tie exactly
    near[0, 1] = near[0, 1].sort(descending=True).values
    ev = {}
    assert check(emu_binary, near, budget=[64], n_max=65, events=ev) == [0]
    assert ev.get("v9_exact") == 1, ev


def test_v9_any_rows_follow_the_reference_arithmetic(emu_binary: Path, impl: str) -> None:
    # -inf padding, a depth with no candidate, K < M (the loose quantization window), L = 1 and L = 16,
    # mixed budgets (M <= 32 and M > 32 layouts) in one launch.
    if impl not in V9:
        pytest.skip("v9 only")
    lp = bench_rows(1, 64, 4.0, seed=9)
    lp[0, 5, 20:] = -math.inf
    lp[0, 9, 1:] = -math.inf
    assert check(emu_binary, lp, budget=[64], n_max=65) == [0]
    lp[0, 7, :] = -math.inf
    assert check(emu_binary, lp, budget=[64], n_max=65) == [0]
    assert check(emu_binary, torch.full((1, 4, 8), -math.inf), budget=[10]) == [0]
    for depth, k in ((1, 64), (16, 8), (16, 3), (2, 1), (15, 1)):
        ev: dict[str, int] = {}
        lp = draft_lp(1, depth, k, seed=depth + k, sharp=2.0)
        assert check(emu_binary, lp, budget=[64], n_max=65, events=ev) == [0]
        assert ev.get("v9") == 1, ev
    ev = {}
    lp = bench_rows(5, 64, 4.0, seed=21)
    assert check(emu_binary, lp, budget=[0, 1, 33, 64, 17], n_max=65, events=ev) == [-1, 0, 0, 0, 0]
    assert ev.get("v9") == 4, ev


def test_v9_launches_beyond_its_range_take_the_big_kernel(emu_binary: Path, impl: str) -> None:
    # n_max = 66 or L = 17: the big kernel with the v8auto choice (v8 for M <= 32, auto for the others).
    if impl not in V9:
        pytest.skip("v9 only")
    ev: dict[str, int] = {}
    lp = bench_rows(2, 64, 4.0, seed=4)
    assert check(emu_binary, lp, budget=[16, 64], n_max=66, events=ev) == [0, 0]
    assert "v9" not in ev and ev.get("v8") == 1, ev
    ev = {}
    lp = draft_lp(1, 17, 16, seed=5)
    assert check(emu_binary, lp, budget=[16], n_max=17, events=ev) == [0]
    assert "v9" not in ev, ev



def test_v9auto_takes_the_warp_heap_up_to_65_nodes(emu_binary: Path, impl: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # v9auto (the library default): the warp heap for launches with n_max <= 65 (since session 7's pop:
    # measured faster than v8auto at M = 16 and 64 on the H200 at every sharpness), the big kernel with
    # v8auto above that.
    if impl != "v9":
        pytest.skip("one run is enough: the test sets the selection itself")
    monkeypatch.setenv("DDTREE_BUILD_TREE_IMPL", "v9auto")
    lp = bench_rows(2, 64, 4.0, seed=8)
    ev: dict[str, int] = {}
    assert check(emu_binary, lp, budget=[64, 5], n_max=65, events=ev) == [0, 0]
    assert ev.get("v9") == 2 and "v8" not in ev, ev
    ev = {}
    assert check(emu_binary, lp, budget=[17, 16], n_max=66, events=ev) == [0, 0]
    assert "v9" not in ev and ev.get("v8") == 2, ev
