"""Bench the build_tree kernel vs the Python heap (heapq, the reference's heap_pop_order), same process.

Kernel times are CUDA-graph replays (median over repeats): "per call" replays a graph of 20
back-to-back launches (kernel time without launch overhead), "1-launch" replays a graph of one launch
(what a round pays when the op is alone in a graph). The heap is timed with perf_counter on the same
inputs (Python lists prepared beforehand), summed over the batch. Every configuration's kernel output is
checked against the reference before it is timed. Usage:
    python engine/bench/bench_build_tree.py [--json out.json] [--quick | --targets]
Each configuration is also timed with DDTREE_BUILD_TREE_IMPL=auto (the session-4 default: v6, or v6dp
where M > 256), v8 (v8 where M <= 64, else auto) and v8p8 (v8 with 8 probing warps), and with
--all-impls also v6 / v6dp / v7 (the selections the launcher can pick; see src/build_tree.cu), in the
same process, next to the library's default (v9auto: one warp's exact heap, v9, for launches with
n_max <= 65 and L <= 16, else v8auto = v8 where M <= 32, else auto). --targets adds the end-to-end decoder's shapes
(M = K = 16 and 64, B = 1 and 8). --small times only the M <= 64 rows (issue #3's M = 64 with K = 64 and
1024, issue #6's M = K = 16 and 64, M = 16 with K = 64; B = 1 and 8) under v8auto (the session-5
default), v9, v9s6 (session 6's warp heap) and the default, and with --dump-lp saves the B = 8 batches'
log-probs (for the CPU emulator). --large times issue #3's M = 256 and
1024 rows (and M = 512) under auto and v10 (build_tree/v10.cuh, opt-in) next to the default. --v11 times every
standard row (M = 64 / 256 / 1024, K = min(M, 64) and 1024, B = 1 and 8, and B = 64) under v11
(build_tree/v11.cuh, opt-in) and v8auto next to the default, with the heap ratios and v11's B = 64 / B = 1 ratio.
--m256 times the M = 256 rows (K = 64 and 1024; B = 1, 8 and 64) under "bitonic" (the default selection with
DDTREE_BUILD_TREE_ORDER=bitonic: the survivors cut to ~M by the tighten, then ordered by the packed / bitonic
sorts, the default before session 13) and "rankt" (the tighten, then the bucketed rank) next to the default (the
bucketed rank of build_tree/rank.cuh without the tighten): they differ only there, so the ratios are those
changes alone.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from ddtree_engine.ops.build_tree import build_tree  # noqa: E402
from ddtree_engine.reference.build_tree import build_tree as ref_build_tree  # noqa: E402
from ddtree_engine.reference.build_tree import heap_pop_order  # noqa: E402
from _timing import graph_time, scoped_env  # noqa: E402

L = 15
VOCAB = 32000


def heap_time(lp_lists: list[list[list[float]]], budget: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for rows in lp_lists:
            heap_pop_order(rows, budget)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def draft_lp(bsz: int, k: int, sharp: float, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(bsz, L, VOCAB, generator=gen, device="cuda") * sharp
    return torch.log_softmax(logits, -1).topk(k, -1).values.contiguous()


IMPLS = ["auto", "v8", "v8p8", "default"]
SMALL_IMPLS = ["v8auto", "v9", "v9s6", "default"]  # v9s6: session 6's warp heap, the A/B peer of v9
LARGE_IMPLS = ["auto", "v10", "default"]  # M > 64: the default is auto there
V11_IMPLS = ["v11", "v8auto", "default"]
M256_IMPLS = ["bitonic", "rankt", "default"]  # bitonic: the default selection with session 12's tighten + sorts
# Names that are not selections: the environment they stand for ("default": not a name, the library's default).
IMPL_ENV = {o: {"DDTREE_BUILD_TREE_IMPL": "default", "DDTREE_BUILD_TREE_ORDER": o} for o in ("bitonic", "rankt")}
DUMPS: dict[str, torch.Tensor] = {}


def bench_one(m: int, k: int, bsz: int, sharp: float, heap_reps: int) -> dict[str, float | int | str]:
    n_max = m + 1
    lp = draft_lp(bsz, k, sharp, seed=m * 31 + k + bsz)
    ids = torch.randint(0, VOCAB, (bsz, L, k), dtype=torch.int32, device="cuda")
    root = torch.randint(0, VOCAB, (bsz,), dtype=torch.int32, device="cuda")
    ctx = torch.full((bsz,), 4096, dtype=torch.int32, device="cuda")
    budget = torch.full((bsz,), m, dtype=torch.int32, device="cuda")
    want = ref_build_tree(lp.cpu(), ids.cpu(), root.cpu(), ctx.cpu(), budget.cpu(), n_max)
    fn = lambda: build_tree(lp, ids, root, ctx, budget, n_max)  # noqa: E731
    times = {}
    # Each selection and the default on the same inputs; the launcher reads DDTREE_BUILD_TREE_IMPL per
    # call, so each graph keeps the version it captured.
    for impl in IMPLS:
        with scoped_env(IMPL_ENV.get(impl, {"DDTREE_BUILD_TREE_IMPL": impl})):
            got = build_tree(lp, ids, root, ctx, budget, n_max)
            for name, g, w in zip(want._fields, got, want):
                if not torch.equal(g.cpu(), w):
                    raise AssertionError(f"M={m} K={k} B={bsz} {impl}: kernel {name} differs from the reference")
            times[impl] = (graph_time(fn, calls=20, reps=25), graph_time(fn, calls=1, reps=25))
    t_call, t_one = times["default"]
    if bsz > 1 and m <= 64:
        DUMPS[f"M{m}_K{k}_B{bsz}_s{sharp:g}"] = lp.cpu()
    per_request = []
    if (m, k, bsz, sharp) == (64, 64, 8, 8.0) and "v8" in IMPLS:  # where v8 was 2.3x slower than at B = 1
        with scoped_env({"DDTREE_BUILD_TREE_IMPL": "v8"}):
            for b in range(bsz):
                one = [t[b:b + 1].contiguous() for t in (lp, ids, root, ctx, budget)]
                per_request.append(graph_time(lambda: build_tree(*one, n_max), calls=20, reps=25) * 1e6)  # noqa: B023
    lp_lists = lp.cpu().tolist()
    t_heap = heap_time(lp_lists, m, heap_reps)
    depth_max = int(got.node_depth.max())
    return {"M": m, "K": k, "B": bsz, "sharp": sharp, "kernel_us": t_call * 1e6, "kernel_1launch_us": t_one * 1e6,
            **{f"{i}_us": times[i][0] * 1e6 for i in IMPLS if i != "default"},
            **{f"{i}_1launch_us": times[i][1] * 1e6 for i in IMPLS if i != "default"},
            "heap_ms": t_heap * 1e3, "ratio": t_heap / t_call,
            "ratio_1launch": t_heap / t_one, "max_depth": depth_max, "v8_per_request_us": per_request}


def print_small(rows: list[dict]) -> None:
    """The --small table: every selection's us per call (20-launch graph), the default against the
    session-5 default (v8auto) in the same process, and the Python heap."""
    named = [i for i in IMPLS if i != "default"]
    s6 = "v9s6" in named
    print("\n| M | K | B | sharp | " + " | ".join(f"{i} us" for i in named) + " | default us | v8auto / default | "
          "v8auto / v9 | " + ("v9s6 / v9 | " if s6 else "") + "default 1-launch us | heap us | heap / default |")
    print("|---" * (len(named) + 10 + s6) + "|")
    for r in rows:
        cols = " | ".join(f"{r[f'{i}_us']:.2f}" for i in named)
        print(f"| {r['M']} | {r['K']} | {r['B']} | {r['sharp']:g} | {cols} | {r['kernel_us']:.2f} | "
              f"{r['v8auto_us'] / r['kernel_us']:.2f}x | {r['v8auto_us'] / r['v9_us']:.2f}x | "
              + (f"{r['v9s6_us'] / r['v9_us']:.2f}x | " if s6 else "")
              + f"{r['kernel_1launch_us']:.2f} | {r['heap_ms'] * 1e3:.0f} | {r['ratio']:.1f}x |")
    for r in rows:
        if r["v8_per_request_us"]:
            print(f"v8 alone on each request of M={r['M']} K={r['K']} B={r['B']} sharp={r['sharp']:g}: "
                  + " ".join(f"{t:.1f}" for t in r["v8_per_request_us"]) + " us")


def print_batch_ratios(rows: list[dict], peer: str, batches: tuple[int, ...]) -> None:
    """Each batched row's time over the one-request row of the same shape, for the default and `peer`
    (a CTA per request: a batch waits for its slowest request)."""
    one = {(r["M"], r["K"], r["sharp"]): r for r in rows if r["B"] == 1}
    for r in rows:
        if r["B"] in batches and (r["M"], r["K"], r["sharp"]) in one:
            o = one[(r["M"], r["K"], r["sharp"])]
            print(f"B={r['B']} / B=1 at M={r['M']} K={r['K']} sharp={r['sharp']:g}: default "
                  f"{r['kernel_us'] / o['kernel_us']:.2f}x, {peer} {r[f'{peer}_us'] / o[f'{peer}_us']:.2f}x")


def print_m256(rows: list[dict]) -> None:
    """The --m256 table: the default (the bucketed rank, no tighten) against "bitonic" (the same selection with
    the tighten and the survivor sorts, the library default before session 13) and "rankt" (the tighten, then the
    rank) in the same process, the heap, batch ratios."""
    print("\n| M | K | B | sharp | bitonic us | rankt us | default us | bitonic / default | rankt / default | "
          "default 1-launch us | heap us | heap / default |")
    print("|---" * 12 + "|")
    for r in rows:
        print(f"| {r['M']} | {r['K']} | {r['B']} | {r['sharp']:g} | {r['bitonic_us']:.2f} | {r['rankt_us']:.2f} | "
              f"{r['kernel_us']:.2f} | {r['bitonic_us'] / r['kernel_us']:.2f}x | {r['rankt_us'] / r['kernel_us']:.2f}x | "
              f"{r['kernel_1launch_us']:.2f} | {r['heap_ms'] * 1e3:.0f} | {r['ratio']:.1f}x |")
    print_batch_ratios(rows, "bitonic", (8, 64))


def print_v11(rows: list[dict]) -> None:
    """The --v11 table: v11 against the library default in the same process, the heap ratios, and v11's
    batch-64 time over its one-request time on the same shape."""
    print("\n| M | K | B | sharp | default us | v8auto us | v11 us | default / v11 | v11 1-launch us | heap us | "
          "heap / default | heap / v11 |")
    print("|---" * 12 + "|")
    for r in rows:
        print(f"| {r['M']} | {r['K']} | {r['B']} | {r['sharp']:g} | {r['kernel_us']:.2f} | {r['v8auto_us']:.2f} | "
              f"{r['v11_us']:.2f} | {r['kernel_us'] / r['v11_us']:.2f}x | {r['v11_1launch_us']:.2f} | "
              f"{r['heap_ms'] * 1e3:.0f} | {r['ratio']:.0f}x | {r['heap_ms'] * 1e3 / r['v11_us']:.0f}x |")
    print_batch_ratios(rows, "v11", (64,))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--targets", action="store_true",
                    help="issue #3's shapes only: B=1 at M=64/256/1024, K=min(M,64) and 1024, and B=64")
    ap.add_argument("--all-impls", action="store_true", help="also time v6, v6dp and v7")
    ap.add_argument("--small", action="store_true", help="M <= 64 rows only, v8auto / v9 / v9s6")
    ap.add_argument("--large", action="store_true",
                    help="issue #3's M = 256 and 1024 rows (B = 1, 8, 64) and M = 512, under auto and v10 only")
    ap.add_argument("--v11", action="store_true", help="every standard row under v11, v8auto and the default")
    ap.add_argument("--m256", action="store_true", help="M = 256 rows (B = 1, 8, 64) under the survivor sorts and the default")
    ap.add_argument("--dump-lp", type=Path, help="save the B = 8 batches' log-probs here (torch.save)")
    args = ap.parse_args()
    if args.all_impls:
        IMPLS[:0] = ["v6", "v6dp", "v7"]
    if args.small:
        IMPLS[:] = SMALL_IMPLS
    if args.large:
        IMPLS[:] = LARGE_IMPLS
    if args.v11:
        IMPLS[:] = V11_IMPLS
    if args.m256:
        IMPLS[:] = M256_IMPLS
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}  L={L}  lp = top-K of log_softmax(randn(V={VOCAB}) * sharp)")
    configs = []
    for m in (64, 256, 1024):
        for k in sorted({min(m, 64), 1024}):
            for bsz in (1, 8):
                configs.append((m, k, bsz))
    configs += [(256, 64, 64), (1024, 64, 64)]
    if args.targets:
        configs = [(m, k, 1) for m in (64, 256, 1024) for k in sorted({min(m, 64), 1024})]
        configs += [(256, 64, 64), (1024, 64, 64), (16, 16, 1), (16, 16, 8), (64, 64, 8)]
    if args.quick:
        configs = [(64, 64, 1), (256, 64, 1), (256, 1024, 1), (256, 64, 64), (1024, 64, 1), (1024, 1024, 8)]
    if args.large:
        configs = [(256, 64, 1), (256, 1024, 1), (512, 1024, 1), (1024, 64, 1), (1024, 1024, 1), (1024, 1024, 8),
                   (256, 64, 64), (256, 1024, 8), (1024, 64, 64)]
    if args.m256:
        configs = [(256, 64, 1), (256, 1024, 1), (256, 64, 8), (256, 1024, 8), (256, 64, 64), (256, 1024, 64)]
    if args.small:
        configs = [(16, 16, 1), (16, 16, 8), (16, 64, 1), (16, 64, 8), (64, 64, 1), (64, 64, 8), (64, 1024, 1),
                   (64, 1024, 8)]
    rows = []
    for m, k, bsz in configs:
        for sharp in (8.0, 4.0, 1.0):
            heap_reps = 5 if m * bsz <= 2048 else 3
            rows.append(bench_one(m, k, bsz, sharp, heap_reps))
            r = rows[-1]
            print(f"  done M={m} K={k} B={bsz} sharp={sharp}: {r['kernel_us']:.2f} us", flush=True)
    if args.dump_lp:
        torch.save(DUMPS, args.dump_lp)
    if args.m256:
        print_m256(rows)
        if args.json:
            args.json.write_text(json.dumps({"rows": rows}, indent=1))
        return
    if args.v11:
        print_v11(rows)
        if args.json:
            args.json.write_text(json.dumps({"rows": rows}, indent=1))
        return
    if args.small:
        print_small(rows)
        if args.json:
            args.json.write_text(json.dumps({"rows": rows}, indent=1))
        return
    # The serial fallback (all scores equal: only lexicographic order decides), for reference.
    zeros = torch.zeros(1, L, 64, device="cuda")
    ids = torch.zeros(1, L, 64, dtype=torch.int32, device="cuda")
    one = torch.ones(1, dtype=torch.int32, device="cuda")
    t_fb = graph_time(lambda: build_tree(zeros, ids, one, one, one * 1024, 1025), calls=2, reps=5)

    print()
    named = [i for i in IMPLS if i != "default"]
    print("| M | K | B | lp sharpness | " + " | ".join(f"{i} us/call" for i in named) + " | default us/call | "
          "auto / default | default us (1-launch graph) | python heap ms | heap / default | heap / 1-launch | max depth |")
    print("|---" * (len(named) + 11) + "|")
    for r in rows:
        cols = " | ".join(f"{r[f'{i}_us']:.2f}" for i in named)
        print(f"| {r['M']} | {r['K']} | {r['B']} | {r['sharp']} | {cols} | {r['kernel_us']:.2f} | "
              f"{r['auto_us'] / r['kernel_us']:.2f}x | {r['kernel_1launch_us']:.2f} | "
              f"{r['heap_ms']:.3f} | {r['ratio']:.0f}x | {r['ratio_1launch']:.0f}x | {r['max_depth']} |")
    print(f"\nserial fallback (all-zero log-probs, M=1024, K=64, B=1): {t_fb * 1e6:.1f} us/call")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "fallback_us": t_fb * 1e6}, indent=1))


if __name__ == "__main__":
    main()
