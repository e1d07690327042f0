"""Drive one engine op on fixed inputs so Nsight Compute (ncu) can profile its kernels.

Each case runs the op `--reps` times (warm-up included) on the same inputs; ncu picks the launches
with --launch-skip/--launch-count. No timing here: ncu reports the kernel durations and counters.
Usage: python profile_ops.py CASE [--reps N]
Cases: topk1 topk16 (1 x 15 x 163840 bf16, v3), topk1v4 topk16v4 (the same on v4), tree256 (build_tree M=256 K=64 B=1),
       ta8x512 ta64x512 (tree_attention 8/1 and 64/8 heads, 512 nodes, 4k context), ta64x512x64k (64k context).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

here = Path(__file__).resolve()
sys.path.insert(0, str(here.parents[2] / "python"))
sys.path.insert(0, str(here.parents[1]))


def topk(k: int, impl: str = "v3"):
    from ddtree_engine.ops.draft_topk_lse import draft_topk_lse_impl
    x = torch.randn(1, 15, 163840, device="cuda").mul_(4).to(torch.bfloat16)
    return lambda: draft_topk_lse_impl(x, k, impl)


def tree(m: int, k: int):
    from ddtree_engine.ops.build_tree import build_tree
    from bench_build_tree import draft_lp
    lp = draft_lp(1, k, 4.0, seed=7)
    ids = torch.randint(0, 32000, (1, 15, k), dtype=torch.int32, device="cuda")
    root = torch.zeros(1, dtype=torch.int32, device="cuda")
    ctx = torch.full((1,), 4096, dtype=torch.int32, device="cuda")
    budget = torch.full((1,), m, dtype=torch.int32, device="cuda")
    return lambda: build_tree(lp, ids, root, ctx, budget, m + 1)


def attention(hq: int, hkv: int, n: int, ctx: int):
    import math
    from ddtree_engine.ops.tree_attention import tree_attention
    import importlib
    ref = importlib.import_module("ddtree_engine.reference.tree_attention")
    from bench_tree_attention import ddtree_like_parents
    gen = torch.Generator().manual_seed(1)
    anc = ref.anc_from_parents(torch.tensor([ddtree_like_parents(n, gen)])).cuda()
    page, d = 16, 128
    pages = math.ceil((ctx + n) / page)
    q = torch.randn(n, hq, d, dtype=torch.bfloat16, device="cuda")
    kc = torch.randn(pages, page, hkv, d, dtype=torch.bfloat16, device="cuda")
    vc = torch.randn_like(kc)
    bt = torch.arange(pages, dtype=torch.int32, device="cuda").view(1, -1)
    indptr = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    ctx_t = torch.tensor([ctx], dtype=torch.int32, device="cuda")
    return lambda: tree_attention(q, kc, vc, indptr, bt, ctx_t, anc, 1 / math.sqrt(d))


CASES = {
    "topk1": lambda: topk(1), "topk16": lambda: topk(16), "tree256": lambda: tree(256, 64),
    "topk1v4": lambda: topk(1, "v4"), "topk16v4": lambda: topk(16, "v4"),
    "ta8x512": lambda: attention(8, 1, 512, 4096), "ta64x512": lambda: attention(64, 8, 512, 4096),
    "ta64x512x64k": lambda: attention(64, 8, 512, 65536),
}

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--reps", type=int, default=8)
    a = ap.parse_args()
    fn = CASES[a.case]()
    for _ in range(a.reps):
        fn()
    torch.cuda.synchronize()
    print(a.case, "done")
