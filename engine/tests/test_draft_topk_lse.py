"""draft_topk_lse: the reference on hand-built rows (CPU, CI), and the CUDA op against the reference (GPU)."""

from __future__ import annotations

import math
import os

import pytest
import torch

from ddtree_engine.reference import draft_topk_lse as ref_topk
from topk_inputs import make_logits

INF = float("inf")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_reference_golden_row_ties_lower_id_first() -> None:
    x = torch.tensor([[[1.0, 4.0, -INF, 5.0, 0.0, 0.0, -1.0, 5.0, -3.0, 2.0]]])
    lp, ids, lse = ref_topk(x, 6)
    assert ids.tolist() == [[[3, 7, 1, 9, 0, 4]]]
    want_lse = math.log(sum(math.exp(v) for v in [1, 4, 5, 0, 0, -1, 5, -3, 2]))
    assert lse.item() == pytest.approx(want_lse, abs=1e-6)
    assert lp[0, 0].tolist() == pytest.approx([5 - want_lse, 5 - want_lse, 4 - want_lse, 2 - want_lse,
                                               1 - want_lse, 0 - want_lse], abs=1e-6)
    assert lp.dtype == torch.float32 and ids.dtype == torch.int32 and lse.dtype == torch.float32


def test_reference_dyadic_values_are_exact() -> None:
    # Two equal logits of 0 and two of -inf: lse = log 2 exactly representable as x - lse.
    x = torch.tensor([[[0.0, -INF, 0.0, -INF]]])
    lp, ids, lse = ref_topk(x, 4)
    assert ids.tolist() == [[[0, 2, 1, 3]]]
    assert lse.item() == pytest.approx(math.log(2), abs=1e-7)
    assert lp[0, 0, 2].item() == -INF and lp[0, 0, 3].item() == -INF


def test_reference_vocab_smaller_than_k_pads() -> None:
    x = torch.tensor([[[2.0, 1.0, 3.0]], [[0.0, 0.0, 0.0]]], dtype=torch.bfloat16)
    lp, ids, _ = ref_topk(x, 5)
    assert ids.tolist() == [[[2, 0, 1, -1, -1]], [[0, 1, 2, -1, -1]]]
    assert lp[:, :, 3:].eq(-INF).all()
    assert lp[1, 0, 0].item() == pytest.approx(-math.log(3), abs=1e-6)


def test_reference_all_neg_inf_row() -> None:
    lp, ids, lse = ref_topk(torch.full((1, 1, 4), -INF), 2)
    assert lse.item() == -INF and lp.eq(-INF).all() and ids.tolist() == [[[0, 1]]]


def test_reference_nan_row_is_flagged() -> None:
    x = torch.zeros(1, 2, 8)
    x[0, 1, 3] = float("nan")
    lp, ids, lse = ref_topk(x, 3)
    assert not torch.isnan(lse[0, 0]) and torch.isnan(lse[0, 1])
    assert torch.isnan(lp[0, 1]).all() and ids[0, 1].eq(-1).all()
    with pytest.raises(ValueError, match="NaN"):
        ref_topk(x, 3, check=True)


def test_reference_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        ref_topk(torch.zeros(3, 4), 1)
    with pytest.raises(ValueError):
        ref_topk(torch.zeros(1, 1, 4), 0)
    with pytest.raises(ValueError):
        ref_topk(torch.zeros(1, 1, 4, dtype=torch.float16), 1)


# ---------------------------------------------------------------------------------------------- GPU
def _logits(batch: int, positions: int, vocab: int, dtype: torch.dtype, kind: str, gen: torch.Generator,
            pad: int = 0) -> torch.Tensor:
    x = make_logits((batch, positions, vocab + pad), kind, gen).to(dtype).cuda()
    return x[..., :vocab]  # row stride = vocab + pad


# Every implementation runs every GPU comparison (engine/bench/NOTES.md: v4 and v3 for k <= 64, v2 for
# any k; the default picks v4 where it can run, else v3 for k <= 16; "v4" with k > 64 or without cluster
# launch runs v3, "v3" with k > 64 runs v2, which the resolved_impl check below confirms).
IMPLS = ["v2", "v3", "v4"]


