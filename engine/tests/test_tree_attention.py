"""CPU tests of the fp32 tree-attention reference, plus the case builder the GPU tests reuse."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import sys

import pytest
import torch
from torch import Tensor

# Resolve the public name first (the package's lazy __getattr__ binds the function), then take the
# module for its helpers: importing the submodule directly would shadow the function's name.
from ddtree_engine.reference import tree_attention as reference_tree_attention

ref = sys.modules["ddtree_engine.reference.tree_attention"]


@dataclass
class Case:
    q: Tensor
    k_cache: Tensor
    v_cache: Tensor
    qo_indptr: Tensor
    block_table: Tensor
    ctx_len: Tensor
    anc: Tensor
    sm_scale: float
    parents: list[list[int]]  # per request, length n_b (padding nodes: -1 at i > 0)

    def args(self) -> tuple:
        return (self.q, self.k_cache, self.v_cache, self.qo_indptr, self.block_table,
                self.ctx_len, self.anc, self.sm_scale)

    def to(self, device: str | torch.device) -> "Case":
        mv = lambda t: t.to(device)  # noqa: E731
        return Case(mv(self.q), mv(self.k_cache), mv(self.v_cache), mv(self.qo_indptr),
                    mv(self.block_table), mv(self.ctx_len), mv(self.anc), self.sm_scale,
                    self.parents)


def make_parents(kind: str, n: int, rng: random.Random, n_pad: int = 0) -> list[int]:
    """Parents of an n-node tree (node 0 = root) followed by n_pad padding nodes."""
    par = [-1]
    for i in range(1, n):
        if kind == "chain":
            par.append(i - 1)
        elif kind == "star":
            par.append(0)
        else:  # random, biased to recent nodes so trees get deep as well as wide
            par.append(rng.randrange(max(0, i - 6), i) if rng.random() < 0.7 else rng.randrange(i))
    return par + [-1] * n_pad


def make_case(
    hq: int, hkv: int, d: int, ctx: list[int], n: list[int], page: int, *, kind: str = "random",
    n_pad: list[int] | None = None, n_max: int | None = None, seed: int = 0,
    dtype: torch.dtype = torch.bfloat16, spare_pages: int = 3,
) -> Case:
    """Random paged case. Pages are shuffled across requests; unused cache slots hold NaN so a
    kernel that reads outside [0, ctx + n_b) fails loudly."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    bsz = len(ctx)
    n_pad = n_pad or [0] * bsz
    sizes = [n[b] + n_pad[b] for b in range(bsz)]
    n_max = n_max or max(sizes)
    parents = [make_parents(kind, n[b], rng, n_pad[b]) for b in range(bsz)]
    par_t = torch.full((bsz, n_max), -1, dtype=torch.int64)
    for b in range(bsz):
        par_t[b, : sizes[b]] = torch.tensor(parents[b])
    anc = ref.anc_from_parents(par_t, n_max)
    for b in range(bsz):  # nodes past the request's size are padding too
        anc[b, sizes[b]:] = 0
    lengths = [ctx[b] + sizes[b] for b in range(bsz)]
    pages_needed = [max(1, math.ceil(x / page)) for x in lengths]
    max_pages = max(pages_needed) + 1
    total = sum(pages_needed) + spare_pages
    perm = torch.randperm(total, generator=gen).tolist()
    block_table = torch.full((bsz, max_pages), -1, dtype=torch.int32)
    k_cache = torch.full((total, page, hkv, d), float("nan"), dtype=torch.float32)
    v_cache = torch.full((total, page, hkv, d), float("nan"), dtype=torch.float32)
    at = 0
    for b in range(bsz):
        for p in range(pages_needed[b]):
            block_table[b, p] = perm[at]
            at += 1
        slots = torch.arange(lengths[b])
        pg, off = block_table[b].long()[slots // page], slots % page
        k_cache[pg, off] = torch.randn(lengths[b], hkv, d, generator=gen)
        v_cache[pg, off] = torch.randn(lengths[b], hkv, d, generator=gen)
    t_total = sum(sizes)
    q = torch.randn(t_total, hq, d, generator=gen)
    indptr = torch.tensor([0] + list(torch.tensor(sizes).cumsum(0).tolist()), dtype=torch.int32)
    return Case(q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), indptr, block_table,
                torch.tensor(ctx, dtype=torch.int32), anc, 1.0 / math.sqrt(d), parents)


