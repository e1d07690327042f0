"""How much of bench_draft_topk_lse.py's per-call figure is a fixed cost per CUDA graph (session 10, NOTES "v14 (session
10"). time_calls captures one call per input set (16 sets at 1x15 x 163,840) into one graph and divides the replay's
event time by 16, so the graph's launch and first-node start (paid once per replay) lands on every call as 1/16 of it.
Here the same calls are captured 1x, 2x and 4x over the same 16 input sets (16 / 32 / 64 calls per graph) for the
library default and the torch f32 peer, in one process, alternating, three passes; the slope between lengths is the
steady-state period and (t16 - t64) * 16 / (1 - 16/64) estimates the per-graph cost.
Usage: python engine/bench/bench_topk_graph_len.py [--ks=1,16,32,64] [--passes=3]"""

from __future__ import annotations

import statistics
import sys

import torch

from _timing import device_name, print_table, save_json, time_calls

from ddtree_engine.ops.draft_topk_lse import draft_topk_lse_impl  # noqa: E402
from ddtree_engine.reference import draft_topk_lse as ref  # noqa: E402


def main() -> None:
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    ks = [int(v) for v in opts.get("ks", "1,16,32,64").split(",")]
    passes = int(opts.get("passes", "3"))
    batch, positions, vocab = 1, 15, 163840
    sets = max(2, min(16, (96 << 20) // (batch * positions * vocab * 2) + 1))
    xs = [torch.randn(batch, positions, vocab, device="cuda").mul_(4).to(torch.bfloat16) for _ in range(sets)]
    print(f"{device_name()}: {sets} input sets, graphs of {sets} / {2 * sets} / {4 * sets} calls")
    rows = []
    for k in ks:
        wlp, wids, wlse = ref(xs[0], k)
        lp, ids, lse = draft_topk_lse_impl(xs[0], k, "default")
        assert torch.equal(ids, wids) and torch.allclose(lp, wlp, atol=4e-6, rtol=0), f"default != reference, k={k}"

        def torch_f32(x: torch.Tensor) -> None:
            xf = x.float()
            v, _ = torch.topk(xf, k, dim=-1)
            v - torch.logsumexp(xf, dim=-1, keepdim=True)

        ours: dict[int, list[float]] = {1: [], 2: [], 4: []}
        peer: dict[int, list[float]] = {1: [], 4: []}
        for _ in range(passes):
            for rep in (1, 2, 4):
                ours[rep].append(time_calls([lambda x=x: draft_topk_lse_impl(x, k, "default") for x in xs] * rep))
            for rep in (1, 4):
                peer[rep].append(time_calls([lambda x=x: torch_f32(x) for x in xs] * rep))
        o = {r: statistics.median(v) for r, v in ours.items()}
        p = {r: statistics.median(v) for r, v in peer.items()}
        per_graph = (o[1] - o[4]) * sets / (1 - 1 / 4)
        rows.append([f"{batch}x{positions}x{vocab}", k, p[1], p[4], o[1], o[2], o[4], per_graph, p[1] / o[1],
                     p[4] / o[4], " ".join(f"{t:.2f}" for t in ours[1]), " ".join(f"{t:.2f}" for t in ours[4])])
    print_table(f"draft_topk_lse default, µs per call by calls per graph (medians of {passes} passes)",
                ["B x L x V", "K", f"f32 x{sets}", f"f32 x{4 * sets}", f"ours x{sets}", f"ours x{2 * sets}",
                 f"ours x{4 * sets}", "per-graph µs", f"x f32 ({sets})", f"x f32 ({4 * sets})", f"passes x{sets}",
                 f"passes x{4 * sets}"], rows)
    save_json("bench_topk_graph_len", {"device": device_name(), "rows": rows})


if __name__ == "__main__":
    main()