def _want_impl(k: int, impl: str) -> str:
    """The implementation the library should resolve (k, impl) to on this device (mirrors the C logic)."""
    clusters = torch.cuda.get_device_capability()[0] >= 9
    small = 16  # the default's v3 range
    if impl == "default":
        impl = {"v2": "v2", "v3": "v3"}.get(os.environ.get("DDTREE_TOPK_IMPL", ""), "v4")  # read once, like this
    else:
        small = 64
    if impl == "v4":
        if k <= 64 and clusters:
            return "v4"
        impl = "v3"
    return "v3" if impl == "v3" and k <= small else "v2"


def _compare(logits: torch.Tensor, k: int, impl: str = "default") -> None:
    from ddtree_engine.ops.draft_topk_lse import draft_topk_lse_impl, resolved_impl

    assert resolved_impl(k, impl) == _want_impl(k, impl)
    lp, ids, lse = draft_topk_lse_impl(logits, k, impl)
    want_lp, want_ids, want_lse = ref_topk(logits, k)
    tol = 4e-6 if logits.shape[-1] > 100_000 else 2e-6
    assert torch.equal(ids, want_ids), "ids differ"
    finite = torch.isfinite(want_lp)
    assert torch.equal(torch.isfinite(lp), finite)
    torch.testing.assert_close(lp[finite], want_lp[finite], atol=tol, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=tol, rtol=0)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("vocab", [997, 32000, 151936, 163840])
@pytest.mark.parametrize("k", [1, 16, 32, 64, 1024])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_op_matches_reference_sizes(vocab: int, k: int, dtype: torch.dtype, impl: str) -> None:
    gen = torch.Generator().manual_seed(vocab * 7 + k)
    _compare(_logits(1, 15, vocab, dtype, "normal", gen), k, impl)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("k", [1, 16, 1024])
def test_op_default_impl_matches_reference(k: int) -> None:
    gen = torch.Generator().manual_seed(k + 99)
    _compare(_logits(2, 15, 163840, torch.bfloat16, "normal", gen), k)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("kind", ["ties", "dyadic", "neginf"])
@pytest.mark.parametrize("k", [1, 16, 32, 64, 1024])
def test_op_matches_reference_edge_values(kind: str, k: int, impl: str) -> None:
    gen = torch.Generator().manual_seed(k)
    _compare(_logits(3, 7, 20011, torch.float32, kind, gen, pad=5), k, impl)
    _compare(_logits(2, 1, 997, torch.bfloat16, kind, gen, pad=3), k, impl)
    _compare(_logits(1, 2, 40000, torch.bfloat16, kind, gen, pad=8), k, impl)  # aligned rows: 16-byte loads


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl", IMPLS)
def test_op_merge_overflow_path(impl: str) -> None:
    # 34 fp32 chunks each holding the values 31..0 once (rest -1): more than 1024 items clear v3's merge
    # bound, so its radix fallback runs (the CPU emulation test checks that this input takes that path).
    vocab = 34 * 4096
    x = torch.full((1, 1, vocab), -1.0)
    gen = torch.Generator().manual_seed(9)
    for c in range(34):
        pos = torch.randperm(4096, generator=gen)[:32] + c * 4096
        x[0, 0, pos] = torch.arange(32, dtype=torch.float32)
    _compare(x.cuda(), 32, impl)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl", IMPLS)
def test_op_vocab_smaller_than_k_and_single_element(impl: str) -> None:
    gen = torch.Generator().manual_seed(3)
    _compare(_logits(2, 3, 5, torch.float32, "normal", gen), 16, impl)
    _compare(_logits(1, 1, 1, torch.bfloat16, "normal", gen), 1, impl)
    x = torch.full((1, 2, 5000), -INF, device="cuda")
    x[0, 1, 4321] = 0.5
    _compare(x, 8, impl)  # an all -inf row and a row with one finite logit


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl", IMPLS)
def test_op_nan_row_sets_flag_and_raises(impl: str) -> None:
    from ddtree_engine import DdtreeDeviceError
    from ddtree_engine.ops import check_errors, draft_topk_lse
    from ddtree_engine.ops.draft_topk_lse import draft_topk_lse_impl

    check_errors()  # start clean
    x = torch.randn(1, 4, 40000, device="cuda")
    x[0, 2, 12345] = float("nan")
    lp, ids, lse = draft_topk_lse_impl(x, 16, impl)
    assert torch.isnan(lse[0, 2]) and torch.isnan(lp[0, 2]).all() and ids[0, 2].eq(-1).all()
    assert torch.isfinite(lse[0, [0, 1, 3]]).all()
    with pytest.raises(DdtreeDeviceError, match="NaN"):
        check_errors()
    check_errors()  # the flag was cleared
    with pytest.raises(DdtreeDeviceError):
        draft_topk_lse(x, 16, check=True)


