"""Where the fixed cost of a split tree_attention call goes: one shape timed at several key-chunk sizes
(kv_chunk pinned, so the split count and tiles per CTA change), with the fa3 launch switches on and off.

Per-call µs are CUDA-graph medians (bench/_timing.graph_time, input sets rotated as in the main bench).
A line per chunk: splits, tiles per CTA, CTAs, then the time with the default launch, with the opt-in
cluster merge and without PDL. Fitting time = fixed + tiles x period over the one-wave rows separates
the per-call fixed cost from the per-tile period. Usage:
    python engine/bench/sweep_tree_attention_chunks.py [--hq 8 --hkv 1 --n 512 --ctx 4096]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ddtree_engine.ops import tree_attention  # noqa: E402
from ddtree_engine.reference import tree_attention as _ref_fn  # noqa: E402,F401

ref = sys.modules["ddtree_engine.reference.tree_attention"]
from _timing import graph_time, scoped_env  # noqa: E402
from bench_tree_attention import ddtree_like_parents  # noqa: E402

SWITCHES = {"default": {}, "cluster_merge": {"DDTREE_TA_CLUSTER_MERGE": "1"}, "no_pdl": {"DDTREE_TA_FA3_PDL": "0"}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hq", type=int, default=8)
    ap.add_argument("--hkv", type=int, default=1)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--chunks", default="0,4608,2304,1536,1152,768,512,256")
    ap.add_argument("--profile", action="store_true", help="also list kernel durations (torch.profiler / CUPTI) "
                    "of 20 planned calls per launch setting: kernel time vs the graph's per-call time")
    args = ap.parse_args()
    hq, hkv, n, ctx, d, page = args.hq, args.hkv, args.n, args.ctx, 128, 16
    gen = torch.Generator().manual_seed(hq * 1000 + n + ctx)
    anc = ref.anc_from_parents(torch.tensor([ddtree_like_parents(n, gen)])).cuda()
    length = ctx + n
    pages = math.ceil(length / page)
    sets = 4
    qs = [torch.randn(n, hq, d, dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
    kcs = [torch.randn(pages + 1, page, hkv, d, dtype=torch.bfloat16, device="cuda") for _ in range(sets)]
    vcs = [torch.randn_like(k) for k in kcs]
    bts = [torch.randperm(pages + 1, device="cuda")[:pages].to(torch.int32).view(1, -1) for _ in range(sets)]
    indptr = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    ctx_t = torch.tensor([ctx], dtype=torch.int32, device="cuda")
    rows = n * (hq // hkv)
    row_tiles = (rows + 127) // 128
    print(f"{hq}/{hkv} heads x {n} nodes x {ctx} context: {row_tiles} row tiles per kv head; {torch.cuda.get_device_name()}")
    print("| chunk | splits | tiles/CTA | CTAs | " + " | ".join(f"{s} µs" for s in SWITCHES) + " |")
    print("|---|---|---|---|" + "---|" * len(SWITCHES))
    for chunk in (int(c) for c in args.chunks.split(",")):
        i = [0]

        def call(chunk: int = chunk) -> object:
            i[0] = (i[0] + 1) % sets
            j = i[0]
            return tree_attention(qs[j], kcs[j], vcs[j], indptr, bts[j], ctx_t, anc, d ** -0.5, kv_chunk=chunk)

        times = []
        for env in SWITCHES.values():
            with scoped_env(env):
                times.append(graph_time(call) * 1e6)
        eff = chunk or 0
        if eff:
            eff = (eff + 127) // 128 * 128
            splits = math.ceil(pages * page / eff)
            tiles = eff // 128
        else:
            splits = tiles = 0
        ctas = row_tiles * hkv * splits if splits else 0
        print(f"| {chunk or 'plan'} | {splits or '-'} | {tiles or '-'} | {ctas or '-'} | "
              + " | ".join(f"{t:.1f}" for t in times) + " |", flush=True)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        for name, env in SWITCHES.items():
            with scoped_env(env):
                for _ in range(3):
                    tree_attention(qs[0], kcs[0], vcs[0], indptr, bts[0], ctx_t, anc, d ** -0.5)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for k in range(20):
                        j = k % sets
                        tree_attention(qs[j], kcs[j], vcs[j], indptr, bts[j], ctx_t, anc, d ** -0.5)
                    torch.cuda.synchronize()
            for ev in prof.key_averages():
                if ev.device_type is not None and "tree_attention" in ev.key and ev.count:
                    dev_us = getattr(ev, "device_time_total", getattr(ev, "cuda_time_total", 0.0)) / ev.count
                    print(f"profile {name}: {ev.key[:60]} x{ev.count}: {dev_us:.1f} us per launch", flush=True)


if __name__ == "__main__":
    main()
