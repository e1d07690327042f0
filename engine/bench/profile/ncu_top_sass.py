"""Condense an Nsight Compute source-page CSV (SASS view) to the hottest instructions.

Input: the output of `ncu -i REPORT --page source --csv --print-source sass` (one kernel). Output, on
stdout: the per-column totals of every stall-reason column, then the top N SASS lines by warp-stall
samples, one compact line each (address, samples, share, the three largest stall reasons, the
instruction). The device tool brings back only a few small files, so this runs there.
Usage: python ncu_top_sass.py source.csv [--top 60]
"""
from __future__ import annotations

import argparse
import csv
import sys


def number(cell: str) -> float | None:
    try:
        return float(cell.replace(",", "").replace("%", ""))
    except ValueError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=60)
    a = ap.parse_args()
    with open(a.csv, newline="") as f:
        rows = list(csv.reader(f))
    # ncu may print banner lines before the header: the header is the first row naming "Source".
    head = next(i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r))
    header, body = rows[head], [r for r in rows[head + 1:] if len(r) == len(rows[head])]
    col = {name: i for i, name in enumerate(header)}
    src = col["Source"]
    addr = col.get("Address", 0)
    total_col = next((i for i, n in enumerate(header) if n.startswith("Warp Stall Sampling (All")), None)
    if total_col is None:
        sys.exit(f"no 'Warp Stall Sampling (All Samples)' column; columns: {header}")
    stall_cols = [i for i, n in enumerate(header) if n.startswith("stall_") or n.lower().startswith("stall ")]
    totals = {header[i]: sum(number(r[i]) or 0.0 for r in body) for i in stall_cols}
    samples = [(number(r[total_col]) or 0.0, r) for r in body]
    grand = sum(s for s, _ in samples) or 1.0
    print(f"{len(body)} SASS lines, {grand:.0f} warp-stall samples")
    if totals:
        print("stall reasons (share of all samples):")
        for name, v in sorted(totals.items(), key=lambda kv: -kv[1])[:16]:
            print(f"  {name:40s} {v:10.0f} {100 * v / grand:5.1f}%")
    print(f"top {a.top} lines:")
    for s, r in sorted(samples, key=lambda x: -x[0])[: a.top]:
        reasons = sorted(((number(r[i]) or 0.0, header[i]) for i in stall_cols), reverse=True)[:3]
        why = " ".join(f"{n.replace('stall_', '')}={v:.0f}" for v, n in reasons if v > 0)
        print(f"{r[addr]:>6} {s:7.0f} {100 * s / grand:4.1f}% | {why[:70]:70s} | {r[src].strip()[:90]}")


if __name__ == "__main__":
    main()
