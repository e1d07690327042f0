"""GPU tests of the tree_attention kernel against the fp32 reference (skipped without CUDA).

Every test runs once per back end (mma.sync, wgmma, fa3) that the device and the loaded library can
run; a back end that cannot run a test's head_dim skips it rather than silently testing another."""
from __future__ import annotations

import dataclasses
import math
import random
import sys
from collections.abc import Iterator

import pytest
import torch

import ddtree_engine.ops  # noqa: F401  (binds ops.tree_attention; the module holds the back-end knobs)
from test_tree_attention import Case, make_case, ref, repage

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ta_ops = sys.modules["ddtree_engine.ops.tree_attention"]
_impl = ["auto"]


# Module scope: pytest then runs every test under mma, then every test under wgmma, then under fa3, so
# a broken fa3 kernel (its watchdog traps, which poisons the CUDA context) cannot hide the results of
# the other back ends.
@pytest.fixture(autouse=True, scope="module", params=["mma", "wgmma", "fa3"])
def impl(request: pytest.FixtureRequest) -> Iterator[str]:
    name = request.param
    if not ta_ops.impl_available(name, 128):
        pytest.skip(f"back end {name} cannot run on this device / library")
    _impl[0] = name
    with ta_ops.use_impl(name):
        yield name
    _impl[0] = "auto"


