"""Bench tree_accept vs the PyTorch way: argmax over the node logits (greedy) or Gumbel-max with
torch.rand (sampled), then a device-side walk in torch ops (no host sync), same process, CUDA-graph
replays over rotating inputs. Floor: the live nodes' logits read once (n*V*2 bytes) at the copy bandwidth
measured here. Outputs are checked against the reference before timing.
Usage: python engine/bench/bench_tree_accept.py [--quick]"""

from __future__ import annotations

import sys

import torch

from _timing import copy_bandwidth, device_name, print_table, save_json, time_calls

from ddtree_engine.ops import tree_accept  # noqa: E402
from ddtree_engine.reference import tree_accept as ref  # noqa: E402

DEPTH = 15


def make_tree(batch: int, n: int, vocab: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A random tree in pop order (parent < child) of n nodes per request, depth <= DEPTH."""
    tokens = torch.randint(0, vocab, (batch, n), generator=gen, dtype=torch.int32)
    parents = torch.full((batch, n), -1, dtype=torch.int64)
    depth = torch.zeros(batch, n, dtype=torch.int64)
    first = torch.full((batch, n), -1, dtype=torch.int32)
    nxt = torch.full((batch, n), -1, dtype=torch.int32)
    for b in range(batch):
        last: dict[int, int] = {}
        for i in range(1, n):
            # A parent among the last 8 nodes when one is shallow enough, else among all such nodes
            # (the root always qualifies), so trees are deep but never exceed DEPTH.
            recent = [q for q in range(max(0, i - 8), i) if depth[b, q] < DEPTH]
            pool = recent or [q for q in range(i) if depth[b, q] < DEPTH]
            p = pool[int(torch.randint(0, len(pool), (1,), generator=gen))]
            parents[b, i], depth[b, i] = p, depth[b, p] + 1
            if p in last:
                nxt[b, last[p]] = i
            else:
                first[b, p] = i
            last[p] = i
    return dict(node_token=tokens.cuda(), first_child=first.cuda(), next_sibling=nxt.cuda(),
                num_nodes=torch.full((batch,), n, dtype=torch.int32).cuda(), parents=parents.cuda())


def torch_accept(logits: torch.Tensor, tree: dict[str, torch.Tensor], temp: float) -> torch.Tensor:
    x = logits.float()
    if temp > 0:
        targets = torch.argmax(x / temp - torch.log(-torch.log(torch.rand_like(x))), dim=-1)
    else:
        targets = torch.argmax(x, dim=-1)
    batch = targets.shape[0]
    parents, tokens = tree["parents"], tree["node_token"].long()
    cur = torch.zeros(batch, dtype=torch.int64, device=x.device)
    alive = torch.ones(batch, dtype=torch.bool, device=x.device)
    path = [cur]
    for _ in range(DEPTH):
        want = targets.gather(1, cur[:, None])
        match = (parents == cur[:, None]) & (tokens == want) & alive[:, None]
        alive = match.any(dim=1)
        cur = torch.where(alive, match.int().argmax(dim=1), cur)
        path.append(cur)
    return torch.stack(path, dim=1)


def main() -> None:
    quick = "--quick" in sys.argv
    bw = copy_bandwidth()
    print(f"{device_name()}: copy bandwidth {bw / 1e12:.2f} TB/s")
    gen = torch.Generator().manual_seed(0)
    rows = []
    configs = [(1, 64, 163840), (1, 512, 163840), (8, 64, 151936)] if not quick else [(1, 64, 163840)]
    for batch, n, vocab in configs:
        tree = make_tree(batch, n, vocab, gen)
        nbytes = batch * n * vocab * 2
        sets = max(2, min(8, (128 << 20) // nbytes + 1))
        xs = [torch.randn(batch, n, vocab, device="cuda").mul_(3).to(torch.bfloat16) for _ in range(sets)]
        args = {k: v for k, v in tree.items() if k != "parents"}
        ctx = torch.full((batch,), 1000, dtype=torch.int32, device="cuda")
        seed = torch.arange(batch, dtype=torch.int64, device="cuda")
        stops = torch.tensor([], dtype=torch.int32, device="cuda")
        for temp in (0.0, 0.8):
            temps = torch.full((batch,), temp, device="cuda")
            out = tree_accept(xs[0], **args, ctx_len=ctx, temperature=temps, seed=seed, stop_ids=stops, max_depth=DEPTH)
            want = ref(xs[0], **args, ctx_len=ctx, temperature=temps, seed=seed, stop_ids=stops, max_depth=DEPTH)
            assert all(torch.equal(a, b) for a, b in zip(out, want)), "kernel != reference"
            ours = time_calls([lambda x=x: tree_accept(x, **args, ctx_len=ctx, temperature=temps, seed=seed,
                                                       stop_ids=stops, max_depth=DEPTH) for x in xs])
            theirs = time_calls([lambda x=x: torch_accept(x, tree, temp) for x in xs])
            argmax_only = time_calls([lambda x=x: torch.argmax(x, dim=-1) for x in xs]) if temp == 0 else float("nan")
            floor = nbytes / bw * 1e6
            rows.append([f"{batch}x{n}x{vocab}", "greedy" if temp == 0 else f"T={temp}", theirs, argmax_only, ours,
                         theirs / ours, floor, ours / floor])
        del xs
    print_table("tree_accept (bf16 logits; µs per call, median of graph replays)",
                ["B x N x V", "mode", "torch walk", "torch argmax", "ddtree", "speedup", "floor", "ddtree/floor"], rows)
    save_json("bench_tree_accept", {"device": device_name(), "copy_bw": bw, "rows": rows})


if __name__ == "__main__":
    main()
