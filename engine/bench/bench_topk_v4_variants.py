"""Sweep of draft_topk_lse v4's CTA size, largest cluster and exchange (DDTREE_TOPK_V4_CONFIG="threads,cluster[,async]",
read once per process, so each shape runs in its own child process; cluster 0 = the library's choice by row
count; async 1 = st.async exchange, 0 = closing cluster barrier), on 1x15x163840 bf16 at K = 1, 16 and
8x15x163840 at K = 1, 16, 32, 64. Same timing as the main bench (CUDA-graph replay medians over rotating
inputs); every child checks its output against the reference before timing. "default" runs without the
variable (the library default: 512 threads, st.async, cluster by row count).
Usage: python engine/bench/bench_topk_v4_variants.py [threads,cluster[,async] | default ...]"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CASES = [(1, 15, 163840, 1), (1, 15, 163840, 16), (8, 15, 163840, 1), (8, 15, 163840, 16), (8, 15, 163840, 32),
         (8, 15, 163840, 64)]
DEFAULT_CONFIGS = ["default", "512,8,1", "512,4,1", "512,8,0", "512,4,0"]


def child() -> None:
    import torch

    from _timing import time_calls

    from ddtree_engine.ops.draft_topk_lse import draft_topk_lse_impl, resolved_impl
    from ddtree_engine.reference import draft_topk_lse as ref

    out = {}
    for batch, positions, vocab, k in CASES:
        assert resolved_impl(k, "v4") == "v4"
        nbytes = batch * positions * vocab * 2
        sets = max(2, min(16, (96 << 20) // nbytes + 1))
        xs = [torch.randn(batch, positions, vocab, device="cuda").mul_(4).to(torch.bfloat16) for _ in range(sets)]
        wlp, wids, _ = ref(xs[0], k)
        lp, ids, _ = draft_topk_lse_impl(xs[0], k, "v4")
        assert torch.equal(ids, wids) and torch.allclose(lp, wlp, atol=4e-6, rtol=0), "v4 != reference"
        out[f"{batch}x{positions}x{vocab} K={k}"] = time_calls([lambda x=x: draft_topk_lse_impl(x, k, "v4")
                                                                 for x in xs])
        del xs
    print("RESULT " + json.dumps(out))


def main() -> None:
    configs = [a for a in sys.argv[1:] if "," in a or a == "default"] or DEFAULT_CONFIGS
    results = {}
    for cfg in configs:
        env = dict(os.environ, DDTREE_V4_SWEEP_CHILD="1")
        env.pop("DDTREE_TOPK_V4_CONFIG", None)
        if cfg != "default":
            env["DDTREE_TOPK_V4_CONFIG"] = cfg
        proc = subprocess.run([sys.executable, __file__], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=120)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(f"{cfg}: failed (rc {proc.returncode})\n{proc.stdout[-1500:]}")
            continue
        results[cfg] = json.loads(line[len("RESULT "):])
    if not results:
        return
    cases = list(next(iter(results.values())))
    print("\ndraft_topk_lse v4 shapes (threads,cluster): µs per call, median of graph replays")
    print(f"{'config':>16} " + " ".join(f"{c:>24}" for c in cases))
    for cfg, row in results.items():
        print(f"{cfg:>16} " + " ".join(f"{row[c]:24.2f}" for c in cases))
    out = os.environ.get("DDTREE_BENCH_OUT")
    if out:
        with open(os.path.join(out, "bench_topk_v4_variants.json"), "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    if os.environ.get("DDTREE_V4_SWEEP_CHILD") == "1":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        child()
    else:
        main()
