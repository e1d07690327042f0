"""Where a captured DDTree round spends its GPU time: kernel by kernel, with the gaps between them.

bench_e2e.py reports the share of a round outside the two model forwards ("other") as round time minus
separately replayed drafter and target graphs. This tool looks inside that number: it replays the
round's CUDA graph under torch.profiler (CUPTI kernel records), cuts every replay into its segments by
the engine's kernel names, and prints per segment the kernels' busy time and the idle time between
kernels (launch and dependency latency inside the graph):

    select   : draft_topk_lse .. build_tree (the engine ops between the two forwards), plus any kernel of the
               round before the drafter's (the split tail's budget mask torch.where(active, budget, 0))
    drafter  : the drafter's kernels (as many as one eager drafter call launches, ending before draft_topk_lse)
    target   : the tree-masked target forward (tree attention included)
    finish   : tree_accept .. the end (round_finish alone with the fused tail; tree_accept, kv_commit and
               round_update with the split tail)
Every kernel in select/finish that is not one of the engine's is a torch op the round could lose; the
listing marks it. The summary line splits the engine ops into draft_topk_lse + build_tree kernel time and
the rest (the other engine kernels, torch ops and every idle gap before an engine-segment kernel).
--finish fused split profiles both round tails (A/B).
Usage (GPU):
    PYTHONPATH=engine/python python3 engine/bench/profile/e2e_round_profile.py [--layers 2 --d-model 128 ...]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import torch

here = Path(__file__).resolve()
sys.path.insert(0, str(here.parents[2] / "python"))
sys.path.insert(0, str(here.parents[1]))

from ddtree_engine.backend import default_backend  # noqa: E402
from ddtree_engine.decode import DDTreeEngine, Request  # noqa: E402
from ddtree_engine.drafter import NoisyOracleDrafter  # noqa: E402
from ddtree_engine.model import ModelConfig, TinyTransformer  # noqa: E402
from bench_e2e import VARIANTS, add_model_args, model_config, set_variant  # noqa: E402

# Engine kernels that open a segment (matched as substrings of the CUPTI kernel name).
SEGMENT_OPENERS = (("select", "draft_topk"), ("finish", "tree_accept"))
ENGINE_KERNELS = ("draft_topk", "build_tree", "tree_accept", "kv_commit", "round_update", "tree_attention")


def short_name(name: str) -> str:
    for k in ENGINE_KERNELS:
        if k in name:
            i = name.find(k)
            return name[i:].split("(")[0].split("<")[0]
    return name.split("(")[0][:60]


def split_rounds(kernels: list[tuple[str, float, float]], per_round: int) -> list[list[tuple[str, float, float]]]:
    return [kernels[i : i + per_round] for i in range(0, len(kernels) - per_round + 1, per_round)]


def segment_of(rnd: list[tuple[str, float, float]], n_draft: int) -> list[str]:
    """Segment label of every kernel in one round, in launch order; the drafter launches n_draft kernels."""
    first_topk = next(i for i, k in enumerate(rnd) if "draft_topk" in k[0])
    labels = []
    seg = "select"  # kernels before the drafter's
    saw_build = False
    for i, (name, _, _) in enumerate(rnd):
        if i == first_topk - n_draft:
            seg = "drafter"
        for label, key in SEGMENT_OPENERS:
            if key in name:
                seg = label
        if seg == "select" and saw_build and "build_tree" not in name:
            seg = "target"
        saw_build = saw_build or "build_tree" in name
        labels.append(seg)
    return labels


def drafter_kernels(eng: DDTreeEngine) -> int:
    """How many kernels one drafter call launches (profiled eagerly, same kernels as in the graph)."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.inference_mode():
            eng.drafter.draft(eng.root, eng.hidden, eng.ctx_len)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "Memcpy" not in e.name and "Memset" not in e.name)


def main() -> None:
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--budgets", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--finish", nargs="+", default=[""], choices=["", "fused", "split"],
                    help="round tail(s) to profile: fused, split, or '' (the engine's default)")
    ap.add_argument("--variants", nargs="+", default=["default"], choices=sorted(VARIANTS),
                    help="engine-kernel variants (bench_e2e.VARIANTS), each captured into its own graph")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("e2e_round_profile needs a CUDA device")
    cfg = model_config(args)
    model = TinyTransformer.random(cfg, seed=0, device="cuda", exact=False, kv_dtype=torch.bfloat16)
    be = default_backend("cuda")
    L = args.block - 1
    print(f"model: {cfg}\ndevice: {torch.cuda.get_device_name()}  L={L}  replays per case: {args.reps}")
    for batch in args.batch:
        for budget in args.budgets:
            for finish in args.finish:
                for variant in args.variants:
                    os.environ["DDTREE_ROUND_FINISH"] = finish  # read when the engine is built
                    set_variant(variant)  # read by the library at capture
                    profile_case(model, be, cfg, L, batch, budget, args.reps, variant)


