"""Where bench_e2e's events "other" (round − models graph) differs from CUPTI's engine-op time (session 11, issue #6).

bench_e2e.overhead_share times batches of back-to-back replays with CUDA events, the round graph after the models
graph (drafter call + target forward in one graph), and restores the engine state once per batch: inside a batch
the round advances the context (~5 tokens a replay at batch 1) while the models graph replays one fixed state, and
each batch starts on an idle GPU, so its first replay waits for the host's graph launch. This tool measures, on
one engine in one process, the same difference four ways:

  bench    : overhead_share itself (the figure bench_e2e prints)
  fenced   : every replay alone, state restored before it, behind a ~60 µs GPU sleep so the host's graph launch
             is hidden (events bracket the graph only); round and models alternate replay by replay
  grow     : as fenced, but the round's state is not restored (the context grows as in a bench batch)
  cupti    : torch.profiler kernel records of back-to-back replays: per replay span (first kernel start to last
             kernel end), the period between replays' first kernels, the idle gap between replays
and the host time of one graph launch (cudaGraphLaunch, perf_counter, GPU kept busy).

Usage (GPU): PYTHONPATH=engine/python python3 engine/bench/profile/round_timeline.py --preset qwen3-0.6b
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

here = Path(__file__).resolve()
sys.path.insert(0, str(here.parents[2] / "python"))
sys.path.insert(0, str(here.parents[1]))

from ddtree_engine.backend import default_backend  # noqa: E402
from ddtree_engine.decode import Request  # noqa: E402
from ddtree_engine.drafter import NoisyOracleDrafter  # noqa: E402
from bench_e2e import (STATE, VARIANTS, add_model_args, build_model, fenced, overhead_share, run,  # noqa: E402
                       set_variant, sleep_us)
from e2e_round_profile import models_graph, profile_replays  # noqa: E402

med = statistics.median


def launch_host_us(g: object, n: int = 8) -> float:
    """Host µs of one g.replay() while the GPU is busy (a long sleep queued first)."""
    torch.cuda.synchronize()
    sleep_us(20000)
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        g.replay()  # type: ignore[attr-defined]
        ts.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return med(ts)


def cupti_periods(replay: object, reps: int) -> dict[str, float]:
    """Back-to-back replays under CUPTI: median span, period (first kernel to next replay's first kernel), gap."""
    kernels, _ = profile_replays(replay, reps)
    per = len(kernels) // reps
    rounds = [kernels[i * per:(i + 1) * per] for i in range(reps)]
    spans = [r[-1][2] - r[0][1] for r in rounds]
    periods = [rounds[i + 1][0][1] - rounds[i][0][1] for i in range(reps - 1)]
    gaps = [rounds[i + 1][0][1] - rounds[i][-1][2] for i in range(reps - 1)]
    busy = [sum(t1 - t0 for _, t0, t1 in r) for r in rounds]
    return {"kernels": float(per), "span": med(spans), "period": med(periods), "gap": med(gaps), "busy": med(busy)}


def case(model: object, be: object, batch: int, budget: int, variant: str, samples: int) -> None:
    cfg = model.cfg  # type: ignore[attr-defined]
    L, tokens = 15, 64
    g = torch.Generator().manual_seed(batch)
    prompts = [torch.randint(0, cfg.vocab_size, (int(k),), generator=g).tolist()
               for k in torch.randint(4, 64, (batch,), generator=g)]
    n_ctx = 64 + tokens + L + 32
    set_variant("default")
    ref, _, _, ar = run(model, prompts, tokens, 0, NoisyOracleDrafter(cfg.vocab_size, L, batch, n_ctx, "cuda",
                                                                      agree=0.8, dtype=model.act_dtype), [], be)
    del ar
    set_variant(variant)
    dr = NoisyOracleDrafter(cfg.vocab_size, L, batch, n_ctx, "cuda", agree=0.8, dtype=model.act_dtype)
    _, _, _, eng = run(model, prompts, tokens, budget, dr, ref, be)
    for s, p in enumerate(prompts):
        dr.set_reference(s, p + ref[s])
        eng.admit(s, Request(p, tokens, budget=budget))
    for _ in range(3):
        eng.step()
    t = overhead_share(eng)
    bench_other = (t["round"] - t["models"]) * 1e6
    eng.max_new.fill_(1 << 30)
    snap = {k: getattr(eng, k).clone() for k in STATE}
    with torch.inference_mode():
        graphs = {"round": eng._graph, "models": models_graph(eng)}
        f = fenced(graphs, {"round": 1}, snap, eng, samples)
        gr = fenced(graphs, {"round": 7}, snap, eng, samples)
        for k, v in snap.items():
            getattr(eng, k).copy_(v)
        host = {k: launch_host_us(gph) for k, gph in graphs.items()}
        for k, v in snap.items():
            getattr(eng, k).copy_(v)
        cp = {k: cupti_periods(gph.replay, 12) for k, gph in graphs.items()}  # type: ignore[attr-defined]
        for k, v in snap.items():
            getattr(eng, k).copy_(v)
    fd = [r - m for r, m in zip(f["round"], f["models"])]
    gd = [r - m for r, m in zip(gr["round"], gr["models"])]
    print(f"\n{batch}/{budget} {variant}: bench events round {t['round'] * 1e6:.1f} models {t['models'] * 1e6:.1f} "
          f"-> other {bench_other:.1f} us ({bench_other / (t['round'] * 1e6):.1%})")
    print(f"  fenced (state restored, launch hidden, {samples} alternating pairs): round {med(f['round']):.1f} "
          f"models {med(f['models']):.1f} -> other {med(fd):.1f} us (pairs: min {min(fd):.1f} max {max(fd):.1f}; "
          f"{med(fd) / med(f['round']):.1%})")
    print(f"  grow (round state restored every 7th replay): round {med(gr['round']):.1f} models {med(gr['models']):.1f} -> "
          f"other {med(gd):.1f} us; round first/last sample {gr['round'][0]:.1f} / {gr['round'][-1]:.1f}")
    print(f"  host launch of one graph (GPU busy): round {host['round']:.1f} us, models {host['models']:.1f} us")
    for k, v in cp.items():
        print(f"  cupti back-to-back {k:6s}: {v['kernels']:.0f} kernels, busy {v['busy']:.1f}, span {v['span']:.1f}, "
              f"period {v['period']:.1f}, gap between replays {v['gap']:.1f} us")
    print(f"  cupti round - models: span {cp['round']['span'] - cp['models']['span']:.1f}, period "
          f"{cp['round']['period'] - cp['models']['period']:.1f}, busy {cp['round']['busy'] - cp['models']['busy']:.1f} us")
    del eng


def main() -> None:
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    ap.add_argument("--shapes", nargs="+", default=["1/16", "1/64", "8/16", "8/64"])
    ap.add_argument("--variants", nargs="+", default=["default"], choices=sorted(VARIANTS))
    ap.add_argument("--samples", type=int, default=25)
    args = ap.parse_args()
    model, _ = build_model(args, "cuda")
    model.logits_dtype = model.act_dtype
    be = default_backend("cuda")
    print(f"model: {model.cfg}  act {model.act_dtype}\ndevice: {torch.cuda.get_device_name()}")
    for shape in args.shapes:
        b, m = (int(x) for x in shape.split("/"))
        for v in args.variants:
            case(model, be, b, m, v, args.samples)


if __name__ == "__main__":
    main()
