"""Hottest SASS lines of one kernel from Nsight Compute's source page, small enough to bring back.

Input: `ncu -i REPORT --page source --csv --print-source sass` output. Prints the total warp-stall samples
and the top N instructions by samples (address, samples, share, instruction), then the samples summed over
address ranges of 512 bytes so that a hot region (a loop, a barrier wait) shows even when spread thin.
Usage: python sass_hot.py source.csv [--top 40]
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if "Source" in [c.strip() for c in r])
    header = [c.strip() for c in rows[head]]
    body = [r for r in rows[head + 1:] if len(r) == len(header)]
    src, addr = header.index("Source"), header.index("Address") if "Address" in header else 0
    col = next(i for i, n in enumerate(header) if n.startswith("Warp Stall Sampling (All"))

    def num(cell: str) -> float:
        try:
            return float(cell.replace(",", ""))
        except ValueError:
            return 0.0

    lines = [(num(r[col]), r[addr].strip(), r[src].strip()) for r in body]
    total = sum(s for s, _, _ in lines) or 1.0
    print(f"{len(lines)} SASS lines, {total:.0f} warp-stall samples; top {a.top}:")
    for s, ad, text in sorted(lines, key=lambda t: -t[0])[: a.top]:
        print(f"{ad:>8} {s:7.0f} {100 * s / total:5.1f}%  {text[:100]}")
    regions: dict[int, float] = defaultdict(float)
    for s, ad, _ in lines:
        try:
            regions[int(ad, 16) // 512] += s
        except ValueError:
            pass
    print("by 512-byte region (start address: share):")
    print("  " + "  ".join(f"{r * 512:#x}:{100 * v / total:.1f}%" for r, v in sorted(regions.items()) if v > 0.005 * total))


if __name__ == "__main__":
    main()