@pytest.mark.gpu
@needs_cuda
def test_op_rejects_bad_arguments() -> None:
    from ddtree_engine.ops import draft_topk_lse

    with pytest.raises(ValueError):
        draft_topk_lse(torch.zeros(1, 1, 8, device="cuda"), 1025)
    with pytest.raises(ValueError):
        draft_topk_lse(torch.zeros(1, 1, 16, device="cuda")[..., ::2], 1)  # vocab stride 2
    with pytest.raises(ValueError):
        draft_topk_lse(torch.zeros(1, 1, 8), 1)  # CPU tensor


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl", IMPLS + ["default"])
@pytest.mark.parametrize("k", [1, 2, 16, 1024])
def test_op_signed_zeros_tie_by_id(impl: str, k: int) -> None:
    # The reference orders by value, then lower id: -0 and +0 tie, so a -0 at a lower id than a +0 comes
    # first (every implementation compared raw ordered keys, which put +0 above -0, before v5).
    x = torch.full((2, 3, 40000), -5.0)
    x[0, 0, 0], x[0, 0, 7] = -0.0, 0.0
    x[1, 2, 39999], x[1, 2, 20000], x[1, 2, 40] = 0.0, -0.0, -0.0
    x[0, 1, :] = 0.0
    x[0, 1, 1::3] = -0.0  # a row of zeros of both signs
    for dtype in (torch.float32, torch.bfloat16):
        _compare(x.to(dtype).cuda(), k, impl)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("impl,k", [("v2", 64), ("v3", 16), ("v4", 1), ("v4", 16), ("v4", 64)])
def test_op_cuda_graph_capture_and_replay(impl: str, k: int) -> None:
    from ddtree_engine.ops.draft_topk_lse import draft_topk_lse_impl

    x = torch.randn(1, 15, 163840, device="cuda", dtype=torch.bfloat16)
    draft_topk_lse_impl(x, k, impl)  # warm-up: loads the library outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lp, ids, lse = draft_topk_lse_impl(x, k, impl)
    for seed in range(3):
        x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(x))
        graph.replay()
        want_lp, want_ids, want_lse = ref_topk(x, k)
        assert torch.equal(ids, want_ids)
        torch.testing.assert_close(lp, want_lp, atol=4e-6, rtol=0)
        torch.testing.assert_close(lse, want_lse, atol=4e-6, rtol=0)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("k", [1, 16, 32, 64])
def test_op_v4_many_rows_cluster_by_row_count(k: int) -> None:
    # Since v5 the launcher gives each row 4 CTAs instead of 8 when 8 per row would not fit in one wave
    # (8 x 15 rows: two register rounds per bf16 thread, the candidate pass re-loads): normal, tie-heavy
    # and -inf rows of many-row batches, bf16 and fp32, against the reference; also inside a CUDA graph.
    from ddtree_engine.ops.draft_topk_lse import draft_topk_lse_impl

    gen = torch.Generator().manual_seed(900 + k)
    _compare(_logits(8, 15, 163840, torch.bfloat16, "normal", gen), k, "v4")
    _compare(_logits(3, 12, 163840, torch.float32, "normal", gen), k, "v4")
    for kind in ("ties", "dyadic", "neginf"):
        _compare(_logits(6, 8, 40000, torch.bfloat16, kind, gen), k, "v4")
    x = _logits(8, 15, 163840, torch.bfloat16, "normal", gen)
    draft_topk_lse_impl(x, k, "v4")
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lp, ids, lse = draft_topk_lse_impl(x, k, "v4")
    x.copy_(make_logits(tuple(x.shape), "normal", gen).to(x))
    graph.replay()
    want_lp, want_ids, want_lse = ref_topk(x, k)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(lp, want_lp, atol=4e-6, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=4e-6, rtol=0)


