"""kv_commit: the reference on hand-built caches (CPU, CI) and the CUDA op against it (GPU)."""

from __future__ import annotations

import pytest
import torch

from ddtree_engine.reference import kv_commit as ref_commit

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _slot_values(cache: torch.Tensor, table: list[int], slots: list[int]) -> list[float]:
    page = cache.shape[1]
    return [cache[table[s // page], s % page, 0, 0].item() for s in slots]


def test_reference_overlapping_chain_moves_rows_down() -> None:
    # One layer, page_size 4, pages shuffled; slot s holds value 100 + s. ctx 3, accept [0, 5, 9]:
    # slots 3+5=8 -> 4 and 3+9=12 -> 5; slot 3 stays; ctx_len becomes 6.
    table = [2, 0, 3, 1]
    cache = torch.zeros(4, 4, 1, 1)
    for s in range(16):
        cache[table[s // 4], s % 4, 0, 0] = 100 + s
    ctx = torch.tensor([3], dtype=torch.int32)
    ref_commit([cache], [], torch.tensor([table], dtype=torch.int32), torch.tensor([[0, 5, 9, -1]], dtype=torch.int32),
               torch.tensor([3], dtype=torch.int32), ctx)
    assert _slot_values(cache, table, list(range(16))) == [100, 101, 102, 103, 108, 112, 106, 107, 108, 109, 110, 111,
                                                           112, 113, 114, 115]
    assert ctx.tolist() == [6]


def test_reference_chain_in_place_and_k_v_layers() -> None:
    table = [0, 1]
    k = [torch.arange(32.0).reshape(2, 4, 2, 2) + 1000 * layer for layer in range(3)]
    v = [t.clone() + 0.5 for t in k]
    before = [t.clone() for t in k + v]
    ctx = torch.tensor([2], dtype=torch.int32)
    ref_commit(k, v, torch.tensor([table], dtype=torch.int32), torch.tensor([[0, 1, 2, 3]], dtype=torch.int32),
               torch.tensor([4], dtype=torch.int32), ctx)
    assert all(torch.equal(a, b) for a, b in zip(k + v, before))  # accept [0,1,2,3] moves nothing
    assert ctx.tolist() == [6]


def test_reference_gathers_before_writing() -> None:
    # accept [0, 1, 3]: slot 3 -> 2 while slot 2... a write-then-read order would copy a stale row.
    cache = torch.arange(8.0).reshape(8, 1, 1, 1)  # page_size 1
    ref_commit([cache], [], torch.tensor([list(range(8))], dtype=torch.int32),
               torch.tensor([[0, 2, 3]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32),
               torch.tensor([0], dtype=torch.int32))
    assert cache.flatten().tolist() == [0, 2, 3, 3, 4, 5, 6, 7]


# ---------------------------------------------------------------------------------------------- GPU
def _setup(layers: int, page_size: int, batch: int, seed: int, dtype: torch.dtype = torch.bfloat16,
           heads: int = 2, dim: int = 64) -> dict[str, object]:
    gen = torch.Generator().manual_seed(seed)
    max_pages = (64 + 48) // page_size + 2
    num_pages = batch * max_pages + 5
    perm = torch.randperm(num_pages, generator=gen)[: batch * max_pages].reshape(batch, max_pages).to(torch.int32)
    ctx = torch.randint(0, 48, (batch,), generator=gen, dtype=torch.int32)
    width = 16
    nodes = torch.full((batch, width), -1, dtype=torch.int32)
    lens = torch.zeros(batch, dtype=torch.int32)
    for b in range(batch):
        n = int(torch.randint(1, width + 1, (1,), generator=gen))
        steps = torch.randint(1, 4, (n - 1,), generator=gen)
        path = [0] + torch.cumsum(steps, 0).tolist()  # strictly increasing from 0: src >= dst
        nodes[b, :n] = torch.tensor(path, dtype=torch.int32)
        lens[b] = n
    k = [torch.randn(num_pages, page_size, heads, dim, generator=gen).to(dtype).cuda() for _ in range(layers)]
    v = [torch.randn(num_pages, page_size, heads, dim, generator=gen).to(dtype).cuda() for _ in range(layers)]
    return dict(k_caches=k, v_caches=v, block_table=perm.cuda(), accept_nodes=nodes.cuda(), accept_len=lens.cuda(),
                ctx_len=ctx.cuda())


def _clone(args: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in args.items():
        out[key] = [t.clone() for t in value] if isinstance(value, list) else value.clone()  # type: ignore[attr-defined]
    return out


def _assert_same(a: dict[str, object], b: dict[str, object]) -> None:
    for x, y in zip(a["k_caches"] + a["v_caches"], b["k_caches"] + b["v_caches"]):  # type: ignore[operator]
        assert torch.equal(x, y)
    assert torch.equal(a["ctx_len"], b["ctx_len"])  # type: ignore[arg-type]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("layers", [1, 4, 61])
def test_op_matches_reference(page_size: int, layers: int) -> None:
    from ddtree_engine.ops import kv_commit

    args = _setup(layers, page_size, batch=3, seed=page_size * 100 + layers)
    want = _clone(args)
    ref_commit(**want)  # type: ignore[arg-type]
    kv_commit(**args)  # type: ignore[arg-type]
    _assert_same(args, want)


@pytest.mark.gpu
@needs_cuda
def test_op_more_layers_than_one_launch_and_odd_rows() -> None:
    from ddtree_engine.ops import kv_commit

    for layers, dtype, heads, dim in ((130, torch.bfloat16, 1, 8), (3, torch.uint8, 1, 6), (3, torch.float32, 3, 3)):
        args = _setup(layers, 16, batch=2, seed=layers, dtype=torch.float32, heads=heads, dim=dim)
        args["k_caches"] = [t.to(dtype) if dtype != torch.uint8 else (t * 50).to(dtype) for t in args["k_caches"]]  # type: ignore[attr-defined]
        args["v_caches"] = [t.to(dtype) if dtype != torch.uint8 else (t * 50).to(dtype) for t in args["v_caches"]]  # type: ignore[attr-defined]
        want = _clone(args)
        ref_commit(**want)  # type: ignore[arg-type]
        kv_commit(**args)  # type: ignore[arg-type]
        _assert_same(args, want)


@pytest.mark.gpu
@needs_cuda
def test_op_graph_capture_replays_and_advances_ctx_each_time() -> None:
    from ddtree_engine.ops import kv_commit

    args = _setup(4, 16, batch=2, seed=9)
    kv_commit(**_clone(args))  # type: ignore[arg-type]  # warm-up outside the capture
    want = _clone(args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kv_commit(**args)  # type: ignore[arg-type]
    # Capture ran nothing; each replay commits once more (ctx_len advances, so the slots move on).
    for _ in range(2):
        ref_commit(**want)  # type: ignore[arg-type]
        graph.replay()
        torch.cuda.synchronize()
        _assert_same(args, want)
