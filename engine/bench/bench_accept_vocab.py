"""tree_accept at the Qwen3 vocabulary (V = 151,936), greedy, the end-to-end shapes (batch 1/8 x 17/65 nodes):
fp32 vs bf16 logits x the scoring loops (DDTREE_ACCEPT_SCORE unrolled / compact / packed, and packed with the
early PDL mode), one process, CUDA-graph replay medians over rotating input sets larger than L2. Floor: the
live nodes' logits read once at the copy rate measured here. Every variant's outputs are checked against the
reference before it is timed (session 10, issue #6). Session 13: --steer P raises, at each internal node with
probability P, one child's token in the node's row to the row's maximum, so walks go deep and some end on a leaf
(random logits end every walk at the root); the leaf variants read only the root's and internal nodes' rows.
Usage (GPU): PYTHONPATH=engine/python python3 engine/bench/bench_accept_vocab.py"""

from __future__ import annotations

import argparse

import torch

from _timing import copy_bandwidth, device_name, print_table, save_json, scoped_env, time_calls
from bench_tree_accept import DEPTH, make_tree

from ddtree_engine.ops import tree_accept  # noqa: E402
from ddtree_engine.reference import tree_accept as ref  # noqa: E402

V = 151936
SHAPES = [(1, 17), (1, 65), (8, 17), (8, 65)]
VARIANTS = {
    "unrolled": {"DDTREE_ACCEPT_SCORE": "unrolled", "DDTREE_ACCEPT_PDL": "0",
                 "DDTREE_ACCEPT_WIDE": "0", "DDTREE_ACCEPT_LEAF": "0"},  # session 9
    "compact": {"DDTREE_ACCEPT_SCORE": "compact", "DDTREE_ACCEPT_PDL": "0",
                "DDTREE_ACCEPT_WIDE": "0", "DDTREE_ACCEPT_LEAF": "0"},
    # session 10's default (fp32 rows: compact)
    "packed": {"DDTREE_ACCEPT_SCORE": "packed", "DDTREE_ACCEPT_PDL": "0",
               "DDTREE_ACCEPT_WIDE": "0", "DDTREE_ACCEPT_LEAF": "0"},
    "packed+pdl": {"DDTREE_ACCEPT_SCORE": "packed", "DDTREE_ACCEPT_PDL": "1",
                   "DDTREE_ACCEPT_WIDE": "0", "DDTREE_ACCEPT_LEAF": "0"},
    # session 11: bf16 chunks of 16,384 logits (fp32 rows: unchanged, their chunk is 32 KB already)
    "packed_wide": {"DDTREE_ACCEPT_SCORE": "packed", "DDTREE_ACCEPT_PDL": "0",
                    "DDTREE_ACCEPT_WIDE": "1", "DDTREE_ACCEPT_LEAF": "0"},
    "packed_wide+pdl": {"DDTREE_ACCEPT_SCORE": "packed", "DDTREE_ACCEPT_PDL": "1",
                        "DDTREE_ACCEPT_WIDE": "1", "DDTREE_ACCEPT_LEAF": "0"},
    # session 13: leaf mode (the default above V = 1024 since then)
    "leaf": {"DDTREE_ACCEPT_SCORE": "packed", "DDTREE_ACCEPT_PDL": "0", "DDTREE_ACCEPT_WIDE": "1",
             "DDTREE_ACCEPT_LEAF": "1"},
    "leaf_rows": {"DDTREE_ACCEPT_SCORE": "packed", "DDTREE_ACCEPT_PDL": "0", "DDTREE_ACCEPT_WIDE": "1",
                  "DDTREE_ACCEPT_LEAF": "2"},  # leaf mode, first pass without leaf CTAs (opt-in)
}


