"""CPU model for the rank phase of a deviation-level build_tree (bench/NOTES.md "### Session 12 (s12tree)").

After the raises the pool holds ~M..M+32 candidates (the tool `bench/profile/devruns_phase_probe.cu`: 256-288 at
M = 256) and the counting rank compares every pair (P^2 fp64 compares, 6-8.5k cycles measured). A bucketed rank
splits the pool into NB equal-width score bins over [min, max] of the pool (a histogram), ranks each entry only
against its own bin, and adds the bin's exclusive prefix: the work is sum(bin^2) instead of P^2 and the dependent
chain per thread is the largest bin. This measures both on bench-shaped rows (top-K of log_softmax(randn(V) *
sharp), L = 15, as bench_build_tree.py draws them, CPU generator), with the pool = the reference heap's top P
scores (the exact heap, so the scores are the kernel's), P = M + 32.
Usage: python engine/bench/model_build_tree_rank_buckets.py [--draws 2] [--m 256]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ddtree_engine.reference.build_tree import heap_pop_order  # noqa: E402
from model_build_tree_devruns import rows  # noqa: E402  (the same bench-shaped rows as the deviation-run model)


def bins(scores: list[float], nb: int) -> list[int]:
    lo, hi = min(scores), max(scores)
    width = (hi - lo) / nb or 1.0
    out = [0] * nb
    for s in scores:
        out[min(nb - 1, int((s - lo) / width))] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=2)
    ap.add_argument("--m", type=int, default=256)
    args = ap.parse_args()
    p = args.m + 32
    print(f"M = {args.m}, pool P = {p}: max bin / sum(bin^2) as a fraction of P^2, per NB")
    print("| K | sharp | draw | NB = 32 | NB = 64 | NB = 128 | NB = 256 |")
    print("|---|---|---|---|---|---|---|")
    for k in (64, 1024):
        for sharp in (8.0, 4.0, 1.0):
            for draw in range(args.draws):
                lp = rows(k, sharp, 1000 * draw + k + int(sharp))
                scores = [n.score for n in heap_pop_order(lp, p)]
                cells = []
                for nb in (32, 64, 128, 256):
                    b = bins(scores, nb)
                    cells.append(f"{max(b)} / {sum(x * x for x in b) / p / p:.3f}")
                print(f"| {k} | {sharp:g} | {draw} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
