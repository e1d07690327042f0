"""Sustained calls of tree_attention (64/8 x 512 x 64k by default) through several libddtree builds, each for a fixed
time in rotating rounds, with the SM clock and power read by nvidia-smi in the background: µs per call, mean clock
and so cycles per call for each build (NOTES tree_attention v22: is a faster diagnostic build faster in cycles or only
in the clock a power-capped card gives it?). Usage: python fa3_probe_clocks.py NAME=LIB [NAME=LIB ...] [--secs S]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tree_attention import other_library  # noqa: E402
from profile_ops import attention  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("libs", nargs="+", metavar="NAME=LIB")
    ap.add_argument("--secs", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=65536)
    a = ap.parse_args()
    libs = dict(x.split("=", 1) for x in a.libs)
    fn = attention(64, 8, 512, a.ctx)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "50"], stdout=subprocess.PIPE, text=True)
    spans: dict[str, list[tuple[float, float, float]]] = {n: [] for n in libs}  # (t0, t1, µs per call)
    names = list(libs)
    for r in range(a.rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            with other_library(libs[n]):
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                t0, calls = time.time(), 0
                while time.time() - t0 < a.secs:
                    for _ in range(20):
                        fn()
                    torch.cuda.synchronize()
                    calls += 20
                t1 = time.time()
            spans[n].append((t0, t1, (t1 - t0) / calls * 1e6))
    smi.terminate()
    samples = []
    for line in smi.communicate()[0].splitlines():
        try:
            ts, clk, pw = [x.strip() for x in line.split(",")]
            t = time.mktime(time.strptime(ts.split(".")[0], "%Y/%m/%d %H:%M:%S")) + float("0." + ts.split(".")[1])
            samples.append((t, float(clk), float(pw)))
        except (ValueError, IndexError):
            continue
    print(f"| build | µs per call (host loop) | SM MHz (nvidia-smi, mean) | W | Mcycles per call |\n|---|---|---|---|---|")
    for n, sp in spans.items():
        # the middle of each span (the first and last 20% dropped: the clock follows the load with a lag)
        inside = [(c, p) for t, c, p in samples for t0, t1, _ in sp if t0 + 0.2 * (t1 - t0) <= t <= t1 - 0.2 * (t1 - t0)]
        us = statistics.median(u for _, _, u in sp)
        clk = statistics.mean(c for c, _ in inside) if inside else float("nan")
        pw = statistics.mean(p for _, p in inside) if inside else float("nan")
        print(f"| {n} | {us:.1f} | {clk:.0f} | {pw:.0f} | {us * clk / 1e6:.3f} |", flush=True)


if __name__ == "__main__":
    main()