def steer(xs: list[torch.Tensor], tree: dict[str, torch.Tensor], p: float, gen: torch.Generator) -> None:
    """At each internal node, with probability p, one random child's token gets the row's largest logit (30)."""
    fc, ns, tok = (tree[k].cpu() for k in ("first_child", "next_sibling", "node_token"))
    bi, ri, ti = [], [], []
    for b in range(fc.shape[0]):
        for i in range(fc.shape[1]):
            kids, c = [], int(fc[b, i])
            while c != -1:
                kids.append(c)
                c = int(ns[b, c])
            if kids and float(torch.rand(1, generator=gen)) < p:
                pick = kids[int(torch.randint(0, len(kids), (1,), generator=gen))]
                bi.append(b), ri.append(i), ti.append(int(tok[b, pick]))
    for x in xs:
        x[bi, ri, ti] = 30.0


def leaf_share(tree: dict[str, torch.Tensor], out: object) -> str:
    fc = tree["first_child"]
    leaf = fc == -1
    leaf[:, 0] = False
    end = out.accept_nodes.gather(1, (out.accept_len.long() - 1)[:, None])  # type: ignore[attr-defined]
    return (f"leaf rows {int(leaf.sum())}/{leaf.numel()} ({float(leaf.float().mean()):.1%}), walks ending on a leaf "
            f"{int(leaf.gather(1, end.long()).sum())}/{fc.shape[0]}, mean accept_len "
            f"{float(out.accept_len.float().mean()):.2f}")  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                    help="the first is the ratio column's base")
    ap.add_argument("--shapes", nargs="+", default=[f"{b}x{n}" for b, n in SHAPES], help="B x N, e.g. 8x65")
    ap.add_argument("--once", action="store_true",
                    help="check each variant once against the reference and time nothing (a profiler's run)")
    ap.add_argument("--steer", type=float, default=0.0, help="see the module docstring (session 13)")
    a = ap.parse_args()
    dtypes = [torch.float32 if d == "fp32" else torch.bfloat16 for d in a.dtypes]
    bw = copy_bandwidth()
    print(f"{device_name()}: copy bandwidth {bw / 1e12:.2f} TB/s")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for batch, n in [tuple(int(v) for v in s.split("x")) for s in a.shapes]:
        tree = make_tree(batch, n, V, gen)
        args = {k: v for k, v in tree.items() if k != "parents"}
        common = dict(ctx_len=torch.full((batch,), 1000, dtype=torch.int32, device="cuda"),
                      temperature=torch.zeros(batch, device="cuda"),
                      seed=torch.arange(batch, dtype=torch.int64, device="cuda"),
                      stop_ids=torch.tensor([], dtype=torch.int32, device="cuda"), max_depth=DEPTH)
        for dtype in dtypes:
            nbytes = batch * n * V * (4 if dtype == torch.float32 else 2)
            sets = max(2, min(8, (256 << 20) // nbytes + 1))
            xs = [(torch.randn(batch, n, V, device="cuda") * 3).to(dtype) for _ in range(sets)]
            if a.steer > 0:
                steer(xs, tree, a.steer, gen)
            want = ref(xs[0], **args, **common)
            print(f"{batch}x{n} {dtype}: {leaf_share(tree, want)}")
            floor = nbytes / bw * 1e6
            times = {}
            for name in a.variants:
                env = VARIANTS[name]
                with scoped_env(env):
                    out = tree_accept(xs[0], **args, **common)
                    assert all(torch.equal(a, b) for a, b in zip(out, want)), f"{name} {dtype} != reference"
                    if a.once:
                        continue
                    times[name] = time_calls([lambda x=x: tree_accept(x, **args, **common) for x in xs])
            if a.once:
                continue
            base = times[a.variants[0]]
            for name, t in times.items():
                rows.append([f"{batch}x{n}", str(dtype).replace("torch.", ""), name, t, base / t, floor, t / floor])
            del xs
    print_table(f"tree_accept greedy at V = {V} (µs per call, median of graph replays)",
                ["B x N", "logits", "scoring", "µs", f"{a.variants[0]} / this", "floor µs", "x floor"], rows)
    save_json("bench_accept_vocab", {"device": device_name(), "copy_bw": bw, "rows": rows})


if __name__ == "__main__":
    main()
