"""The real draft_topk_lse v4 CUDA kernel source, executed on the CPU, against the reference (CI, no GPU).

tests/topk_emu/topk_v4_emu.cpp compiles include/ddtree/kernels/draft_topk_lse_v4.cuh with g++ and the
cluster emulator tests/topk_emu/cluster_emu.h (one POSIX thread per CUDA thread, every CTA of a cluster
running at once with its own shared memory, block/warp/cluster barriers, shuffles, ballots, redux, and
distributed shared memory as stores into another CTA's buffer), launches one cluster per row split as the
library's launcher splits it, and compares with the reference: ids exactly, log-probs and lse within the
GPU tests' tolerances. The emulator's exp2 is exact, so this checks the logic (split, bounds, candidates,
ranks, radix fallback, -inf and NaN rows, the cluster merge), not the GPU's rounding; the GPU tests
(test_draft_topk_lse.py) run the same comparisons on the device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from topk_emu_harness import build_emulator, compare_with_reference, logits, run_emulator

INF = float("inf")


@pytest.fixture(scope="module")
def emu_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_emulator(tmp_path_factory, "topk_v4_emu.cpp", "fake_cuda_v4")


def run_emu(binary: Path, x: torch.Tensor, k: int, threads: int = 512, async_xchg: bool = False,
            max_cluster: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, int]]:
    """run_emulator with v4's CTA size, with async_xchg the st.async/mbarrier exchange (the library's
    default) instead of the closing cluster barrier, and the launcher's largest cluster."""
    return run_emulator(binary, x, k, (threads, int(async_xchg), max_cluster))


def compare(binary: Path, x: torch.Tensor, k: int, threads: int = 512, async_xchg: bool = False,
            max_cluster: int = 8) -> dict[str, int]:
    return compare_with_reference(binary, x, k, (threads, int(async_xchg), max_cluster))

