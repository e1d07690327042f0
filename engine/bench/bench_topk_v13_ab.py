"""Same-process A/B of draft_topk_lse's default against DDTREE_TOPK_V4_OPT=<opt> (session 9: v13, the compact builds;
NOTES "v13 (session 9"). The launcher reads the variable at every call, so each side is captured into its own CUDA graph
in this process and timed in alternating passes (default, opt, default, opt, ...) against one torch f32 peer
(logits.float() -> topk -> logsumexp), with the main bench's method (graph-replay medians over rotating randn x 4 bf16
inputs larger than L2). Both sides' outputs are checked against the reference before they are timed.
Session 10: --var=NAME A/Bs another per-call switch, e.g. --var=DDTREE_TOPK_V4_LAUNCH --opt=pair (NOTES "v14").
Usage: python engine/bench/bench_topk_v13_ab.py [--opt=v13] [--var=DDTREE_TOPK_V4_OPT] [--passes=3]
    [--shapes=1x15x163840,8x15x163840] [--ks=1,16,32,64]"""

from __future__ import annotations

import statistics
import sys

import torch

from _timing import device_name, print_table, save_json
from bench_topk_rows_ab import check_sides, time_sides, time_torch_f32


def main() -> None:
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    opt = opts.get("opt", "v13")
    var = opts.get("var", "DDTREE_TOPK_V4_OPT")
    passes = int(opts.get("passes", "3"))
    shapes = [tuple(int(d) for d in sh.split("x")) for sh in opts.get("shapes", "1x15x163840,8x15x163840").split(",")]
    ks = [int(v) for v in opts.get("ks", "1,16,32,64").split(",")]
    print(f"{device_name()}: default vs {var}={opt}, {passes} alternating passes")
    sides = {"default": {}, opt: {var: opt}}
    rows = []
    for batch, positions, vocab in shapes:
        nbytes = batch * positions * vocab * 2
        sets = max(2, min(16, (96 << 20) // nbytes + 1))  # > L2 (60 MB) in total
        xs = [torch.randn(batch, positions, vocab, device="cuda").mul_(4).to(torch.bfloat16) for _ in range(sets)]
        for k in ks:
            check_sides(xs[0], k, sides, f"{batch}x{positions}x{vocab}")
            t_f32 = time_torch_f32(xs, k)
            times = time_sides(xs, k, sides, passes)
            a, b = statistics.median(times["default"]), statistics.median(times[opt])
            ratio = statistics.mean(o / d for o, d in zip(times[opt], times["default"]))
            rows.append([f"{batch}x{positions}x{vocab}", k, t_f32, a, b, ratio, t_f32 / a, t_f32 / b,
                         " ".join(f"{t:.2f}" for t in times["default"]), " ".join(f"{t:.2f}" for t in times[opt])])
        del xs
    print_table(f"draft_topk_lse default vs {opt} (bf16 logits; µs per call, medians of {passes} alternating passes)",
                ["B x L x V", "K", "torch f32", "default", opt, f"{opt}/default", "default x f32", f"{opt} x f32",
                 "default passes", f"{opt} passes"], rows)
    save_json(f"bench_topk_{opt}_ab", {"device": device_name(), "opt": opt, "passes": passes, "rows": rows})


if __name__ == "__main__":
    main()
