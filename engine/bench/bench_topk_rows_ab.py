"""Same-process A/B of draft_topk_lse's default against several per-call launch settings at many rows (session 13,
s13topk; NOTES "v17 (session 13"): the cluster size (DDTREE_TOPK_V4_CLUSTER), the launch mode (DDTREE_TOPK_V4_LAUNCH)
and the option set (DDTREE_TOPK_V4_OPT), each read by the launcher at every call, so each side is captured into its
own CUDA graph in this process and timed in alternating passes against one torch f32 peer (logits.float() -> topk ->
logsumexp), with the main bench's method (time_calls: lm_head warm-up, fenced replays, rotating randn x 4 bf16 inputs
larger than L2). Every side's outputs are checked against the reference (ids equal, log-probs and lse within 4e-6)
before it is timed.
Usage: python engine/bench/bench_topk_rows_ab.py [--passes=3] [--shapes=8x15x163840,8x15x151936] [--ks=1,16,32,64]
    [--sides=c2:CLUSTER=2,c1solo:CLUSTER=1/LAUNCH=solo]   (NAME:VAR=VAL/VAR=VAL; VAR short for DDTREE_TOPK_V4_VAR)
A shape may carry its own sides after '@' ('1x15x163840@' = the default alone, '8x15x151936f@c4' = fp32 logits, the
default and side c4)."""

from __future__ import annotations

import statistics
import sys

import torch

from _timing import device_name, print_table, save_json, scoped_env, time_calls

from ddtree_engine.ops.draft_topk_lse import draft_topk_lse_impl  # noqa: E402
from ddtree_engine.reference import draft_topk_lse as ref  # noqa: E402


def parse_sides(text: str) -> dict[str, dict[str, str]]:
    sides: dict[str, dict[str, str]] = {"default": {}}
    for item in filter(None, text.split(",")):
        name, _, assigns = item.partition(":")
        env = {}
        for a in filter(None, assigns.split("/")):
            var, _, val = a.partition("=")
            env[var if var.startswith("DDTREE_") else f"DDTREE_TOPK_V4_{var}"] = val
        sides[name] = env
    return sides


def check_sides(x: torch.Tensor, k: int, sides: dict[str, dict[str, str]], label: str) -> None:
    """Every side's default call on x equals the reference (ids, log-probs and lse within 4e-6)."""
    wlp, wids, wlse = ref(x, k)
    for name, env in sides.items():
        with scoped_env(env):
            lp, ids, lse = draft_topk_lse_impl(x, k, "default")
        ok = (torch.equal(ids, wids) and torch.allclose(lp, wlp, atol=4e-6, rtol=0)
              and torch.allclose(lse, wlse, atol=4e-6, rtol=0))
        assert ok, f"{name} != reference at {label} k={k}"


def time_torch_f32(xs: list[torch.Tensor], k: int) -> float:
    """The peer: logits.float() -> topk -> logsumexp, µs per call (time_calls over the input sets)."""
    def torch_f32(x: torch.Tensor) -> None:
        xf = x.float()
        v, _ = torch.topk(xf, k, dim=-1)
        v - torch.logsumexp(xf, dim=-1, keepdim=True)

    return time_calls([lambda x=x: torch_f32(x) for x in xs])


def time_sides(xs: list[torch.Tensor], k: int, sides: dict[str, dict[str, str]], passes: int) -> dict[str, list[float]]:
    """µs per default call under each side's environment, captured per side, in `passes` alternating passes."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(passes):
        for name, env in sides.items():
            with scoped_env(env):
                times[name].append(time_calls([lambda x=x: draft_topk_lse_impl(x, k, "default") for x in xs]))
    return times


def main() -> None:
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    passes = int(opts.get("passes", "3"))
    all_sides = parse_sides(opts.get("sides", "c2:CLUSTER=2,c1solo:CLUSTER=1/LAUNCH=solo"))
    ks = [int(v) for v in opts.get("ks", "1,16,32,64").split(",")]
    print(f"{device_name()}: sides {all_sides}, {passes} alternating passes", flush=True)
    rows = []
    for spec in opts.get("shapes", "8x15x163840,8x15x151936").split(","):
        shape, at, only = spec.partition("@")
        fp32 = shape.endswith("f")  # "8x15x151936f": fp32 logits
        batch, positions, vocab = (int(d) for d in shape.rstrip("f").split("x"))
        sides = {n: e for n, e in all_sides.items() if n == "default" or (at and n in only.split("+"))} if at \
            else all_sides
        dtype = torch.float32 if fp32 else torch.bfloat16
        nbytes = batch * positions * vocab * (4 if fp32 else 2)
        sets = max(2, min(16, (96 << 20) // nbytes + 1))  # > L2 (60 MB) in total
        xs = [torch.randn(batch, positions, vocab, device="cuda").mul_(4).to(dtype) for _ in range(sets)]
        for k in ks:
            check_sides(xs[1], k, sides, shape)
            t_f32 = time_torch_f32(xs, k)
            times = time_sides(xs, k, sides, passes)
            base = statistics.median(times["default"])
            for name in sides:
                t = statistics.median(times[name])
                ratio = statistics.mean(o / d for o, d in zip(times[name], times["default"]))
                rows.append([shape, k, name, t_f32, t, ratio, t_f32 / t, " ".join(f"{v:.2f}" for v in times[name])])
            print(f"{shape} K={k}: torch f32 {t_f32:.2f}, default {base:.2f}, "
                  + ", ".join(f"{n} {statistics.median(v):.2f}" for n, v in times.items() if n != "default"),
                  flush=True)
        del xs
    print_table(f"draft_topk_lse sides (bf16 logits unless the shape ends in f; µs per call, medians of {passes} alternating passes)",
                ["B x L x V", "K", "side", "torch f32", "µs", "side/default", "x f32", "passes"], rows)
    save_json("bench_topk_rows_ab", {"device": device_name(), "sides": all_sides, "passes": passes, "rows": rows})


if __name__ == "__main__":
    main()