@pytest.mark.gpu
@needs_cuda
def test_op_v4_back_to_back_calls_and_streams() -> None:
    # v4 keeps no state between calls (the cluster barrier replaces tickets): many calls queued back to back
    # (programmatic dependent launch lets each start while the previous ends) and calls on two streams at
    # once must all give the reference's answer.
    from ddtree_engine.ops.draft_topk_lse import draft_topk_lse_impl

    gen = torch.Generator().manual_seed(77)
    xs = [_logits(1, 15, 163840, torch.bfloat16, "normal", gen) for _ in range(4)]
    wants = [ref_topk(x, 16) for x in xs]
    outs = [draft_topk_lse_impl(xs[i % 4], 16, "v4") for i in range(32)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        side_outs = [draft_topk_lse_impl(xs[i % 4], 16, "v4") for i in range(8)]
    torch.cuda.current_stream().wait_stream(side)
    for i, (lp, ids, lse) in enumerate(outs + side_outs):
        want_lp, want_ids, want_lse = wants[i % 4]
        assert torch.equal(ids, want_ids), f"call {i}"
        torch.testing.assert_close(lp, want_lp, atol=4e-6, rtol=0)
        torch.testing.assert_close(lse, want_lse, atol=4e-6, rtol=0)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("opt", ["s10", "v13r", "v9"])
@pytest.mark.parametrize("k", [2, 16])
def test_op_v4_opt_switches_at_solo_rows(opt: str, k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Session 11 made v9 the default at k <= 16 where the launch is solo (a one-wave grid of 8-CTA clusters: 1x15 and
    # 1x2 x 163,840); DDTREE_TOPK_V4_OPT (read per call) keeps the other k > 1 builds reachable there for the A/B
    # benches ("s10": session 10's default, v13r): each must still give the reference's answer, normal and -inf rows.
    gen = torch.Generator().manual_seed(1100 + k)
    monkeypatch.setenv("DDTREE_TOPK_V4_OPT", opt)
    _compare(_logits(1, 15, 163840, torch.bfloat16, "normal", gen), k, "v4")
    _compare(_logits(1, 2, 163840, torch.bfloat16, "neginf", gen), k, "v4")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("setting", ["", "1", "1/solo", "2", "2/v8", "2/v9", "4", "8"])
@pytest.mark.parametrize("k", [1, 16, 64])
def test_op_v4_cluster_switch_at_many_rows(setting: str, k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Session 13: 67..132 bf16 rows take 2-CTA clusters by default (8x15: one wave of 240 CTAs; v9 / v11 at k > 1);
    # DDTREE_TOPK_V4_CLUSTER (read per call) forces the largest cluster, with DDTREE_TOPK_V4_LAUNCH / _OPT, for
    # bench_topk_rows_ab.py's sides ("4": the launch before session 13; "2/v8": its k > 1 build at 2 CTAs): every setting
    # must give the reference's answer on 120 rows of 151,936 (four register rounds at 2 CTAs, eight at 1), normal and
    # -inf rows, and on tie-heavy rows (the radix fallback).
    cluster, _, extra = setting.partition("/")
    if cluster:
        monkeypatch.setenv("DDTREE_TOPK_V4_CLUSTER", cluster)
    if extra == "solo":
        monkeypatch.setenv("DDTREE_TOPK_V4_LAUNCH", "solo")
    elif extra:
        monkeypatch.setenv("DDTREE_TOPK_V4_OPT", extra)
    gen = torch.Generator().manual_seed(1300 + k)
    _compare(_logits(8, 15, 151936, torch.bfloat16, "normal", gen), k)
    _compare(_logits(8, 15, 151936, torch.bfloat16, "neginf", gen), k)
    _compare(_logits(7, 11, 40000, torch.bfloat16, "ties", gen), k)
