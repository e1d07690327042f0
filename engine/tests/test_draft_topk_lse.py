"""draft_topk_lse: the reference on hand-built rows (CPU, CI), and the CUDA op against the reference (GPU)."""

from __future__ import annotations

import math

import pytest
import torch

from ddtree_engine.reference import draft_topk_lse as ref_topk

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
    shape = (batch, positions, vocab + pad)
    if kind == "normal":
        x = torch.randn(shape, generator=gen) * 4
    elif kind == "ties":
        x = torch.randint(0, 4, shape, generator=gen).float()
    elif kind == "dyadic":
        x = torch.randint(0, 16, shape, generator=gen).float() * 0.25 - 2
    elif kind == "neginf":
        x = torch.randn(shape, generator=gen) * 3
        x[torch.rand(shape, generator=gen) < 0.2] = -INF
    else:
        raise AssertionError(kind)
    x = x.to(dtype).cuda()
    return x[..., :vocab]  # row stride = vocab + pad


def _compare(logits: torch.Tensor, k: int) -> None:
    from ddtree_engine.ops import draft_topk_lse

    lp, ids, lse = draft_topk_lse(logits, k)
    want_lp, want_ids, want_lse = ref_topk(logits, k)
    tol = 4e-6 if logits.shape[-1] > 100_000 else 2e-6
    assert torch.equal(ids, want_ids), "ids differ"
    finite = torch.isfinite(want_lp)
    assert torch.equal(torch.isfinite(lp), finite)
    torch.testing.assert_close(lp[finite], want_lp[finite], atol=tol, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=tol, rtol=0)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("vocab", [997, 32000, 151936, 163840])
@pytest.mark.parametrize("k", [1, 16, 1024])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_op_matches_reference_sizes(vocab: int, k: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(vocab * 7 + k)
    _compare(_logits(1, 15, vocab, dtype, "normal", gen), k)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("kind", ["ties", "dyadic", "neginf"])
@pytest.mark.parametrize("k", [1, 16, 1024])
def test_op_matches_reference_edge_values(kind: str, k: int) -> None:
    gen = torch.Generator().manual_seed(k)
    _compare(_logits(3, 7, 20011, torch.float32, kind, gen, pad=5), k)
    _compare(_logits(2, 1, 997, torch.bfloat16, kind, gen, pad=3), k)


@pytest.mark.gpu
@needs_cuda
def test_op_vocab_smaller_than_k_and_single_element() -> None:
    gen = torch.Generator().manual_seed(3)
    _compare(_logits(2, 3, 5, torch.float32, "normal", gen), 16)
    _compare(_logits(1, 1, 1, torch.bfloat16, "normal", gen), 1)


@pytest.mark.gpu
@needs_cuda
def test_op_nan_row_sets_flag_and_raises() -> None:
    from ddtree_engine import DdtreeDeviceError
    from ddtree_engine.ops import check_errors, draft_topk_lse

    check_errors()  # start clean
    x = torch.randn(1, 4, 40000, device="cuda")
    x[0, 2, 12345] = float("nan")
    lp, ids, lse = draft_topk_lse(x, 16)
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
def test_op_cuda_graph_capture_and_replay() -> None:
    from ddtree_engine.ops import draft_topk_lse

    x = torch.randn(1, 15, 163840, device="cuda", dtype=torch.bfloat16)
    draft_topk_lse(x, 64)  # warm-up: loads the library outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lp, ids, lse = draft_topk_lse(x, 64)
    for seed in range(3):
        x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).to(x))
        graph.replay()
        want_lp, want_ids, want_lse = ref_topk(x, 64)
        assert torch.equal(ids, want_ids)
        torch.testing.assert_close(lp, want_lp, atol=4e-6, rtol=0)
        torch.testing.assert_close(lse, want_lse, atol=4e-6, rtol=0)
