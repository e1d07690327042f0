"""Bench draft_topk_lse vs the PyTorch way (logits.float() -> topk -> logsumexp, and topk in bf16),
same process, CUDA-graph replays over rotating inputs, plus the byte floor (B*L*V*2 bytes read once at
the copy bandwidth measured here). Every library implementation is timed in the same table: "v2", "v3"
and "v4" (v3 and v4 apply to k <= 64; where a version resolves to another one the cell says "=v2" or
"=v3"); the speedups are of the default (what the library picks), against both torch columns. Every
configuration's kernel output is checked against the reference before it is timed. The default call is timed
itself (its own µs column): where it resolves to v4 it runs the small-row kernel ("small") for 256 < V <= 384
and k >= 16, or any V <= 1024 with DDTREE_TOPK_SMALL=1 (=0: v4; src/draft_topk_lse.cu).
Usage: python engine/bench/bench_draft_topk_lse.py [--quick] [--ks=1,16,32,64] [--shapes=1x15x163840,...]
    [--impls=v4]   (--quick: k = 1, 16 only; --impls: the versions timed besides the default, which is always
    timed; the others' cells say "-")"""

from __future__ import annotations

import os
import sys

import torch

from _timing import copy_bandwidth, device_name, print_table, save_json, time_calls

from ddtree_engine.ops.draft_topk_lse import draft_topk_lse_impl, resolved_impl  # noqa: E402
from ddtree_engine.reference import draft_topk_lse as ref  # noqa: E402


def main() -> None:
    quick = "--quick" in sys.argv
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    bw = copy_bandwidth()
    print(f"{device_name()}: copy bandwidth {bw / 1e12:.2f} TB/s")
    shapes = [(1, 15, 163840), (1, 15, 151936), (8, 15, 163840)]
    if quick:
        shapes = [(1, 15, 163840), (8, 15, 163840)]
    ks = [1, 16, 32, 64, 1024] if not quick else [1, 16]
    if "ks" in opts:
        ks = [int(v) for v in opts["ks"].split(",")]
    if "shapes" in opts:
        shapes = [tuple(int(d) for d in sh.split("x")) for sh in opts["shapes"].split(",")]  # type: ignore[misc]
    timed = opts["impls"].split(",") if "impls" in opts else ["v2", "v3", "v4"]
    rows = []
    for batch, positions, vocab in shapes:
        nbytes = batch * positions * vocab * 2
        sets = max(2, min(16, (96 << 20) // nbytes + 1))  # > L2 (60 MB) in total
        xs = [torch.randn(batch, positions, vocab, device="cuda").mul_(4).to(torch.bfloat16) for _ in range(sets)]
        for k in ks:
            wlp, wids, wlse = ref(xs[0], k)
            times = {}
            cells: dict[str, object] = {}
            default = resolved_impl(k)
            for impl in ("v2", "v3", "v4"):
                runs = resolved_impl(k, impl)
                if runs != impl:
                    cells[impl] = f"={runs}"
                    continue
                if impl not in timed and impl != default:
                    cells[impl] = "-"
                    continue
                lp, ids, lse = draft_topk_lse_impl(xs[0], k, impl)
                ok = torch.equal(ids, wids) and torch.allclose(lp, wlp, atol=4e-6, rtol=0)
                assert ok, f"{impl} kernel != reference at {batch}x{positions}x{vocab} k={k}"
                times[impl] = time_calls([lambda x=x, i=impl: draft_topk_lse_impl(x, k, i) for x in xs])
                cells[impl] = times[impl]
            # The default call itself (the small-row kernel instead of v4 where the library picks it).
            lp, ids, lse = draft_topk_lse_impl(xs[0], k, "default")
            ok = torch.equal(ids, wids) and torch.allclose(lp, wlp, atol=4e-6, rtol=0)
            assert ok, f"default kernel != reference at {batch}x{positions}x{vocab} k={k}"
            ours = time_calls([lambda x=x: draft_topk_lse_impl(x, k, "default") for x in xs])
            small = os.environ.get("DDTREE_TOPK_SMALL")
            if vocab <= 1024 and default == "v4" and (small == "1" or (small != "0" and 256 < vocab <= 384
                                                                        and k >= 16)):
                default = "small"

            def torch_f32(x: torch.Tensor) -> None:
                xf = x.float()
                v, i = torch.topk(xf, k, dim=-1)
                v - torch.logsumexp(xf, dim=-1, keepdim=True)

            def torch_bf16(x: torch.Tensor) -> None:
                v, i = torch.topk(x, k, dim=-1)
                v.float() - torch.logsumexp(x.float(), dim=-1, keepdim=True)

            t_f32 = time_calls([lambda x=x: torch_f32(x) for x in xs])
            t_bf16 = time_calls([lambda x=x: torch_bf16(x) for x in xs])
            floor = nbytes / bw * 1e6
            rows.append([f"{batch}x{positions}x{vocab}", k, t_f32, t_bf16, cells["v2"], cells["v3"], cells["v4"],
                         default, ours, t_f32 / ours, t_bf16 / ours, floor, ours / floor])
        del xs
    pdl_off = os.environ.get("DDTREE_DISABLE_PDL", "0") not in ("", "0")
    print_table("draft_topk_lse (bf16 logits; µs per call, median of graph replays"
                + (", DDTREE_DISABLE_PDL=1)" if pdl_off else ")"),
                ["B x L x V", "K", "torch f32", "torch bf16", "v2", "v3", "v4", "default", "µs", "x f32", "x bf16",
                 "floor", "default/floor"],
                rows)
    save_json("bench_draft_topk_lse" + ("_nopdl" if pdl_off else ""),
              {"device": device_name(), "copy_bw": bw, "pdl": not pdl_off, "rows": rows})


if __name__ == "__main__":
    main()
