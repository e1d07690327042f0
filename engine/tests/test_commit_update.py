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
                 kv_dtype: torch.dtype, kv_row: int, wa: int = 9, device: str = "cuda") -> dict[str, object]:
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
    # Slot state first, so that it depends on the seed and batch alone (not on the cache or row shapes).
    st: dict[str, object] = {
        "accept_len": accept_len, "finished": torch.randint(0, 2, (batch,), generator=g, dtype=i32),
        "bonus": torch.randint(0, 300, (batch,), generator=g, dtype=i32), "committed_ids": committed,
        "accept_nodes": accept_nodes, "active": active, "ignore_stop": torch.rand(batch, generator=g) < 0.3,
        "max_new": max_new,
        "out_len": (max_new - torch.randint(1, 6, (batch,), generator=g, dtype=i32)).clamp(min=0),
        "ctx_len": torch.randint(0, 40, (batch,), generator=g, dtype=i32),
        "root": torch.randint(0, 300, (batch,), generator=g, dtype=i32),
        "r_tokens": torch.full((batch, wa + 2), 7, dtype=i32), "r_count": torch.full((batch,), 9, dtype=i32),
        "r_finish": torch.full((batch,), 9, dtype=i32),
        "live_budget": torch.where(active, torch.randint(1, 64, (batch,), generator=g, dtype=i32), 0).to(i32),
    }
    st["hid"] = torch.randn(batch, n, d, generator=g).to(hid_dtype)
    st["hidden"] = torch.randn(batch, d, generator=g).to(hid_dtype)
    max_pages = (40 + n) // page_size + 2
    num_pages = batch * max_pages + 3
    st["block_table"] = torch.randperm(num_pages, generator=g)[: batch * max_pages].reshape(batch, max_pages).to(i32)

    def cache() -> torch.Tensor:
        return torch.randint(0, 256, (num_pages, page_size, kv_row), generator=g).to(kv_dtype)

    st["k_caches"] = [cache() for _ in range(layers)]
    st["v_caches"] = [cache() for _ in range(layers)]
    return {k: [t.to(device) for t in v] if isinstance(v, list) else v.to(device)  # type: ignore[union-attr]
            for k, v in st.items()}


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


def test_random_rounds_cover_every_branch() -> None:
    # The GPU test's slot states (its seeds, batch 11: independent of its shapes) must exercise inactive slots, slots that stop or hit the length
    # limit this round (live budget zeroed) and slots that go on (live budget kept); checked on the CPU.
    seen = {"inactive": 0, "stop": 0, "length": 0, "continues": 0}
    for seed in range(2):
        st = random_round(seed, 11, 1, 4, 8, torch.float32, torch.float32, 4, device="cpu")
        before = st["active"].clone()  # type: ignore[union-attr]
        ref_commit_update(**st)  # type: ignore[arg-type]
        seen["inactive"] += int((~before).sum())
        seen["stop"] += int((st["r_finish"] == 1).sum())  # type: ignore[operator]
        seen["length"] += int((st["r_finish"] == 2).sum())  # type: ignore[operator]
        seen["continues"] += int(st["active"].sum())  # type: ignore[union-attr]
        assert torch.equal(st["live_budget"] != 0, st["active"])  # type: ignore[operator]
    assert all(v > 0 for v in seen.values()), seen


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
