"""One draft_topk_lse call per side at B x L x V (default 8x15x163,840, bf16 randn x 4), for an Nsight Compute run of
exactly those launches (session 13, s13topk; NOTES "v17 (session 13"): each side's per-call switches (DDTREE_TOPK_V4_*,
as bench_topk_rows_ab.py's --sides) around one call, after one untimed warm-up call per side that ncu skips.
Usage: ncu --launch-skip N_SIDES_x_KS ... python engine/bench/profile/topk_rows_ncu.py [--shape=8x15x163840]
    [--ks=16,64] [--sides=c2:CLUSTER=2,c1solo:CLUSTER=1/LAUNCH=solo]
(the warm-up calls come first, one per (k, side), so --launch-skip = len(ks) x (1 + number of sides)); the launches
ncu then profiles are in the order printed."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _timing import scoped_env  # noqa: E402
from bench_topk_rows_ab import parse_sides  # noqa: E402

from ddtree_engine.ops.draft_topk_lse import draft_topk_lse_impl  # noqa: E402


def main() -> None:
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    batch, positions, vocab = (int(d) for d in opts.get("shape", "8x15x163840").split("x"))
    ks = [int(v) for v in opts.get("ks", "16,64").split(",")]
    sides = parse_sides(opts.get("sides", "c2:CLUSTER=2,c1solo:CLUSTER=1/LAUNCH=solo"))
    x = torch.randn(batch, positions, vocab, device="cuda").mul_(4).to(torch.bfloat16)
    for k in ks:  # warm-up (skipped by ncu)
        for env in sides.values():
            with scoped_env(env):
                draft_topk_lse_impl(x, k, "default")
    torch.cuda.synchronize()
    for k in ks:
        for name, env in sides.items():
            print(f"profiled launch: k={k} side={name} {env}", flush=True)
            with scoped_env(env):
                draft_topk_lse_impl(x, k, "default")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
