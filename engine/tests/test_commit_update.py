"""commit_update (kv_commit + round_update + the live budget in one op): the CUDA op against the reference
composition on random slot states over random paged caches (GPU), including inactive slots, every
hidden-state copy unit, every K/V copy unit, and the > MAX_LAYERS fallback; and under CUDA-graph replay."""

from __future__ import annotations

import pytest
import torch

from ddtree_engine.reference import commit_update as ref_commit_update

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
STATE = ("active", "out_len", "ctx_len", "root", "hidden", "r_tokens", "r_count", "r_finish", "live_budget")


def random_round(seed: int, batch: int, layers: int, page_size: int, d: int, hid_dtype: torch.dtype,
                 kv_dtype: torch.dtype, kv_row: int, wa: int = 9) -> dict[str, object]:
    """One round's tail inputs: accepted paths (strictly increasing from node 0) inside n tree nodes, the
    slots' state (inactive, stop, ignore_stop and length-limit slots all occur), paged caches."""
    g = torch.Generator().manual_seed(seed)
    i32 = torch.int32
    n = 12
    accept_len = torch.randint(1, wa + 1, (batch,), generator=g, dtype=i32)
    accept_nodes = torch.full((batch, wa), -1, dtype=i32)
    for b in range(batch):
        path = sorted(torch.randperm(n - 1, generator=g)[: int(accept_len[b]) - 1].add(1).tolist())
        accept_nodes[b, : int(accept_len[b])] = torch.tensor([0] + path, dtype=i32)
    committed = torch.where(torch.arange(wa)[None, :] < accept_len[:, None],
                            torch.randint(0, 300, (batch, wa), generator=g, dtype=i32), -1).to(i32)
    max_new = torch.randint(1, 12, (batch,), generator=g, dtype=i32)
    active = torch.rand(batch, generator=g) < 0.7
    max_pages = (40 + n) // page_size + 2
    num_pages = batch * max_pages + 3
    table = torch.randperm(num_pages, generator=g)[: batch * max_pages].reshape(batch, max_pages).to(i32)

    def cache() -> torch.Tensor:
        return torch.randint(0, 256, (num_pages, page_size, kv_row), generator=g).to(kv_dtype).cuda()

    st: dict[str, object] = {
        "k_caches": [cache() for _ in range(layers)], "v_caches": [cache() for _ in range(layers)],
        "block_table": table, "accept_len": accept_len,
        "finished": torch.randint(0, 2, (batch,), generator=g, dtype=i32),
        "bonus": torch.randint(0, 300, (batch,), generator=g, dtype=i32), "committed_ids": committed,
        "accept_nodes": accept_nodes, "hid": torch.randn(batch, n, d, generator=g).to(hid_dtype),
        "active": active, "ignore_stop": torch.rand(batch, generator=g) < 0.3, "max_new": max_new,
        "out_len": (max_new - torch.randint(1, 6, (batch,), generator=g, dtype=i32)).clamp(min=0),
        "ctx_len": torch.randint(0, 40, (batch,), generator=g, dtype=i32),
        "root": torch.randint(0, 300, (batch,), generator=g, dtype=i32),
        "hidden": torch.randn(batch, d, generator=g).to(hid_dtype),
        "r_tokens": torch.full((batch, wa + 2), 7, dtype=i32), "r_count": torch.full((batch,), 9, dtype=i32),
        "r_finish": torch.full((batch,), 9, dtype=i32),
        "live_budget": torch.where(active, torch.randint(1, 64, (batch,), generator=g, dtype=i32), 0).to(i32),
    }
    return {k: [t.cuda() for t in v] if isinstance(v, list) else v.cuda() for k, v in st.items()}  # type: ignore[union-attr]


def clone(st: dict[str, object]) -> dict[str, object]:
    return {k: [t.clone() for t in v] if isinstance(v, list) else v.clone() for k, v in st.items()}  # type: ignore[union-attr]


def assert_same(got: dict[str, object], want: dict[str, object]) -> None:
    for k in STATE:
        assert torch.equal(got[k], want[k]), k  # type: ignore[arg-type]
    for a, b in zip(got["k_caches"] + got["v_caches"], want["k_caches"] + want["v_caches"]):  # type: ignore[operator]
        assert torch.equal(a, b), "caches"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("layers,page_size,kv_dtype,kv_row", [(1, 16, torch.bfloat16, 64), (28, 4, torch.bfloat16, 256),
                                                               (3, 1, torch.float32, 3), (2, 16, torch.uint8, 6),
                                                               (130, 16, torch.bfloat16, 8)])
@pytest.mark.parametrize("hid_dtype,d", [(torch.bfloat16, 128), (torch.float32, 1), (torch.bfloat16, 3)])
@pytest.mark.parametrize("seed", range(2))
def test_cuda_op_matches_reference(layers: int, page_size: int, kv_dtype: torch.dtype, kv_row: int,
                                   hid_dtype: torch.dtype, d: int, seed: int) -> None:
    from ddtree_engine.ops import check_errors, commit_update

    st = random_round(seed, 11, layers, page_size, d, hid_dtype, kv_dtype, kv_row)
    want = clone(st)
    ref_commit_update(**want)  # type: ignore[arg-type]
    commit_update(**st)  # type: ignore[arg-type]
    check_errors()
    assert_same(st, want)
    # The random state must exercise inactive slots and slots that stop this round.
    was = want["active"]  # after the round
    assert bool((~was).any()) and bool(was.any())  # type: ignore[union-attr, operator]


@pytest.mark.gpu
@needs_cuda
def test_cuda_op_without_live_budget_and_under_graph_replay() -> None:
    from ddtree_engine.ops import check_errors, commit_update

    st = random_round(5, 8, 4, 16, 64, torch.bfloat16, torch.bfloat16, 128)
    st.pop("live_budget")
    commit_update(**clone(st))  # type: ignore[arg-type]  # warm-up (counters) outside the capture
    want = clone(st)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        commit_update(**st)  # type: ignore[arg-type]
    for _ in range(2):  # each replay is one more round on the updated state
        ref_commit_update(**want)  # type: ignore[arg-type]
        graph.replay()
        torch.cuda.synchronize()
        check_errors()
        for k in STATE[:-1]:
            assert torch.equal(st[k], want[k]), k  # type: ignore[arg-type]
        for a, b in zip(st["k_caches"] + st["v_caches"], want["k_caches"] + want["v_caches"]):  # type: ignore[operator]
            assert torch.equal(a, b)
