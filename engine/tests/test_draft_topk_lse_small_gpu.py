"""The small-row draft_topk_lse kernel (draft_topk_lse_small.cuh: V <= 1024, k <= 64, one warp per row with the
row in registers) on the GPU against the reference, through the default call with DDTREE_TOPK_SMALL=1 (the
library reads it on every call), and the same rows with it off (v4). The CPU emulation of the same kernel is
test_draft_topk_lse_small_emu.py."""

from __future__ import annotations

import pytest
import torch

from ddtree_engine.reference import draft_topk_lse as ref_topk
from topk_inputs import make_logits

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _compare(x: torch.Tensor, k: int) -> None:
    from ddtree_engine.ops.draft_topk_lse import draft_topk_lse

    lp, ids, lse = draft_topk_lse(x, k)
    want_lp, want_ids, want_lse = ref_topk(x, k)
    assert torch.equal(ids, want_ids), "ids differ"
    finite = torch.isfinite(want_lp)
    assert torch.equal(torch.isfinite(lp), finite)
    torch.testing.assert_close(lp[finite], want_lp[finite], atol=2e-6, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=2e-6, rtol=0)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("small", ["1", "0"])
@pytest.mark.parametrize("k", [1, 16, 17, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_rows_match_reference(small: str, k: int, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDTREE_TOPK_SMALL", small)
    gen = torch.Generator().manual_seed(k)
    # The e2e shapes (1x15 and 8x15 at V = 320), each logits-per-lane instantiation's edges, V % 32 != 0,
    # a row stride above V, tie-heavy and -inf rows, V < k.
    for batch, positions, vocab, kind, pad in [(1, 15, 320, "normal", 0), (8, 15, 320, "normal", 0),
                                                (2, 7, 256, "normal", 0), (2, 7, 257, "ties", 3),
                                                (2, 7, 384, "dyadic", 0), (1, 9, 512, "neginf", 0),
                                                (1, 9, 513, "normal", 5), (3, 5, 997, "ties", 0),
                                                (2, 3, 1024, "normal", 0), (2, 3, 5, "normal", 0),
                                                (1, 2, 1, "normal", 0)]:
        x = make_logits((batch, positions, vocab + pad), kind, gen).to(dtype).cuda()[..., :vocab]
        _compare(x, k)


@pytest.mark.gpu
@needs_cuda
def test_small_rows_all_equal_graph_replay_and_nan_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree_engine import DdtreeDeviceError
    from ddtree_engine.ops import check_errors
    from ddtree_engine.ops.draft_topk_lse import draft_topk_lse

    monkeypatch.setenv("DDTREE_TOPK_SMALL", "1")
    _compare(torch.zeros(1, 3, 1000, device="cuda"), 64)  # every element a candidate: the lowest ids win
    x = make_logits((8, 15, 320), "normal", torch.Generator().manual_seed(3)).cuda()
    want = ref_topk(x, 16)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = draft_topk_lse(x, 16)
    for _ in range(2):
        out[1].fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[1], want[1])
    check_errors()
    x[0, 4, 17] = float("nan")
    with pytest.raises(DdtreeDeviceError, match="NaN"):
        draft_topk_lse(x, 16, check=True)
    check_errors()