def kernel(case: Case, *, causal: bool = False, kv_chunk: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    from ddtree_engine.ops import tree_attention

    d = case.q.shape[2]
    if _impl[0] != "auto" and ta_ops.impl_for(d) != _impl[0]:
        pytest.skip(f"back end {_impl[0]} does not run head_dim {d} (it would fall back to {ta_ops.impl_for(d)})")
    args = list(case.args())
    if causal:
        args[6] = None
    # Poison the allocator's free blocks so that an output element the kernel never writes shows up.
    junk = torch.full((case.q.numel() * 2,), float("nan"), dtype=torch.float32, device="cuda")
    del junk
    o, lse = tree_attention(*args, kv_chunk=kv_chunk)
    torch.cuda.synchronize()
    return o, lse


def assert_close_to_reference(case: Case, o: torch.Tensor, lse: torch.Tensor, causal: bool = False) -> None:
    o_ref, lse_ref = ref.tree_attention(*case.to("cpu").args()[:6], None if causal else case.anc.cpu(),
                                        case.sm_scale)
    o_ref, lse_ref = o_ref.cuda(), lse_ref.cuda()
    assert o.dtype == torch.bfloat16 and not torch.isnan(o).any(), "NaN in o"
    err = (o.float() - o_ref).abs()
    scale = o_ref.abs().max().clamp_min(1e-3)
    assert err.max() <= 2e-2 * scale, f"max |o - ref| = {err.max():.3e} (ref max {scale:.3e})"
    rel = err.norm() / o_ref.norm().clamp_min(1e-6)
    assert rel <= 8e-3, f"relative error {rel:.3e}"
    pad = torch.isneginf(lse_ref)
    assert torch.equal(torch.isneginf(lse), pad), "padding rows (lse = -inf) differ"
    assert torch.all(o[pad] == 0), "padding rows must be exactly zero"
    torch.testing.assert_close(lse[~pad], lse_ref[~pad], atol=2e-3, rtol=1e-4)


SHAPES = [(8, 1, 128), (4, 2, 64), (16, 4, 256), (64, 8, 128), (6, 3, 128)]


@pytest.mark.parametrize("hq,hkv,d", SHAPES)
@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("kv_chunk", [0, 128])
def test_random_trees_match_reference(hq: int, hkv: int, d: int, page: int, kv_chunk: int) -> None:
    case = make_case(hq, hkv, d, ctx=[300, 0, 1000, 77], n=[64, 9, 33, 1], page=page,
                     n_pad=[0, 3, 0, 0], seed=hq * 31 + page + kv_chunk, n_max=67).to("cuda")
    o, lse = kernel(case, kv_chunk=kv_chunk)
    assert_close_to_reference(case, o, lse)


@pytest.mark.parametrize("kind", ["chain", "star", "random"])
@pytest.mark.parametrize("n", [1, 31, 32, 33, 200])
def test_tree_shapes(kind: str, n: int) -> None:
    case = make_case(8, 2, 128, ctx=[129, 5], n=[n, max(1, n // 2)], page=16, kind=kind,
                     seed=n).to("cuda")
    o, lse = kernel(case)
    assert_close_to_reference(case, o, lse)


@pytest.mark.parametrize("kv_chunk", [0, 64, 192])
@pytest.mark.parametrize("page", [1, 16])
def test_chain_equals_causal_bit_for_bit(kv_chunk: int, page: int) -> None:
    case = make_case(8, 1, 128, ctx=[1000, 63, 0], n=[70, 130, 5], page=page, kind="chain",
                     seed=kv_chunk + page).to("cuda")
    o_tree, lse_tree = kernel(case, kv_chunk=kv_chunk or 256)
    o_causal, lse_causal = kernel(case, causal=True, kv_chunk=kv_chunk or 256)
    assert torch.equal(o_tree, o_causal)
    assert torch.equal(lse_tree, lse_causal)
    assert_close_to_reference(case, o_causal, lse_causal, causal=True)


def test_context_len_zero_and_padding_rows() -> None:
    case = make_case(4, 1, 64, ctx=[0, 0, 40], n=[1, 5, 3], page=16, n_pad=[4, 0, 2],
                     seed=11).to("cuda")
    o, lse = kernel(case)
    assert_close_to_reference(case, o, lse)
    pad_tokens = [1, 2, 3, 4, 13, 14]
    assert torch.all(o[pad_tokens] == 0) and torch.all(torch.isneginf(lse[pad_tokens]))


@pytest.mark.parametrize("page", [1, 16, 64])
def test_page_boundaries_inside_tree(page: int) -> None:
    # ctx chosen so that the tree straddles one or more page boundaries
    ctx = [page + 13, 2 * page - 1, 5 * page + 7]
    case = make_case(8, 2, 128, ctx=ctx, n=[40, 100, 9], page=page, seed=page).to("cuda")
    o, lse = kernel(case)
    assert_close_to_reference(case, o, lse)
    o2, lse2 = kernel(repage(case.to("cpu"), 64 if page != 64 else 16).to("cuda"))
    assert (o2.float() - o.float()).abs().max() <= 1e-2 * o.float().abs().max()


def test_ragged_batch_and_batch_independent_rows() -> None:
    case = make_case(16, 2, 128, ctx=[17, 2500, 0, 640, 64, 1], n=[1, 64, 7, 128, 33, 2], page=16,
                     seed=21).to("cuda")
    o, lse = kernel(case, kv_chunk=512)
    assert_close_to_reference(case, o, lse)
    # request 3 alone (same pinned chunk size) gives the same bits as inside the batch
    b = 3
    t0, t1 = int(case.qo_indptr[b]), int(case.qo_indptr[b + 1])
    single = Case(case.q[t0:t1].contiguous(), case.k_cache, case.v_cache,
                  torch.tensor([0, t1 - t0], dtype=torch.int32, device="cuda"),
                  case.block_table[b:b + 1].contiguous(), case.ctx_len[b:b + 1].contiguous(),
                  case.anc[b:b + 1].contiguous(), case.sm_scale, [case.parents[b]])
    o1, lse1 = kernel(single, kv_chunk=512)
    assert torch.equal(o1, o[t0:t1]) and torch.equal(lse1, lse[t0:t1])


@pytest.mark.parametrize("kv_chunk", [0, 1024])
@pytest.mark.parametrize("rise", [True, False])
def test_row_max_jumps_between_tiles(kv_chunk: int, rise: bool) -> None:
    # The online softmax's rescale path: the keys of one half of the key range (the later half, or the
    # earlier one) get 8x larger scores, so a row's running max moves by far more than 2^8 between tiles
    # (random scores alone move it by a few units at most). fa3's opt-in lazy rescale
    # (DDTREE_TA_FA3_RESCALE_TH) must take these jumps; every back end must match the reference.
    case = make_case(8, 1, 128, ctx=[2000, 700], n=[64, 30], page=16, seed=11 + kv_chunk + rise)
    for b, length in enumerate((2000 + 64, 700 + 30)):
        slots = torch.arange(length)
        big = slots >= length // 2 if rise else slots < length // 2
        pg, off = case.block_table[b].long()[slots[big] // 16], slots[big] % 16
        case.k_cache[pg, off] = (case.k_cache[pg, off].float() * 8).to(case.k_cache.dtype)
    case = case.to("cuda")
    o, lse = kernel(case, kv_chunk=kv_chunk)
    assert_close_to_reference(case, o, lse)


@pytest.mark.parametrize("kv_chunk", [0, 4096, 1024])
def test_long_context_many_tiles_per_cta(kv_chunk: int) -> None:
    # Many key tiles per CTA: the fa3 back end's 3-stage K/V ring wraps many times, and its two
    # consumer warpgroups ping-pong over dozens of tiles (GQA 8 -> 200 nodes x 8 = 13 row tiles).
    case = make_case(8, 1, 128, ctx=[5000, 300, 0], n=[200, 17, 40], page=16, n_pad=[0, 2, 0],
                     seed=kv_chunk + 5).to("cuda")
    o, lse = kernel(case, kv_chunk=kv_chunk)
    assert_close_to_reference(case, o, lse)


def test_backends_agree(impl: str) -> None:
    # Same inputs through every available back end: each is checked against the reference elsewhere;
    # here their mutual difference must stay at bf16 rounding. Runs once (under the mma parameter).
    from ddtree_engine.ops import tree_attention

    if impl != "mma":
        pytest.skip("compares all back ends in one run")
    case = make_case(16, 2, 128, ctx=[900, 33], n=[96, 20], page=16, seed=3).to("cuda")
    outs = {}
    for name in ta_ops.available_impls(128):
        ta_ops.set_impl(name)
        outs[name] = tree_attention(*case.args(), kv_chunk=256)
    ta_ops.set_impl(impl)
    torch.cuda.synchronize()
    base = outs["mma"][0].float()
    for name, (o, lse) in outs.items():
        assert (o.float() - base).abs().max() <= 1e-2 * base.abs().max(), name
        torch.testing.assert_close(lse, outs["mma"][1], atol=1e-3, rtol=1e-5)


@pytest.mark.parametrize("kv_chunk", [512, 192, 128])
def test_cluster_merge_equals_merge_kernel_bit_for_bit(kv_chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # fa3 merges a split row tile with the merge kernel, or, opted in with DDTREE_TA_CLUSTER_MERGE=1
    # (read on every call) where the plan allows (2-8 splits, every cluster resident at once), inside a
    # thread-block cluster. Same arithmetic, so the same bits; requests shorter than the longest leave
    # idle cluster members.
    if _impl[0] != "fa3":
        pytest.skip("the cluster merge is fa3's")
    case = make_case(8, 1, 128, ctx=[900, 200, 0], n=[60, 33, 17], page=16, seed=kv_chunk).to("cuda")
    monkeypatch.delenv("DDTREE_TA_CLUSTER_MERGE", raising=False)
    o_kernel, lse_kernel = kernel(case, kv_chunk=kv_chunk)
    monkeypatch.setenv("DDTREE_TA_CLUSTER_MERGE", "1")
    o_cluster, lse_cluster = kernel(case, kv_chunk=kv_chunk)
    assert torch.equal(o_cluster.view(torch.int16), o_kernel.view(torch.int16))
    assert torch.equal(lse_cluster.view(torch.int32), lse_kernel.view(torch.int32))
    assert_close_to_reference(case, o_cluster, lse_cluster)


@pytest.mark.parametrize("kv_chunk", [512, 320, 256])
def test_fused_merge_equals_merge_kernel_bit_for_bit(kv_chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # fa3 v10: a row tile split into 2-4 chunks is merged by its last CTA (opt-in, DDTREE_TA_FA3_FUSED_MERGE=1,
    # read on every call) instead of the merge kernel (default). Same arithmetic, so the same bits; the
    # chunks split the longest request into 2, 3 and 4, the shorter ones need one chunk or leave CTAs
    # past their length. The eager tile-mask wait (DDTREE_TA_FA3_LAZY_MASK=0) must not change a bit.
    if _impl[0] != "fa3":
        pytest.skip("the fused merge is fa3's")
    case = make_case(8, 1, 128, ctx=[900, 200, 0], n=[60, 33, 17], page=16, seed=kv_chunk + 1).to("cuda")
    monkeypatch.delenv("DDTREE_TA_FA3_FUSED_MERGE", raising=False)
    o_kernel, lse_kernel = kernel(case, kv_chunk=kv_chunk)
    monkeypatch.setenv("DDTREE_TA_FA3_FUSED_MERGE", "1")
    o_fused, lse_fused = kernel(case, kv_chunk=kv_chunk)
    monkeypatch.setenv("DDTREE_TA_FA3_LAZY_MASK", "0")
    o_eager, lse_eager = kernel(case, kv_chunk=kv_chunk)
    assert torch.equal(o_fused.view(torch.int16), o_kernel.view(torch.int16))
    assert torch.equal(lse_fused.view(torch.int32), lse_kernel.view(torch.int32))
    assert torch.equal(o_eager.view(torch.int16), o_fused.view(torch.int16))
    assert torch.equal(lse_eager.view(torch.int32), lse_fused.view(torch.int32))
    assert_close_to_reference(case, o_fused, lse_fused)


def test_fused_merge_counters_survive_graph_replays_and_plan_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fused merge's arrival counters live in the workspace and must be back at zero after every
    # launch: CUDA-graph replays of several calls (each sees the counters the previous one left), eager
    # calls with other plans on the same stream in between (other counter and partial layouts), and the
    # results must equal the eager ones bit for bit each time. A counter left non-zero would make a
    # CTA wait forever (watchdog trap) or skip a merge (unwritten rows, caught by the poison).
    from ddtree_engine.ops import tree_attention

    if _impl[0] != "fa3":
        pytest.skip("the fused merge is fa3's")
    monkeypatch.setenv("DDTREE_TA_FA3_FUSED_MERGE", "1")
    case = make_case(8, 1, 128, ctx=[1500, 700], n=[64, 40], page=16, seed=21).to("cuda")
    other = make_case(16, 2, 128, ctx=[2500], n=[100], page=16, seed=22).to("cuda")
    args = case.args()
    want = tree_attention(*args, kv_chunk=512)  # 3 splits of the longest request: fused merge
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        tree_attention(*args, kv_chunk=512)  # warm-up on the capture stream: its workspace exists
        graph = torch.cuda.CUDAGraph()
        outs = []
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(3):
                outs.append(tree_attention(*args, kv_chunk=512))
    torch.cuda.current_stream().wait_stream(stream)
    for rep in range(3):
        for o in outs:
            o[0].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for o, lse in outs:
            assert torch.equal(o.view(torch.int16), want[0].view(torch.int16)), f"replay {rep}"
            assert torch.equal(lse.view(torch.int32), want[1].view(torch.int32)), f"replay {rep}"
        # other plans in between, eager, on the default stream and the capture stream
        for chunk in (256, 1024, 384):
            o2, lse2 = kernel(other, kv_chunk=chunk)
            assert_close_to_reference(other, o2, lse2)
        with torch.cuda.stream(stream):
            tree_attention(*other.args(), kv_chunk=256)
        torch.cuda.synchronize()
        again = tree_attention(*args, kv_chunk=512)
        assert torch.equal(again[0].view(torch.int16), want[0].view(torch.int16))


@pytest.mark.parametrize("weight", ["6", "12"])
@pytest.mark.parametrize("kv_chunk", [512, 256, 0])
def test_balanced_chunks_match_reference_and_chain_equals_causal(kv_chunk: int, weight: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # fa3 v10, opt-in DDTREE_TA_FA3_BALANCE=w: chunk boundaries weighted by tile cost (masked tiles count
    # w / 4). Other boundaries, same count: results against the reference, every row written, and a chain
    # still equal to causal mode bit for bit; with the fused merge too (same bits as the merge kernel).
    if _impl[0] != "fa3":
        pytest.skip("balanced chunks are fa3's")
    monkeypatch.setenv("DDTREE_TA_FA3_BALANCE", weight)
    case = make_case(8, 1, 128, ctx=[900, 200, 0, 1300], n=[300, 33, 17, 90], page=16, seed=kv_chunk + 7).to("cuda")
    o, lse = kernel(case, kv_chunk=kv_chunk)
    assert_close_to_reference(case, o, lse)
    monkeypatch.setenv("DDTREE_TA_FA3_FUSED_MERGE", "1")
    o_f, lse_f = kernel(case, kv_chunk=kv_chunk)
    assert torch.equal(o_f.view(torch.int16), o.view(torch.int16))
    assert torch.equal(lse_f.view(torch.int32), lse.view(torch.int32))
    monkeypatch.delenv("DDTREE_TA_FA3_FUSED_MERGE")
    # chain vs causal under one plan: the planned chunk (kv_chunk 0) depends on n_max, which the op takes
    # from anc (tree) or from the token count (causal), so that comparison pins the chunk, as
    # test_chain_equals_causal_bit_for_bit does.
    chain = make_case(8, 1, 128, ctx=[1000, 63], n=[300, 130], page=16, kind="chain", seed=kv_chunk + 8).to("cuda")
    o_tree, lse_tree = kernel(chain, kv_chunk=kv_chunk or 384)
    o_causal, lse_causal = kernel(chain, causal=True, kv_chunk=kv_chunk or 384)
    assert torch.equal(o_tree, o_causal) and torch.equal(lse_tree, lse_causal)
    assert_close_to_reference(chain, o_causal, lse_causal, causal=True)


@pytest.mark.parametrize("kv_chunk", [0, 384, 640, 1152])
def test_tile_schedules_match_reference_and_chain_equals_causal(kv_chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # fa3 v17: DDTREE_TA_FA3_SCHEDULE=chunked (v10's contiguous chunks) or strided (split s takes every
    # nact-th tile; read on every call). The requests' tile counts leave partial rounds (T % nact != 0) and
    # put tree tiles in several splits. Both schedules against the reference; they group the same tiles
    # differently, so some bits differ (which shows the switch acts); under the strided schedule a chain
    # equals causal mode bit for bit and the fused merge gives the merge kernel's bits.
    if _impl[0] != "fa3":
        pytest.skip("the tile schedules are fa3's")
    case = make_case(8, 1, 128, ctx=[1000, 300, 0, 2100], n=[300, 40, 130, 260], page=16, seed=kv_chunk + 31).to("cuda")
    monkeypatch.setenv("DDTREE_TA_FA3_SCHEDULE", "chunked")
    o_c, lse_c = kernel(case, kv_chunk=kv_chunk)
    assert_close_to_reference(case, o_c, lse_c)
    monkeypatch.setenv("DDTREE_TA_FA3_SCHEDULE", "strided")
    o_s, lse_s = kernel(case, kv_chunk=kv_chunk)
    assert_close_to_reference(case, o_s, lse_s)
    assert not torch.equal(o_s.view(torch.int16), o_c.view(torch.int16))
    if kv_chunk in (640, 1152):  # 4 and 3 splits of the longest request: the fused merge's range
        monkeypatch.setenv("DDTREE_TA_FA3_FUSED_MERGE", "1")
        o_f, lse_f = kernel(case, kv_chunk=kv_chunk)
        monkeypatch.delenv("DDTREE_TA_FA3_FUSED_MERGE")
        assert torch.equal(o_f.view(torch.int16), o_s.view(torch.int16))
        assert torch.equal(lse_f.view(torch.int32), lse_s.view(torch.int32))
    chain = make_case(8, 1, 128, ctx=[1000, 63], n=[300, 130], page=16, kind="chain", seed=kv_chunk + 32).to("cuda")
    o_tree, lse_tree = kernel(chain, kv_chunk=kv_chunk or 384)
    o_causal, lse_causal = kernel(chain, causal=True, kv_chunk=kv_chunk or 384)
    assert torch.equal(o_tree, o_causal) and torch.equal(lse_tree, lse_causal)
    assert_close_to_reference(chain, o_causal, lse_causal, causal=True)


@pytest.mark.parametrize("kv_chunk", [0, 384])
def test_longest_row_tiles_first_gives_the_same_bits(kv_chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # fa3 v21: DDTREE_TA_FA3_LPT=1 launches the grid as (hkv, row tiles x splits, batch) and maps it back in
    # reverse row-tile order; every CTA must still find its own (head, row tile, split): same bits as index
    # order, and both against the reference. Several kv heads, requests of different lengths (CTAs past a
    # request's rows or splits return early), one split (chunk 0) and several (384), and the fused merge.
    if _impl[0] != "fa3":
        pytest.skip("the CTA order is fa3's")
    case = make_case(32, 4, 128, ctx=[900, 0, 2100], n=[200, 70, 150], page=16, seed=kv_chunk + 77).to("cuda")
    outs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("DDTREE_TA_FA3_LPT", flag)
        outs[flag] = kernel(case, kv_chunk=kv_chunk)
    assert_close_to_reference(case, *outs["1"])
    for a, b in zip(outs["0"], outs["1"]):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    if kv_chunk:
        monkeypatch.setenv("DDTREE_TA_FA3_FUSED_MERGE", "1")
        o_f, lse_f = kernel(case, kv_chunk=kv_chunk)
        assert torch.equal(o_f.view(torch.int16), outs["1"][0].view(torch.int16))
        assert torch.equal(lse_f.view(torch.int32), outs["1"][1].view(torch.int32))


@pytest.mark.parametrize("kv_chunk", [1024, 256])
def test_pdl_chain_reads_q_after_the_previous_launch(kv_chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # fa3 v18: three launches on one stream without a sync, each one's q the previous one's o. With the early
    # input reads (inputs_ready=True: the previous launch writes only q) and the merge kernel's early trigger
    # (DDTREE_TA_MERGE_TRIGGER) a launch's CTAs start while the previous grid drains; q must still be read
    # after its PDL wait. Chunk 1024: one split (fa3 after fa3), 256: four (fa3 after the merge kernel). Same
    # bits with both off.
    from ddtree_engine.ops import tree_attention

    if _impl[0] != "fa3":
        pytest.skip("the early PDL reads are fa3's")
    case = make_case(8, 1, 128, ctx=[700, 40], n=[100, 60], page=16, seed=4711).to("cuda")
    outs = {}
    for flag in ("0", "1"):
        monkeypatch.delenv("DDTREE_TA_FA3_EARLY_INPUTS", raising=False)
        monkeypatch.setenv("DDTREE_TA_MERGE_TRIGGER", flag)
        args = list(case.args())
        # NaN in the allocator's free blocks, where the outputs will land: a q read too early shows up.
        junk = torch.full((3 * case.q.numel(),), float("nan"), dtype=torch.bfloat16, device="cuda")
        del junk
        chain = [args[0]]
        for _ in range(3):
            args[0] = chain[-1]
            chain.append(tree_attention(*args, kv_chunk=kv_chunk, inputs_ready=flag == "1"))
            chain[-1] = chain[-1][0]
        torch.cuda.synchronize()
        outs[flag] = chain
    for a, b in zip(outs["0"][1:], outs["1"][1:]):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    for q_prev, o in zip(outs["1"][:-1], outs["1"][1:]):
        link = dataclasses.replace(case, q=q_prev)
        o_ref, _ = ref.tree_attention(*link.to("cpu").args())
        err = (o.float() - o_ref.cuda()).abs()
        assert not torch.isnan(o).any() and err.max() <= 2e-2 * o_ref.abs().max().clamp_min(1e-3)


def test_non_ancestor_kv_leaves_output_unchanged() -> None:
    case = make_case(8, 1, 128, ctx=[500], n=[90], page=16, seed=8).to("cuda")
    o, lse = kernel(case, kv_chunk=128)
    par = case.parents[0]
    node = 89
    path = set()
    j = node
    while j >= 0:
        path.add(j)
        j = par[j]
    others = [j for j in range(90) if j not in path]
    assert len(others) > 10
    bt = case.block_table.cpu()
    for j in others:
        s = 500 + j
        pg = int(bt[0, s // 16])
        case.k_cache[pg, s % 16] = torch.randn_like(case.k_cache[pg, s % 16]) * 4
        case.v_cache[pg, s % 16] = torch.randn_like(case.v_cache[pg, s % 16]) * 4
    o2, lse2 = kernel(case, kv_chunk=128)
    assert torch.equal(o2[node], o[node]) and torch.equal(lse2[node], lse[node])
    assert not torch.equal(o2, o)


@pytest.mark.parametrize("seed", [0, 1])
def test_node_equals_attention_over_its_ancestor_path(seed: int) -> None:
    hq, hkv, d, ctx, n, page = 8, 2, 128, 700, 120, 16
    case = make_case(hq, hkv, d, ctx=[ctx], n=[n], page=page, seed=seed).to("cuda")
    o, lse = kernel(case)
    rng = random.Random(seed)
    bt = case.block_table.cpu()
    for node in rng.sample(range(n), 6):
        path = []
        j = node
        while j >= 0:
            path.append(j)
            j = case.parents[0][j]
        path.reverse()
        # chain request: same context pages, then the path's K/V in fresh pages
        m = len(path)
        pages = math.ceil((ctx + m) / page)
        kc = case.k_cache.clone()
        vc = case.v_cache.clone()
        extra = torch.arange(kc.shape[0], kc.shape[0] + pages, dtype=torch.int32)
        kc = torch.cat([kc, torch.zeros(pages, *kc.shape[1:], dtype=kc.dtype, device="cuda")])
        vc = torch.cat([vc, torch.zeros(pages, *vc.shape[1:], dtype=vc.dtype, device="cuda")])
        for s in range(ctx + m):
            src_slot = s if s < ctx else ctx + path[s - ctx]
            src = int(bt[0, src_slot // page]), src_slot % page
            kc[int(extra[s // page]), s % page] = case.k_cache[src]
            vc[int(extra[s // page]), s % page] = case.v_cache[src]
        t = case.qo_indptr[0].item() + node
        q_path = torch.stack([case.q[int(case.qo_indptr[0]) + p] for p in path]).contiguous()
        chain = Case(q_path, kc, vc, torch.tensor([0, m], dtype=torch.int32, device="cuda"),
                     extra.view(1, -1).cuda(), case.ctx_len.clone(), torch.zeros(1, 1, 1, dtype=torch.int32, device="cuda"),
                     case.sm_scale, [list(range(-1, m - 1))])
        o_path, lse_path = kernel(chain, causal=True)
        assert (o_path[m - 1].float() - o[t].float()).abs().max() <= 1e-2 * o[t].float().abs().max() + 1e-3
        torch.testing.assert_close(lse_path[m - 1], lse[t], atol=1e-3, rtol=1e-5)


def test_repeated_launches_are_deterministic() -> None:
    case = make_case(8, 1, 128, ctx=[3000, 900], n=[64, 17], page=64, seed=4).to("cuda")
    first = kernel(case)
    for _ in range(3):
        again = kernel(case)
        assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])


def test_invalid_arguments_raise() -> None:
    from ddtree_engine.ops import tree_attention

    case = make_case(6, 4, 128, ctx=[3], n=[2], page=16, seed=1).to("cuda")
    with pytest.raises(ValueError, match="multiple"):
        tree_attention(*case.args())
    case = make_case(4, 2, 96, ctx=[3], n=[2], page=16, seed=1).to("cuda")
    with pytest.raises(Exception, match="head_dim"):
        tree_attention(*case.args())
