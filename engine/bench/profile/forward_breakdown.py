"""Where one target forward's time goes: the fast path's forward_tree captured as a CUDA graph, replayed under
CUPTI, its kernels grouped by kind (GEMM, tree attention, norm, elementwise / RoPE, K/V writes, ...), with
the idle time between kernels, against the weight-byte floor measured in the same process.

    PYTHONPATH=engine/python python3 engine/bench/profile/forward_breakdown.py --preset qwen3-0.6b [--shapes 1x1 1x17 8x65]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

here = Path(__file__).resolve()
sys.path.insert(0, str(here.parents[2] / "python"))
sys.path.insert(0, str(here.parents[1]))

from bench_e2e import _graph, add_model_args, build_model  # noqa: E402
from _timing import copy_bandwidth  # noqa: E402
from ddtree_engine.backend import default_backend  # noqa: E402
from ddtree_engine.decode import chain_anc  # noqa: E402
from ddtree_engine.paged_kv import PagedKVCache  # noqa: E402

KINDS = (("attention", ("tree_attention", "fa3")), ("gemm", ("gemm", "cutlass", "xmma", "nvjet", "sm90_", "cublas")),
         ("norm", ("norm",)), ("kv write", ("index_copy", "indexFuncLarge", "index_put")),
         ("copy / cast", ("copy", "direct_copy")), ("cat", ("CatArray", "cat_")), ("flip", ("flip",)),
         ("elementwise", ("elementwise", "vectorized", "unrolled")))


def kind_of(name: str) -> str:
    for kind, keys in KINDS:
        if any(k in name for k in keys):
            return kind
    return "other"


def main() -> None:
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    ap.add_argument("--shapes", nargs="+", default=["1x1", "1x17", "1x65", "8x17", "8x65"],
                    help="BxN: requests x tree nodes per request")
    ap.add_argument("--context", type=int, default=128, help="committed tokens per request before the tree")
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    model, _ = build_model(args, "cuda")
    cfg = model.cfg
    be = default_backend("cuda")
    bw = copy_bandwidth(1 << 30)
    floor = model.fast_weight_bytes() / bw * 1e6
    print(f"model: {cfg} act {model.act_dtype}\nweight bytes {model.fast_weight_bytes() / 1e6:,.1f} MB, copy "
          f"{bw / 1e12:.2f} TB/s -> floor {floor:.1f} us")
    for shape in args.shapes:
        B, N = map(int, shape.split("x"))
        cache = PagedKVCache(n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, slots=B,
                             max_slot_tokens=args.context + N, dtype=torch.bfloat16, device="cuda")
        tokens = torch.randint(0, cfg.vocab_size, (B, N), device="cuda", dtype=torch.int32)
        ctx = torch.full((B,), args.context, device="cuda", dtype=torch.int32)
        pos = (ctx[:, None] + torch.arange(N, device="cuda", dtype=torch.int32)[None]).contiguous()
        anc = chain_anc(N, "cuda").expand(B, -1, -1).contiguous()

        def fwd() -> None:
            model.forward_tree(be, cache.k, cache.v, cache.block_table, tokens, pos, ctx, anc)

        g = _graph(fwd)
        torch.cuda.synchronize()
        for _ in range(3):
            g.replay()  # type: ignore[attr-defined]
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(args.reps):
                g.replay()  # type: ignore[attr-defined]
            torch.cuda.synchronize()
        recs = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in e.name
                       and "Memset" not in e.name), key=lambda r: r[1])
        per = len(recs) // args.reps
        spans, busy, count, idle = [], defaultdict(list), defaultdict(int), []
        for r in range(args.reps):
            rnd = recs[r * per : (r + 1) * per]
            spans.append(rnd[-1][2] - rnd[0][1])
            b: dict[str, float] = defaultdict(float)
            for i, (name, t0, t1) in enumerate(rnd):
                b[kind_of(name)] += t1 - t0
                if r == 0:
                    count[kind_of(name)] += 1
            for k in count:
                busy[k].append(b[k])
            idle.append(sum(max(0.0, rnd[i][1] - rnd[i - 1][2]) for i in range(1, len(rnd))))
        med = statistics.median
        span = med(spans)
        print(f"\nB {B} x N {N} (context {args.context}): {per} kernels, span {span:.1f} us = {span / floor:.2f}x the "
              f"byte floor; idle between kernels {med(idle):.1f} us")
        for k in sorted(count, key=lambda k: -med(busy[k])):
            print(f"  {k:12s} {count[k]:4d} kernels  busy {med(busy[k]):8.1f} us  ({med(busy[k]) / count[k]:6.2f} us each)")
        del g, cache


if __name__ == "__main__":
    main()
