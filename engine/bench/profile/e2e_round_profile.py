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
               round_update with the split tail, or commit_update in one launch)
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
from bench_e2e import VARIANTS, _graph, add_model_args, build_model, set_variant  # noqa: E402

# Engine kernels that open a segment (matched as substrings of the CUPTI kernel name).
SEGMENT_OPENERS = (("select", "draft_topk"), ("finish", "tree_accept"))
ENGINE_KERNELS = ("draft_topk", "build_tree", "tree_accept", "kv_commit", "round_update", "commit_update",
                  "tree_attention")


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
    model, _ = build_model(args, "cuda")
    cfg = model.cfg
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
    prompts = [torch.randint(0, min(256, cfg.vocab_size) if cfg.vocab_size <= 1024 else cfg.vocab_size, (int(k),),
                             generator=g).tolist()
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
    profile_engine(eng, reps, variant, batch, budget)


def profile_engine(eng: DDTreeEngine, reps: int, variant: str, batch: int, budget: int) -> dict[str, float]:
    """Profile `reps` replays of eng's captured round (every slot active mid-generation, max_new large) and
    the models graph; prints the tables; returns the medians (us): span, engine ops, top-k + build_tree,
    the rest, models span, and every engine kernel's time by short name."""
    n_draft = drafter_kernels(eng)
    kernels, copies = profile_replays(eng.run_round, reps)
    models = models_graph(eng)  # the round without the engine ops: drafter call + target forward, one graph
    m_kernels, m_copies = profile_replays(models.replay, reps)
    if not kernels or len(kernels) % reps:
        print(f"\nbatch {batch} budget {budget}: {len(kernels)} kernel records for {reps} replays; cannot split")
        return {}
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
    report_copies(copies, kernels, rounds, per_round, labels, reps, "round")
    m_span = report_models(m_kernels, m_copies, reps, n_draft, span, {s: (med(busy[s]), med(idle[s])) for s in busy})
    print("  engine-segment kernels (median us; idle = the gap before the kernel):")
    result = {"span": span, "engine": med(eng_total), "topk_build": med(picked), "rest": med(rest),
              "models_span": m_span, "kernels": float(per_round)}
    for (i, name), ts in sorted(per_kernel.items()):
        if labels[i] in ("select", "finish") or any(k in name for k in ENGINE_KERNELS):
            gap = med([max(0.0, rnd[i][1] - rnd[i - 1][2]) if i else 0.0 for rnd in rounds])
            torch_op = "" if any(k in name for k in ENGINE_KERNELS) else "   <- torch op: overhead"
            print(f"    #{i:3d} {labels[i]:7s} {name:40s} {med(ts):7.2f}  idle {gap:5.2f}{torch_op}")
            if labels[i] in ("select", "finish"):
                result[f"k:{name}"] = result.get(f"k:{name}", 0.0) + med(ts)
    return result


def profile_replays(replay: object, reps: int) -> tuple[list[tuple[str, float, float]], list[tuple[str, float, float]]]:
    """CUPTI records of `reps` replays: (kernels, memcpy/memset records), each (name, start us, end us), by start."""
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            replay()  # type: ignore[operator]
        torch.cuda.synchronize()
    recs = sorted(((e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == torch.autograd.DeviceType.CUDA), key=lambda k: k[1])
    is_copy = [("Memcpy" in n or "Memset" in n) for n, _, _ in recs]
    return [r for r, c in zip(recs, is_copy) if not c], [r for r, c in zip(recs, is_copy) if c]


def models_graph(eng: DDTreeEngine) -> object:
    """bench_e2e.overhead_share's "models" graph: the drafter call and the target forward on a tree built eagerly
    from the same state, back to back in one graph (the round with the engine ops taken out)."""
    be, m = eng.be, eng.model
    with torch.inference_mode():
        drafts = eng.drafter.draft(eng.root, eng.hidden, eng.ctx_len)
        top_lp, top_id, _ = be.draft_topk_lse(drafts, eng.K)  # type: ignore[attr-defined]
        tree = be.build_tree(top_lp, top_id, eng.root, eng.ctx_len, eng.budget.clone(), eng.n_max)  # type: ignore[attr-defined]
    ctx = eng.ctx_len.clone()

    def models() -> None:
        eng.drafter.draft(eng.root, eng.hidden, eng.ctx_len)
        m.forward_tree(be, eng.cache.k, eng.cache.v, eng.cache.block_table, tree.node_token, tree.positions,  # type: ignore[arg-type]
                       ctx, tree.anc)

    return _graph(models)


def report_copies(copies: list[tuple[str, float, float]], kernels: list[tuple[str, float, float]],
                  rounds: list[list[tuple[str, float, float]]], per_round: int, labels: list[str], reps: int,
                  what: str) -> None:
    """Where the memcpy/memset records of the replays sit: after which kernel of the round (its segment)."""
    if not copies:
        print(f"  {what}: no memcpy/memset records")
        return
    where: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    starts = [k[1] for k in kernels]
    for name, t0, t1 in copies:
        before = sum(1 for t in starts if t <= t0) - 1  # index of the last kernel that started before the copy
        i = before % per_round if before >= 0 else -1
        where[(name, i, labels[i] if i >= 0 else "-")].append(t1 - t0)
    for (name, i, seg), ts in sorted(where.items(), key=lambda x: x[0][1]):
        after = short_name(rounds[0][i][0]) if i >= 0 else "(before the first kernel)"
        print(f"  {what}: {len(ts) / reps:.1f} x {name[:40]} per replay, {statistics.median(ts):.2f} us, after kernel "
              f"#{i} {after} ({seg})")


def report_models(kernels: list[tuple[str, float, float]], copies: list[tuple[str, float, float]], reps: int,
                  n_draft: int, round_span: float, in_round: dict[str, tuple[float, float]]) -> float:
    """The models graph's span and its drafter / target segments next to the same segments inside the round."""
    if not kernels or len(kernels) % reps:
        print(f"  models graph: {len(kernels)} kernel records for {reps} replays; cannot split")
        return float("nan")
    per = len(kernels) // reps
    med = statistics.median
    spans, seg = [], defaultdict(list)
    for rnd in split_rounds(kernels, per):
        spans.append(rnd[-1][2] - rnd[0][1])
        for name, lo, hi in (("drafter", 0, n_draft), ("target", n_draft, per)):
            busy = sum(t1 - t0 for _, t0, t1 in rnd[lo:hi])
            idle = sum(max(0.0, rnd[i][1] - rnd[i - 1][2]) for i in range(max(lo, 1), hi))
            seg[name].append((busy, idle))
    span = med(spans)
    print(f"  models graph (drafter + target, no engine ops): {per} kernels, span {span:.1f} us; round span minus it "
          f"{round_span - span:.1f} us = {(round_span - span) / round_span:.1%} of the round")
    for name in ("drafter", "target"):
        b, i = med([x[0] for x in seg[name]]), med([x[1] for x in seg[name]])
        rb, ri = in_round.get(name, (float("nan"), float("nan")))
        print(f"    {name:8s} alone busy {b:7.1f} idle {i:6.1f} | in the round busy {rb:7.1f} idle {ri:6.1f}")
    if copies:
        print(f"  models graph: {len(copies) / reps:.1f} memcpy/memset records per replay")
    return span


if __name__ == "__main__":
    main()