def naive_fp64(case: Case, chain: bool = False) -> tuple[Tensor, Tensor]:
    """Per-query fp64 attention that walks parent pointers (independent of the bitsets)."""
    hq, d = case.q.shape[1], case.q.shape[2]
    hkv = case.k_cache.shape[2]
    g = hq // hkv
    page = case.k_cache.shape[1]
    o = torch.zeros(case.q.shape, dtype=torch.float64)
    lse = torch.full(case.q.shape[:2], float("-inf"), dtype=torch.float64)
    indptr = case.qo_indptr.tolist()
    for b, par in enumerate(case.parents):
        c = int(case.ctx_len[b])
        for i in range(len(par)):
            if i > 0 and par[i] < 0:
                continue  # padding query
            path = list(range(i + 1)) if chain else []
            j = i
            while not chain and j >= 0:
                path.append(j)
                j = par[j]
            slots = list(range(c)) + [c + j for j in sorted(path)]
            keys = torch.stack([case.k_cache[int(case.block_table[b, s // page]), s % page]
                                for s in slots]).double()
            vals = torch.stack([case.v_cache[int(case.block_table[b, s // page]), s % page]
                                for s in slots]).double()
            t = indptr[b] + i
            for h in range(hq):
                s = keys[:, h // g] @ case.q[t, h].double() * case.sm_scale
                lse[t, h] = torch.logsumexp(s, 0)
                o[t, h] = torch.softmax(s, 0) @ vals[:, h // g]
    return o, lse


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("kind", ["random", "chain", "star"])
def test_reference_matches_per_query_fp64(page: int, kind: str) -> None:
    case = make_case(4, 2, 16, ctx=[5, 0, 70], n=[9, 4, 13], page=page, kind=kind,
                     n_pad=[0, 2, 1], seed=page * 7 + len(kind), dtype=torch.float32)
    o, lse = ref.tree_attention(*case.args())
    o_want, lse_want = naive_fp64(case)
    torch.testing.assert_close(o.double(), o_want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), lse_want, atol=1e-5, rtol=1e-5)


def test_float64_inputs_are_computed_in_float64() -> None:
    """An fp64 model (exact lossless tests) gets fp64 attention, equal to the per-query oracle to
    rounding, not to float32's 1e-5."""
    case = make_case(4, 2, 16, ctx=[5, 70], n=[9, 13], page=16, seed=3, dtype=torch.float64)
    o, lse = ref.tree_attention(*case.args())
    assert o.dtype == torch.float64 and lse.dtype == torch.float64
    o_want, lse_want = naive_fp64(case)
    torch.testing.assert_close(o, o_want, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse, lse_want, atol=1e-12, rtol=1e-12)


def test_padding_and_empty_context_rows() -> None:
    case = make_case(2, 1, 8, ctx=[0, 3], n=[1, 2], page=16, n_pad=[3, 1], seed=1,
                     dtype=torch.float32)
    o, lse = ref.tree_attention(*case.args())
    # request 0: root with ctx 0 sees only itself -> o == its own v, lse == its score
    v0 = case.v_cache[int(case.block_table[0, 0]), 0, 0]
    torch.testing.assert_close(o[0, 0], v0)
    pad_rows = [1, 2, 3, 6]
    assert torch.all(o[pad_rows] == 0)
    assert torch.all(torch.isneginf(lse[pad_rows]))
    assert torch.isfinite(lse[[0, 4, 5]]).all()


def test_chain_bitset_equals_causal_mode() -> None:
    case = make_case(8, 1, 32, ctx=[40, 7], n=[20, 33], page=16, kind="chain", seed=3,
                     dtype=torch.float32)
    o_a, lse_a = ref.tree_attention(*case.args())
    args = list(case.args())
    args[6] = None
    o_c, lse_c = ref.tree_attention(*args)
    torch.testing.assert_close(o_a, o_c, atol=0, rtol=0)
    torch.testing.assert_close(lse_a, lse_c, atol=0, rtol=0)


def test_non_ancestor_kv_does_not_matter() -> None:
    case = make_case(4, 2, 16, ctx=[10], n=[12], page=4, kind="random", seed=5,
                     dtype=torch.float32)
    o, _ = ref.tree_attention(*case.args())
    par = case.parents[0]
    i = 11
    anc_set = set()
    j = i
    while j >= 0:
        anc_set.add(j)
        j = par[j]
    others = [j for j in range(12) if j not in anc_set]
    assert others, "random tree must have non-ancestors of node 11"
    for j in others:
        s = 10 + j
        pg = int(case.block_table[0, s // 4])
        case.k_cache[pg, s % 4] += 3.0
        case.v_cache[pg, s % 4] -= 5.0
    o2, _ = ref.tree_attention(*case.args())
    torch.testing.assert_close(o2[i], o[i], atol=0, rtol=0)
    assert not torch.equal(o2, o)  # someone did see the changed keys


def test_page_size_does_not_change_result() -> None:
    base = make_case(4, 4, 16, ctx=[37, 5], n=[6, 17], page=1, seed=9, dtype=torch.float32)
    o1, lse1 = ref.tree_attention(*base.args())
    o16, lse16 = ref.tree_attention(*repage(base, 16).args())
    torch.testing.assert_close(o1, o16, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(lse1, lse16, atol=1e-6, rtol=1e-6)


def repage(case: Case, page: int) -> Case:
    """Same logical K/V with another page size (contiguous pages)."""
    hkv, d = case.k_cache.shape[2], case.k_cache.shape[3]
    old_page = case.k_cache.shape[1]
    bsz = case.block_table.shape[0]
    lengths = [int(case.ctx_len[b]) + int(case.qo_indptr[b + 1] - case.qo_indptr[b])
               for b in range(bsz)]
    max_pages = max(math.ceil(x / page) for x in lengths) + 1
    kc = torch.zeros(bsz * max_pages, page, hkv, d, dtype=case.k_cache.dtype)
    vc = torch.zeros_like(kc)
    bt = torch.arange(bsz * max_pages, dtype=torch.int32).view(bsz, max_pages)
    for b in range(bsz):
        for s in range(lengths[b]):
            src = int(case.block_table[b, s // old_page]), s % old_page
            kc[int(bt[b, s // page]), s % page] = case.k_cache[src]
            vc[int(bt[b, s // page]), s % page] = case.v_cache[src]
    return Case(case.q, kc, vc, case.qo_indptr, bt, case.ctx_len, case.anc, case.sm_scale,
                case.parents)


def test_bit_packing_roundtrip_uses_bit_31() -> None:
    bits = torch.rand(3, 70, generator=torch.Generator().manual_seed(0)) < 0.5
    bits[:, 31] = True
    words = ref.pack_bits(bits, 3)
    assert words.dtype == torch.int32 and (words[:, 0] < 0).all()
    assert torch.equal(ref.unpack_bits(words, 70), bits)


def test_anc_from_parents_rejects_forward_parent() -> None:
    with pytest.raises(ValueError, match="parent 2 of node 1"):
        ref.anc_from_parents(torch.tensor([[-1, 2, 0]]))