@pytest.mark.parametrize("k", [1, 2, 16, 17, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_v4_emulated_random_rows(emu_binary: Path, k: int, dtype: torch.dtype) -> None:
    # 20011 logits: a cluster of several CTAs (128 threads: bf16 3, fp32 5) with a partial last vector
    # and unaligned rows (element-wise loads). Normal logits never need the radix fallback.
    events = compare(emu_binary, logits((1, 3, 20011), "normal", dtype, seed=k), k, threads=128)
    assert events["cluster"] > 1 and events.get("cta_radix", 0) == 0
    events = compare(emu_binary, logits((1, 2, 20000), "normal", dtype, seed=50 + k), k, threads=128)  # aligned
    assert events.get("cta_radix", 0) == 0


@pytest.mark.parametrize("kind", ["ties", "dyadic", "neginf"])
@pytest.mark.parametrize("k", [1, 16, 64])
def test_v4_emulated_tie_heavy_rows(emu_binary: Path, kind: str, k: int) -> None:
    # 512 threads: 3 CTAs of 3,000 fp32 logits; 128 threads: 8 CTAs of ~1,100.
    events = compare(emu_binary, logits((2, 1, 9000), kind, torch.float32, seed=100 + k), k)
    if kind == "ties":
        # 4 distinct values: ~750 logits tie at the top of each CTA. k = 1 keeps one item by atomicMax;
        # larger k overflow the 512 candidates and take the radix select.
        assert (events.get("cta_radix", 0) > 0) == (k > 1)
    compare(emu_binary, logits((2, 1, 9000), kind, torch.float32, seed=150 + k), k, threads=128)
    compare(emu_binary, logits((1, 2, 997), kind, torch.bfloat16, seed=200 + k), k, threads=128)


@pytest.mark.parametrize("k", [1, 16])
def test_v4_emulated_full_vocab_row_library_shape(emu_binary: Path, k: int) -> None:
    # The library's configuration: 512 threads, a cluster of 8 CTAs, 5 vectors per thread, one round.
    events = compare(emu_binary, logits((1, 1, 163840), "normal", torch.bfloat16, seed=5 + k), k)
    assert events["cluster"] == 8 and events.get("cta_radix", 0) == 0


def test_v4_emulated_fp32_two_rounds(emu_binary: Path) -> None:
    # fp32 at 163,840: 10 vectors per thread = two register rounds (rescaled sums, re-read candidates).
    events = compare(emu_binary, logits((1, 1, 163840), "normal", torch.float32, seed=8), 16)
    assert events["cluster"] == 8 and events.get("cta_radix", 0) == 0


def test_v4_emulated_small_vocab_and_edges(emu_binary: Path) -> None:
    compare(emu_binary, logits((2, 1, 5), "normal", torch.float32, seed=1), 16)  # V < k: padded ranks
    compare(emu_binary, logits((1, 1, 1), "normal", torch.bfloat16, seed=2), 1)
    x = torch.full((1, 2, 5000), -INF)
    x[0, 1, 4321] = 0.5  # one finite logit in a row of -inf
    compare(emu_binary, x, 8, threads=128)  # row 0 all -inf: lse -inf, lp -inf, ids 0..7
    # Whole CTAs of -inf after a few finite logits (a padded vocab): their best items are their lowest ids.
    y = torch.full((1, 1, 9000), -INF)
    y[0, 0, :40] = torch.randn(40, generator=torch.Generator().manual_seed(4))
    events = compare(emu_binary, y, 64, threads=128)
    assert events.get("cta_radix", 0) == 0
    z = torch.zeros(1, 1, 3000)
    z[0, 0, 1000:] = -0.0  # signed zeros tie: lower id first, -0 == +0
    compare(emu_binary, z, 16, threads=128)


def test_v4_emulated_nan_row(emu_binary: Path) -> None:
    x = logits((1, 3, 9000), "normal", torch.float32, seed=3)
    x[0, 1, 4444] = float("nan")
    x[0, 2, 17] = INF  # +inf is treated like NaN
    lp, ids, lse, events = run_emu(emu_binary, x, 16, threads=128)
    assert events["flags"] == 1
    for r in (1, 2):
        assert torch.isnan(lse[0, r]) and torch.isnan(lp[0, r]).all() and ids[0, r].eq(-1).all()
    compare(emu_binary, x[:, :1], 16, threads=128)


@pytest.mark.parametrize("k", [1, 16, 64])
def test_v4_emulated_async_exchange(emu_binary: Path, k: int) -> None:
    # The opt-in exchange (DDTREE_TOPK_V4_CONFIG="512,8,1"): the other CTAs st.async their partial and items
    # into CTA 0 against its mbarrier and exit. Same answers on random, tie-heavy (radix fallback), -inf, NaN
    # and full-vocab rows; CTA 0 must count every byte (a NaN slice still sends its item count) or it hangs.
    compare(emu_binary, logits((1, 3, 20011), "normal", torch.bfloat16, seed=300 + k), k, 128, async_xchg=True)
    events = compare(emu_binary, logits((2, 1, 9000), "ties", torch.float32, seed=310 + k), k, async_xchg=True)
    assert (events.get("cta_radix", 0) > 0) == (k > 1)
    compare(emu_binary, logits((1, 2, 5000), "neginf", torch.float32, seed=320 + k), k, 128, async_xchg=True)
    x = logits((1, 3, 9000), "normal", torch.float32, seed=330 + k)
    x[0, 1, 4444] = float("nan")
    lp, ids, lse, events = run_emu(emu_binary, x, k, 128, async_xchg=True)
    assert events["flags"] == 1 and torch.isnan(lse[0, 1]) and ids[0, 1].eq(-1).all()
    compare(emu_binary, x[:, :1], k, 128, async_xchg=True)
    events = compare(emu_binary, logits((1, 1, 163840), "normal", torch.bfloat16, seed=340 + k), k, async_xchg=True)
    assert events["cluster"] == 8


@pytest.mark.parametrize("k", [1, 16, 32, 64])
def test_v5_emulated_default_exchange_and_row_count_clusters(emu_binary: Path, k: int) -> None:
    # The library's defaults since v5: 512 threads and the st.async exchange, 8 CTAs per row for one request
    # and 4 when rows are many (bf16 at 163,840: two register rounds, so the candidate pass re-loads the
    # vectors whose maximum reaches the bound). Same answers, no radix fallback on normal rows.
    x = logits((1, 2, 163840), "normal", torch.bfloat16, seed=400 + k)
    events = compare(emu_binary, x, k, async_xchg=True, max_cluster=4)
    assert events["cluster"] == 4 and events.get("cta_radix", 0) == 0
    events = compare(emu_binary, x[:, :1], k, async_xchg=True)
    assert events["cluster"] == 8 and events.get("cta_radix", 0) == 0


@pytest.mark.parametrize("k", [2, 16, 64])
def test_v5_emulated_lane_local_candidates_many_per_lane(emu_binary: Path, k: int) -> None:
    # The lane-local candidate pass appends a vector's admitted logits with one atomic: rows whose top
    # logits crowd into few vectors (a block of large logits, dyadic ties inside it) and rows whose top
    # logits sit one per vector of different lanes must both come out exact; 4 CTAs per row and 2 rounds.
    g = torch.Generator().manual_seed(500 + k)
    x = torch.randn(1, 2, 40000, generator=g)
    x[0, 0, 1000:1200] = 8.0 + torch.randint(0, 4, (200,), generator=g).float() / 4  # crowded, tied
    x[0, 1, ::97] += 12.0  # spread: one large logit every 97 ids
    compare(emu_binary, x.to(torch.bfloat16), k, threads=128, async_xchg=True, max_cluster=4)
    compare(emu_binary, x, k, threads=128, async_xchg=True, max_cluster=4)
    compare(emu_binary, x, k, threads=128)


@pytest.mark.parametrize("async_xchg", [False, True])
def test_v5_emulated_nan_or_inf_among_neg_inf(emu_binary: Path, async_xchg: bool) -> None:
    # v5 sums each thread's vectors as they land, against the first finite maximum: a NaN or +inf whose
    # vector (or whole slice) is otherwise -inf must still flag its row; finite rows beside them stay exact.
    x = torch.full((1, 4, 9000), -INF)
    x[0, 0, 123] = float("nan")
    x[0, 1, 8999] = INF
    x[0, 2, :] = torch.randn(9000, generator=torch.Generator().manual_seed(6)) - 300.0  # far below 0
    x[0, 3, 4000] = -150.0  # one finite logit among -inf
    lp, ids, lse, events = run_emu(emu_binary, x, 16, threads=128, async_xchg=async_xchg)
    assert events["flags"] == 1
    for r in (0, 1):
        assert torch.isnan(lse[0, r]) and torch.isnan(lp[0, r]).all() and ids[0, r].eq(-1).all()
    compare(emu_binary, x[:, 2:], 16, threads=128, async_xchg=async_xchg)
    compare(emu_binary, x[:, 2:].to(torch.bfloat16), 1, async_xchg=async_xchg)


@pytest.mark.parametrize("k", [1, 2, 16])
def test_v5_emulated_signed_zeros_tie_by_id(emu_binary: Path, k: int) -> None:
    # -0 == +0 in the reference's order (by value, then lower id): a -0 at a lower id than a +0 comes first.
    # v4.1 compared raw ordered keys, which put every +0 above every -0.
    x = torch.full((1, 2, 3000), -5.0)
    x[0, 0, 0], x[0, 0, 7] = -0.0, 0.0
    x[0, 1, 2999], x[0, 1, 1500], x[0, 1, 40] = 0.0, -0.0, -0.0
    for dtype in (torch.float32, torch.bfloat16):
        compare(emu_binary, x.to(dtype), k, threads=128, async_xchg=True)
        compare(emu_binary, x.to(dtype), k, threads=128)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_v6_emulated_k1_warp_best_item(emu_binary: Path, dtype: torch.dtype) -> None:
    # v6 k = 1 (default exchange): each warp's best item from the lanes holding its maximal key, each looking
    # only at its first vector holding its maximum (reloaded when it was in an earlier register round).
    # fp32 at 163,840 with 8 CTAs: two rounds; thread 3 of CTA 0 holds ids 12-15 (round 0) and 10252-10255
    # (round 1), thread 5 ids 20-23. Equal maxima in both rounds of one lane, across lanes and CTAs: the
    # lowest id must win; bf16 with 4 CTAs per row also runs two rounds.
    x = logits((1, 4, 163840), "normal", torch.float32, seed=600)
    x[0, 0, 10254] = x[0, 0, 13] = 50.0  # same lane, rounds 1 and 0
    x[0, 1, 10254] = x[0, 1, 30000] = 50.0  # round 1 (still in registers), a later CTA
    x[0, 2, 100000] = x[0, 2, 22] = x[0, 2, 21] = 50.0  # round 0 (reloaded), two of one vector
    x[0, 3, :] = -INF
    x[0, 3, 160000:] = 1.0  # whole CTAs of -inf, the best in the last one
    x = x.to(dtype)
    for max_cluster in (8, 4):
        events = compare(emu_binary, x, 1, async_xchg=True, max_cluster=max_cluster)
        assert events.get("cta_radix", 0) == 0
    compare(emu_binary, x[..., :160001], 1, async_xchg=True)  # unaligned rows: element-wise loads
    compare(emu_binary, torch.full((1, 2, 3001), -INF, dtype=dtype), 1, 128, async_xchg=True)  # all -inf


@pytest.fixture(scope="module")
def emu_binary_opt_k(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The opt-in k > 1 options (not the library's default until measured): radix bound, rolled candidate
    # pass, split merge, on top of the default (fast loads, the k = 1 warp path); 1 + 2 + 16 + 32 + 64.
    return build_emulator(tmp_path_factory, "topk_v4_emu.cpp", "fake_cuda_v4", ("DDTREE_TOPK_V4_EMU_OPT=115",))


@pytest.mark.parametrize("k", [2, 17, 64])
def test_v6_emulated_opt_in_k_options(emu_binary_opt_k: Path, k: int) -> None:
    # Same answers as the reference through the radix bound (every warp searches the k-th group maximum bit
    # by bit), the rolled candidate pass and the split merge (P lanes per slot item): random rows (8 and 4
    # CTAs per row, one and two register rounds), tie-heavy (radix fallback), -inf, NaN and unaligned rows.
    b = emu_binary_opt_k
    x = logits((1, 2, 163840), "normal", torch.bfloat16, seed=700 + k)
    assert compare(b, x, k, async_xchg=True, max_cluster=4)["cluster"] == 4
    assert compare(b, x[:, :1], k, async_xchg=True).get("cta_radix", 0) == 0
    compare(b, logits((1, 3, 20011), "normal", torch.float32, seed=710 + k), k, 128, async_xchg=True)
    events = compare(b, logits((2, 1, 9000), "ties", torch.float32, seed=720 + k), k, async_xchg=True)
    assert events.get("cta_radix", 0) > 0
    compare(b, logits((1, 2, 5000), "neginf", torch.float32, seed=730 + k), k, 128, async_xchg=True)
    y = logits((1, 3, 9000), "normal", torch.float32, seed=740 + k)
    y[0, 1, 4444] = float("nan")
    lp, ids, lse, events = run_emu(b, y, k, 128, async_xchg=True)
    assert events["flags"] == 1 and torch.isnan(lse[0, 1]) and ids[0, 1].eq(-1).all()
    compare(b, y[:, 2:], k, 128, async_xchg=True)
    compare(b, logits((2, 1, 5), "normal", torch.float32, seed=750 + k), k, 128, async_xchg=True)  # V < k


@pytest.mark.parametrize("k", [17, 33, 64])
def test_v8_emulated_lane_append(emu_binary: Path, k: int) -> None:
    # v8 (the default for k > 1): where the CTA bound is a finite logit, each lane appends its own admitted
    # logits (one shared atomic per lane with hits). 36,000 bf16 at 512 threads split into 5 CTAs (4 when rows
    # are many); rows whose top logits crowd into consecutive vectors give lanes with many set bits; a row with
    # a whole -inf slice and a slice with fewer finite logits than k (bound at -inf's key: v7's pass) beside
    # slices that take the lane append.
    g = torch.Generator().manual_seed(800 + k)
    x = torch.randn(1, 3, 36000, generator=g) * 4
    x[0, 1, 8000:8064] = 20.0 + torch.arange(64).float() / 8  # crowded into consecutive vectors
    x[0, 2, 7200:14400] = -INF
    x[0, 2, 14400:21600] = -INF
    x[0, 2, 14400 + 3] = 5.0
    xb = x.to(torch.bfloat16)
    assert compare(emu_binary, xb, k, async_xchg=True)["cluster"] == 5
    assert compare(emu_binary, xb, k, async_xchg=True, max_cluster=4)["cluster"] == 4
    compare(emu_binary, x, k, async_xchg=True)  # fp32: 8 CTAs


@pytest.fixture(scope="module", params=[32643, 65411, 98179, 425859, 491395, 163715, 229251],
                ids=["v9", "v10", "v11", "v13", "v13r", "v13a", "v13s"])
def emu_binary_v9(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    # Session 7's option sets, built as the st.async instantiations' options: kV4OptV9 (v8 + the round append +
    # the all-to-all merge; what DDTREE_TOPK_V4_OPT=v9 runs in the library for k > 1) and kV4OptV10 (v9 + eight
    # lanes per candidate's rank and puts; DDTREE_TOPK_V4_OPT=v10) and kV4OptV11 (v9 + the row bound before the
    # candidate pass, session 8; DDTREE_TOPK_V4_OPT=v11), and session 9's compact builds of v9 and v11 with the rare
    # passes called (kV4OptV13, kV4OptV13r: DDTREE_TOPK_V4_OPT=v13, and v13r the default at 8-CTA clusters) and of v9
    # and v11 with them inline (kV4OptV13a, profiler only; kV4OptV13s, DDTREE_TOPK_V4_OPT=v13s). Every v9 test runs on
    # all seven.
    opt = f"DDTREE_TOPK_V4_EMU_OPT={request.param}"
    return build_emulator(tmp_path_factory, "topk_v4_emu.cpp", "fake_cuda_v4", (opt,))


@pytest.mark.parametrize("k", [2, 16, 17, 33, 64])
def test_v9_emulated_round_append_and_all_to_all_merge(emu_binary_v9: Path, k: int) -> None:
    # v9: a round's vectors whose maximum reaches the bound are masked and appended (one atomic, a loop over the
    # set bits), every CTA sends its
    # partial and sorted items to every CTA of the cluster (swizzled slots) and ranks its own items, one lane per
    # (item, list). Clusters of 8, 5 (lists past the cluster are empty), 4 and 3 CTAs (4 lists), one and two
    # register rounds, crowded top logits (lanes with many set bits), a whole -inf slice and a slice with fewer
    # finite logits than k (v7's pass) beside lane-append slices, fp32, unaligned rows (element-wise loads:
    # v8's pass with the all-to-all merge).
    b = emu_binary_v9
    x = logits((1, 2, 163840), "normal", torch.bfloat16, seed=900 + k)
    assert compare(b, x, k, async_xchg=True, max_cluster=4)["cluster"] == 4  # two rounds
    assert compare(b, x[:, :1], k, async_xchg=True)["cluster"] == 8
    g = torch.Generator().manual_seed(910 + k)
    y = torch.randn(1, 3, 36000, generator=g) * 4
    y[0, 1, 8000:8064] = 20.0 + torch.arange(64).float() / 8
    y[0, 2, 7200:14400] = -INF
    y[0, 2, 14400:21600] = -INF
    y[0, 2, 14400 + 3] = 5.0
    assert compare(b, y.to(torch.bfloat16), k, async_xchg=True)["cluster"] == 5
    assert compare(b, y.to(torch.bfloat16), k, async_xchg=True, max_cluster=4)["cluster"] == 4
    assert compare(b, y[..., :12000], k, async_xchg=True)["cluster"] == 3  # fp32, 3 CTAs
    compare(b, logits((1, 3, 20011), "normal", torch.float32, seed=920 + k), k, 128, async_xchg=True)  # unaligned


@pytest.mark.parametrize("k", [16, 64])
def test_v9_emulated_ties_nan_and_edges(emu_binary_v9: Path, k: int) -> None:
    # The all-to-all exchange must count every byte in every CTA: tie-heavy slices (radix fallback, put to all),
    # a NaN slice (zeros sent to every other CTA, CTA 0 writes the NaN row), -inf rows, V < k, signed zeros.
    b = emu_binary_v9
    events = compare(b, logits((2, 1, 9000), "ties", torch.float32, seed=930 + k), k, async_xchg=True)
    assert events.get("cta_radix", 0) > 0
    compare(b, logits((1, 2, 5000), "neginf", torch.float32, seed=940 + k), k, 128, async_xchg=True)
    compare(b, logits((1, 2, 997), "dyadic", torch.bfloat16, seed=950 + k), k, 128, async_xchg=True)
    y = logits((1, 3, 9000), "normal", torch.float32, seed=960 + k)
    y[0, 1, 4444] = float("nan")
    y[0, 2, 17] = INF  # in CTA 0's slice: it too must send its item count to every other CTA
    lp, ids, lse, events = run_emu(b, y, k, 128, async_xchg=True)
    assert events["flags"] == 1
    for r in (1, 2):
        assert torch.isnan(lse[0, r]) and torch.isnan(lp[0, r]).all() and ids[0, r].eq(-1).all()
    compare(b, y[:, :1], k, 128, async_xchg=True)
    compare(b, logits((2, 1, 5), "normal", torch.float32, seed=970 + k), k, 128, async_xchg=True)  # V < k
    z = torch.full((1, 2, 3000), -5.0)
    z[0, 0, 0], z[0, 0, 7] = -0.0, 0.0
    z[0, 1, 2999], z[0, 1, 1500], z[0, 1, 40] = 0.0, -0.0, -0.0
    compare(b, z.to(torch.bfloat16), k, 128, async_xchg=True)
    x = torch.full((1, 2, 5000), -INF)
    x[0, 1, 4321] = 0.5
    compare(b, x, k, 128, async_xchg=True)


@pytest.mark.parametrize("k", [2, 17, 64])
def test_v9_emulated_vector_prefilter(emu_binary_v9: Path, k: int) -> None:
    # The round append masks and appends a vector only when its maximum reaches the bound: crowded top logits
    # (many set bits per lane and vector), spread ones (one per vector of many lanes), two rounds, 5- and 4-CTA
    # clusters, -inf slices beside lane-append slices, fp32, and the tie-heavy radix fallback.
    b = emu_binary_v9
    x = logits((1, 1, 163840), "normal", torch.bfloat16, seed=980 + k)
    assert compare(b, x, k, async_xchg=True, max_cluster=4)["cluster"] == 4  # two rounds
    g = torch.Generator().manual_seed(990 + k)
    y = torch.randn(1, 3, 36000, generator=g) * 4
    y[0, 1, 8000:8064] = 20.0 + torch.arange(64).float() / 8
    y[0, 0, ::97] += 12.0
    y[0, 2, 7200:14400] = -INF
    y[0, 2, 14400:21600] = -INF
    y[0, 2, 14400 + 3] = 5.0
    assert compare(b, y.to(torch.bfloat16), k, async_xchg=True)["cluster"] == 5
    assert compare(b, y.to(torch.bfloat16), k, async_xchg=True, max_cluster=4)["cluster"] == 4
    compare(b, y, k, async_xchg=True)  # fp32
    events = compare(b, logits((2, 1, 9000), "ties", torch.float32, seed=995 + k), k, async_xchg=True)
    assert events.get("cta_radix", 0) > 0


@pytest.fixture(scope="module", params=[98179, 491395, 229251], ids=["v11", "v13r", "v13s"])
def emu_binary_v11(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    # kV4OptV11 (DDTREE_TOPK_V4_OPT=v11): v9 + the row bound (session 8); kV4OptV13r / kV4OptV13s: its compact builds
    # (session 9).
    opt = f"DDTREE_TOPK_V4_EMU_OPT={request.param}"
    return build_emulator(tmp_path_factory, "topk_v4_emu.cpp", "fake_cuda_v4", (opt,))


@pytest.mark.parametrize("k", [2, 16, 33, 64])
def test_v11_emulated_row_bound(emu_binary_v11: Path, k: int) -> None:
    # v11: every CTA admits only logits >= max(its own bound, the row bound R = the smallest of the cluster's
    # ceil(k / cluster)-th largest group maxima), so most CTAs hold fewer than kc candidates and send zeros for the
    # rest of their slots. Checked: R is used (row_bound events) and short lists occur (row_short), on full rows
    # (8 and 4 CTAs, one and two register rounds), all top-k logits in one CTA (every other CTA sends zeros only),
    # the top-k spread one per CTA, a whole -inf slice (R is -inf's key: v9's bounds alone), a NaN slice (it sends
    # R = 0), ties at the bound (dyadic logits), fp32.
    b = emu_binary_v11
    x = logits((1, 2, 163840), "normal", torch.bfloat16, seed=1100 + k)
    ev = compare(b, x[:, :1], k, async_xchg=True)
    assert ev["cluster"] == 8 and ev.get("row_bound", 0) == 8 and ev.get("row_short", 0) > 0
    ev = compare(b, x, k, async_xchg=True, max_cluster=4)  # two rounds
    assert ev["cluster"] == 4 and ev.get("row_bound", 0) == 8
    g = torch.Generator().manual_seed(1110 + k)
    y = torch.randn(1, 4, 36000, generator=g) * 4
    y[0, 0, 8000:8064] = 20.0 + torch.arange(64).float() / 8  # the whole top-k in one CTA
    y[0, 1, ::7200] = 30.0 - torch.arange(5).float()  # one top logit at the start of each CTA's slice
    y[0, 2, 7200:14400] = -INF  # a whole -inf slice: R = -inf's key, no row bound in that row
    ev = compare(b, y.to(torch.bfloat16), k, async_xchg=True)
    assert ev["cluster"] == 5 and ev.get("row_bound", 0) == 15 and ev.get("row_short", 0) >= (4 if k >= 16 else 1)
    compare(b, y, k, async_xchg=True, max_cluster=4)  # fp32, 4 CTAs
    compare(b, logits((1, 2, 9000), "dyadic", torch.float32, seed=1120 + k), k, async_xchg=True)
    z = logits((1, 2, 20000), "normal", torch.float32, seed=1130 + k)
    z[0, 1, 12345] = float("nan")
    lp, ids, lse, ev = run_emu(b, z, k, async_xchg=True)
    assert ev["flags"] == 1 and torch.isnan(lse[0, 1]) and ids[0, 1].eq(-1).all()
    compare(b, z[:, :1], k, async_xchg=True)
