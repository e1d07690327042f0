"""round_update: the reference against a slot-by-slot model written from its docstring (CPU, CI), and the
one-launch CUDA op against the reference on the same random states (GPU)."""

from __future__ import annotations

import pytest
import torch

from ddtree_engine.reference import round_update as ref_update

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
STATE = ("active", "out_len", "ctx_len", "root", "hidden", "r_tokens", "r_count", "r_finish")


def random_state(seed: int, batch: int = 9, n: int = 6, d: int = 8, wc: int = 5, wa: int = 5, tokens: int = 4,
                 dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Slots covering every branch: inactive, stop, ignore_stop, length limit, widths on both sides of
    the token width. accept_len >= 1 always (tree_accept accepts at least the root)."""
    g = torch.Generator().manual_seed(seed)
    i32 = torch.int32

    def ints(lo: int, hi: int, *shape: int) -> torch.Tensor:
        return torch.randint(lo, hi, shape, generator=g, dtype=i32)

    accept_len = ints(1, min(wa, wc) + 1, batch)
    accept_nodes = torch.full((batch, wa), -1, dtype=i32)
    for b in range(batch):
        path = sorted(torch.randperm(n - 1, generator=g)[: int(accept_len[b]) - 1].add(1).tolist())
        accept_nodes[b, : int(accept_len[b])] = torch.tensor([0] + path, dtype=i32)
    committed = torch.where(torch.arange(wc)[None, :] < accept_len[:, None], ints(0, 300, batch, wc), -1)
    max_new = ints(1, 12, batch)
    return {
        "accept_len": accept_len, "finished": ints(0, 2, batch), "bonus": ints(0, 300, batch),
        "committed_ids": committed.to(i32), "accept_nodes": accept_nodes,
        "hid": torch.randn(batch, n, d, generator=g).to(dtype),
        "active": torch.rand(batch, generator=g) < 0.75, "ignore_stop": torch.rand(batch, generator=g) < 0.3,
        "max_new": max_new, "out_len": (max_new - ints(0, 6, batch)).clamp(min=0),
        "ctx_len": ints(10, 40, batch), "root": ints(0, 300, batch),
        "hidden": torch.randn(batch, d, generator=g).to(dtype),
        "r_tokens": torch.full((batch, tokens), 7, dtype=i32), "r_count": ints(0, 9, batch),
        "r_finish": ints(0, 9, batch),
    }


def call(fn: object, st: dict[str, torch.Tensor]) -> None:
    fn(st["accept_len"], st["finished"], st["bonus"], st["committed_ids"], st["accept_nodes"], st["hid"],  # type: ignore[operator]
       st["active"], st["ignore_stop"], st["max_new"], st["out_len"], st["ctx_len"], st["root"], st["hidden"],
       st["r_tokens"], st["r_count"], st["r_finish"])


def slot_model(st: dict[str, torch.Tensor]) -> dict[str, list]:
    """The docstring's formulas, one slot at a time in plain Python."""
    out: dict[str, list] = {k: [] for k in STATE}
    width = st["r_tokens"].shape[1]
    for b in range(st["hid"].shape[0]):
        act, acc = bool(st["active"][b]), int(st["accept_len"][b])
        remaining = int(st["max_new"][b]) - int(st["out_len"][b])
        n_new = min(acc, remaining) if act else 0
        stopped = act and int(st["finished"][b]) != 0 and not bool(st["ignore_stop"][b]) and acc <= remaining
        out_len = int(st["out_len"][b]) + n_new
        length = act and not stopped and out_len >= int(st["max_new"][b])
        com = st["committed_ids"][b].tolist()
        out["r_tokens"].append([com[c] if c < n_new and c < len(com) else -1 for c in range(width)])
        out["r_count"].append(n_new)
        out["r_finish"].append(1 if stopped else 2 if length else 0)
        out["out_len"].append(out_len)
        out["ctx_len"].append(int(st["ctx_len"][b]) - (0 if act else acc))
        out["root"].append(int(st["bonus"][b]) if act else int(st["root"][b]))
        node = max(int(st["accept_nodes"][b][max(acc - 1, 0)]), 0)
        out["hidden"].append((st["hid"][b, node] if act else st["hidden"][b]).tolist())
        out["active"].append(act and not (stopped or length))
    return out


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("tokens", [2, 4, 7])
def test_reference_matches_the_slot_model(seed: int, tokens: int) -> None:
    st = random_state(seed, tokens=tokens)
    want = slot_model(st)
    call(ref_update, st)
    for k in STATE:
        assert st[k].tolist() == want[k], k


def test_reference_covers_every_branch() -> None:
    # The random states above must actually exercise stop, ignore_stop, length and inactive slots.
    seen = {"stop": 0, "length": 0, "inactive": 0, "ignored_stop": 0}
    for seed in range(6):
        st = random_state(seed)
        was_active, ignore, fin = st["active"].clone(), st["ignore_stop"].clone(), st["finished"].clone()
        call(ref_update, st)
        seen["stop"] += int((st["r_finish"] == 1).sum())
        seen["length"] += int((st["r_finish"] == 2).sum())
        seen["inactive"] += int((~was_active).sum())
        seen["ignored_stop"] += int((was_active & ignore & (fin != 0) & st["active"]).sum())
    assert all(v > 0 for v in seen.values()), seen


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype,d", [(torch.float32, 8), (torch.bfloat16, 128), (torch.bfloat16, 3),
                                     (torch.float32, 1)])
@pytest.mark.parametrize("seed", range(4))
def test_cuda_op_matches_reference(dtype: torch.dtype, d: int, seed: int) -> None:
    from ddtree_engine.ops import check_errors, round_update

    for tokens in (2, 16):
        st = random_state(seed, batch=33, d=d, dtype=dtype, tokens=tokens)
        gpu = {k: v.cuda() for k, v in st.items()}
        call(ref_update, st)
        call(round_update, gpu)
        check_errors()
        for k in STATE:
            assert torch.equal(gpu[k].cpu(), st[k]), k


@pytest.mark.gpu
@needs_cuda
def test_cuda_op_flags_a_node_outside_the_tree() -> None:
    from ddtree_engine.ops import check_errors, round_update
    from ddtree_engine._lib import DdtreeDeviceError

    st = {k: v.cuda() for k, v in random_state(0).items()}
    st["active"].fill_(True)
    st["accept_nodes"][0, : int(st["accept_len"][0])] = 99
    kept = st["hidden"][0].clone()
    call(round_update, st)
    assert torch.equal(st["hidden"][0], kept)
    with pytest.raises(DdtreeDeviceError):
        check_errors()