def profile_case(model: TinyTransformer, be: object, cfg: ModelConfig, L: int, batch: int, budget: int,
                 reps: int, variant: str = "default") -> None:
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, min(256, cfg.vocab_size), (int(k),), generator=g).tolist()
               for k in torch.randint(4, 64, (batch,), generator=g)]
    tokens = 64
    dr = NoisyOracleDrafter(cfg.vocab_size, L, batch, 64 + tokens + (reps + 8) * (L + 1) + L + 32, "cuda", agree=0.8)
    eng = DDTreeEngine(model, dr, be, slots=batch, max_budget=budget,  # type: ignore[arg-type]
                       max_context=64 + 2 * tokens + (reps + 8) * (L + 1))
    eng.capture_graph()
    for s, p in enumerate(prompts):
        eng.admit(s, Request(p, tokens, budget=budget))
    for _ in range(2):
        eng.step()
    eng.max_new.fill_(1 << 30)  # replays below must keep every slot active
    n_draft = drafter_kernels(eng)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(reps):
            eng.run_round()
        torch.cuda.synchronize()
    kernels = sorted(
        ((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
         if e.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in e.name and "Memset" not in e.name),
        key=lambda k: k[1])
    copies = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
              and ("Memcpy" in e.name or "Memset" in e.name)]
    if copies:  # not kernels, so not in the split below; a captured round should have none
        print(f"\nbatch {batch} budget {budget}: {len(copies) / reps:.1f} memcpy/memset records per replay "
              f"({sum(e.time_range.end - e.time_range.start for e in copies) / reps:.1f} us), not in the table")
    if not kernels or len(kernels) % reps:
        print(f"\nbatch {batch} budget {budget}: {len(kernels)} kernel records for {reps} replays; cannot split")
        return
    per_round = len(kernels) // reps
    rounds = split_rounds(kernels, per_round)
    labels = segment_of(rounds[0], n_draft)
    spans, busy, idle = [], defaultdict(list), defaultdict(list)
    per_kernel: dict[tuple[int, str], list[float]] = defaultdict(list)
    for rnd in rounds:
        spans.append(rnd[-1][2] - rnd[0][1])
        seg_busy: dict[str, float] = defaultdict(float)
        seg_idle: dict[str, float] = defaultdict(float)
        for i, (name, t0, t1) in enumerate(rnd):
            seg_busy[labels[i]] += t1 - t0
            if i:
                seg_idle[labels[i]] += max(0.0, t0 - rnd[i - 1][2])  # the wait before this kernel
            per_kernel[(i, short_name(name))].append(t1 - t0)
        for s in ("drafter", "select", "target", "finish"):
            busy[s].append(seg_busy[s])
            idle[s].append(seg_idle[s])
    med = statistics.median
    span = med(spans)
    tail = "fused" if eng.fused_finish else "split"
    print(f"\nbatch {batch} budget {budget} ({tail} tail, {variant}): {per_round} kernels per round, round span {span:.1f} us "
          f"(median of {len(rounds)} replays)")
    print(f"  {'segment':8s} {'busy us':>9s} {'idle us':>9s} {'share of span':>14s}")
    for s in ("drafter", "select", "target", "finish"):
        b, i = med(busy[s]), med(idle[s])
        print(f"  {s:8s} {b:9.1f} {i:9.1f} {(b + i) / span:13.1%}")
    eng_total = [busy["select"][k] + busy["finish"][k] + idle["select"][k] + idle["finish"][k]
                 for k in range(len(rounds))]
    picked = [sum(t1 - t0 for j, (name, t0, t1) in enumerate(rnd)
                  if labels[j] in ("select", "finish") and ("draft_topk" in name or "build_tree" in name))
              for rnd in rounds]
    rest = [e - p for e, p in zip(eng_total, picked)]
    print(f"  engine ops (select + finish, busy + idle): {med(eng_total):.1f} us = {med(eng_total) / span:.1%} of the "
          f"round; draft_topk_lse + build_tree kernels {med(picked):.1f} us, everything else {med(rest):.1f} us = "
          f"{med(rest) / span:.1%}")
    print("  engine-segment kernels (median us; idle = the gap before the kernel):")
    for (i, name), ts in sorted(per_kernel.items()):
        if labels[i] in ("select", "finish") or any(k in name for k in ENGINE_KERNELS):
            gap = med([max(0.0, rnd[i][1] - rnd[i - 1][2]) if i else 0.0 for rnd in rounds])
            torch_op = "" if any(k in name for k in ENGINE_KERNELS) else "   <- torch op: overhead"
            print(f"    #{i:3d} {labels[i]:7s} {name:40s} {med(ts):7.2f}  idle {gap:5.2f}{torch_op}")


if __name__ == "__main__":
    main()
