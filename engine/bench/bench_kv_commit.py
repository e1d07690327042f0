"""Bench kv_commit (all layers, one launch) vs the PyTorch way (per layer and per K/V: gather the accepted
rows with advanced indexing, then write them back), same process, CUDA-graph replays over rotating
ctx offsets. Floor: the moved rows read once and written once at the copy bandwidth measured here.
Outputs are checked against the reference before timing. Usage: python engine/bench/bench_kv_commit.py"""

from __future__ import annotations

import torch

from _timing import copy_bandwidth, device_name, print_table, save_json, time_calls

from ddtree_engine.ops import kv_commit  # noqa: E402
from ddtree_engine.reference import kv_commit as ref  # noqa: E402


def main() -> None:
    bw = copy_bandwidth()
    print(f"{device_name()}: copy bandwidth {bw / 1e12:.2f} TB/s")
    rows = []
    # (layers, batch, kv heads, head dim, page size, accepted nodes): Kimi-like depth, Qwen3-like GQA.
    for layers, batch, heads, dim, page, n_acc in ((61, 1, 8, 128, 16, 8), (61, 8, 8, 128, 16, 12),
                                                  (48, 1, 4, 128, 64, 16)):
        max_pages = 4096 // page
        num_pages = batch * max_pages
        k = [torch.randn(num_pages, page, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        v = [torch.randn(num_pages, page, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(layers)]
        table = torch.randperm(num_pages, device="cuda").to(torch.int32).reshape(batch, max_pages)
        nodes = torch.full((batch, 16), -1, dtype=torch.int32, device="cuda")
        nodes[:, :n_acc] = torch.tensor([0] + [3 * i + 1 for i in range(1, n_acc)], dtype=torch.int32)
        lens = torch.full((batch,), n_acc, dtype=torch.int32, device="cuda")
        zero = torch.zeros(batch, dtype=torch.int32, device="cuda")
        # Correctness on clones first.
        k2, v2 = [t.clone() for t in k], [t.clone() for t in v]
        c1, c2 = zero.clone() + 100, zero.clone() + 100
        kv_commit(k, v, table, nodes, lens, c1)
        ref(k2, v2, table, nodes, lens, c2)
        assert all(torch.equal(a, b) for a, b in zip(k + v, k2 + v2)) and torch.equal(c1, c2), "kernel != reference"
        del k2, v2
        # Rotating offsets: each call in the graph commits for its own ctx tensor; the kernel advances ctx
        # on every replay (that is its job), the torch way keeps its offsets fixed.
        ctxs = [zero.clone() + 200 * i for i in range(8)]
        ctx_fixed = [c.clone() for c in ctxs]

        def torch_way(i: int) -> None:
            ctx = ctx_fixed[i]
            src = ctx[:, None] + nodes[:, :n_acc]
            dst = ctx[:, None] + torch.arange(n_acc, device="cuda")
            sp, so = table.gather(1, (src // page).long()).long(), src % page
            dp, do = table.gather(1, (dst // page).long()).long(), dst % page
            for cache in k + v:
                cache[dp, do] = cache[sp, so]

        t_kernel = time_calls([lambda i=i: kv_commit(k, v, table, nodes, lens, ctxs[i]) for i in range(8)])
        t_torch = time_calls([lambda i=i: torch_way(i) for i in range(8)])
        moved = batch * (n_acc - 1) * heads * dim * 2 * 2 * layers  # rows that move, K and V
        floor = 2 * moved / bw * 1e6
        rows.append([f"{layers}L B{batch} {heads}x{dim} p{page} n{n_acc}", t_torch, t_kernel, t_torch / t_kernel, floor,
                     t_kernel / floor])
        del k, v
    print_table("kv_commit (bf16 caches; µs per call, median of graph replays; ddtree = one launch)",
                ["case", "torch per-layer", "ddtree", "speedup", "floor", "ddtree/floor"], rows)
    save_json("bench_kv_commit", {"device": device_name(), "copy_bw": bw, "rows": rows})


if __name__ == "__main__":
    main()
