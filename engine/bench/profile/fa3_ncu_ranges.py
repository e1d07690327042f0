"""Warp-stall samples of the fa3 kernel's steady-state consumer loop, by range (NOTES, tree_attention v19).

Input: `ncu -i REPORT --page source --csv --print-source sass` of one tree_attention_fa3_kernel launch
(SourceCounters). The ranges are found by SASS landmarks of the steady-state loop, so they follow the code
when addresses move between builds: the first S HGMMA (`..., RZ, !UPT`), the last S HGMMA (gsb0), the V
mbarrier wait after it, the last P.V HGMMA (gsb0), `wgmma.wait_group 1` (DEPBAR.LE gsb0, 0x1), and the loop's
back-branch after the row-sum FFMA. Prints, per range: samples, share of all samples, executed instructions per
loop iteration and the top stall reasons; then every mbarrier try-wait of the loops (polls per iteration).
Usage: python fa3_ncu_ranges.py [--period CYCLES] sass.csv [more.csv ...]
"""
from __future__ import annotations

import csv
import re
import sys


def load(path: str) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    col = {n: i for i, n in enumerate(rows[head])}

    def num(r: list[str], name: str) -> float:
        try:
            return float(r[col[name]].replace(",", "") or 0)
        except (KeyError, ValueError):
            return 0.0

    stalls = [n for n in col if n.startswith("stall_") and "Not Issued" not in n]
    out = []
    for r in rows[head + 1:]:
        if len(r) != len(rows[head]):
            continue
        out.append({"addr": int(r[col["Address"]], 16), "src": r[col["Source"]].strip(),
                    "samp": num(r, "Warp Stall Sampling (All Samples)"), "ex": num(r, "Instructions Executed"),
                    "st": {n[6:]: num(r, n) for n in stalls}})
    return out


def report(path: str) -> None:
    lines = load(path)
    total = sum(x["samp"] for x in lines) or 1.0
    first_s = max((x["ex"], i) for i, x in enumerate(lines) if re.search(r"HGMMA.*RZ, !UPT", x["src"]))[1]
    iters = lines[first_s]["ex"]  # the steady-state S issue runs once per consumer warp and iteration

    def find(pat: str, start: int) -> int:
        return next(i for i in range(start, len(lines)) if re.search(pat, lines[i]["src"]) and lines[i]["ex"] > 0)

    s_last = find(r"HGMMA.*gsb0", first_s)
    v_wait = find(r"TRYWAIT", s_last)
    pv_last = find(r"HGMMA.*tnspB.*gsb0", v_wait)
    wait_s = find(r"DEPBAR\.LE gsb0, 0x1", pv_last)
    end = next(i for i in range(wait_s, len(lines)) if "BRA" in lines[i]["src"] and "FFMA" in lines[i - 1]["src"]
               and lines[i]["ex"] == iters)
    start = first_s  # back to the loop's first instruction: the run of lines executed at least once per iteration
    while start > 0 and lines[start - 1]["ex"] >= iters and lines[first_s]["addr"] - lines[start - 1]["addr"] < 0x800:
        start -= 1
    pv_end = find(r"BRA", pv_last)  # the named-barrier arrive for the other consumer comes before this branch
    ranges = {"top .. S issue": (start, s_last), "between S issue and V wait": (s_last + 1, v_wait - 3),
              "V wait .. P.V issue": (v_wait - 2, pv_end), "masked words, wait for S": (pv_end + 1, wait_s),
              "softmax": (wait_s + 1, end)}
    print(f"{path}: {total:.0f} samples, {iters:.0f} loop iterations")
    in_loop = 0.0
    for name, (a, b) in ranges.items():
        xs = lines[a:b + 1]
        s = sum(x["samp"] for x in xs)
        in_loop += s
        st: dict[str, float] = {}
        for x in xs:
            for n, v in x["st"].items():
                st[n] = st.get(n, 0.0) + v
        top = " ".join(f"{n}={100 * v / max(s, 1):.0f}%" for n, v in sorted(st.items(), key=lambda kv: -kv[1])[:4])
        print(f"  {name:28s} samples {s:7.0f} {100 * s / total:5.1f}%  instr/iter "
              f"{sum(x['ex'] for x in xs) / iters:6.1f}  {top}")
    print(f"  consumer loop total          samples {in_loop:7.0f} {100 * in_loop / total:5.1f}%")
    # s12 (v21): the ping-pong turn and the wait for S. bar.sync is issued with deferred blocking: the warp stalls
    # ("barrier") at the first instruction that needs the barrier, the first S HGMMA, so the turn is the lines
    # from the BAR.SYNC before the S issue to that HGMMA; the wait for S is its DEPBAR line. Shares of the
    # consumer loop's samples and, with --period (cycles per tile of the loop), cycles per tile.
    period = PERIOD[0]
    bar_i = max(i for i in range(start, first_s + 1) if "BAR.SYNC" in lines[i]["src"])
    for name, (a, b) in (("turn (BAR.SYNC .. 1st S HGMMA)", (bar_i, first_s)), ("wait for S (DEPBAR gsb0, 1)", (wait_s, wait_s))):
        xs = lines[a:b + 1]
        s = sum(x["samp"] for x in xs)
        bar = sum(x["st"].get("barrier", 0.0) for x in xs)
        cyc = f"; barrier ~{period * bar / max(in_loop, 1):.0f} of {period:.0f} cycles per tile" if period else ""
        print(f"  {name:30s} samples {s:6.0f} ({100 * s / max(in_loop, 1):4.1f}% of the loop), barrier stall {bar:6.0f} "
              f"({100 * bar / max(in_loop, 1):4.1f}%){cyc}")
    for i, x in enumerate(lines):
        if "TRYWAIT" in x["src"] and x["ex"] > iters / 4:
            s = x["samp"] + lines[i + 1]["samp"]  # the try-wait and its retry branch
            print(f"  try-wait {x['ex'] / iters:5.2f} per iter  {100 * s / total:4.1f}%  {x['src'][:60]}")


PERIOD = [0.0]

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--period"]:  # cycles per consumer iteration, to scale shares into cycles
        PERIOD[0] = float(args[1])
        args = args[2:]
    for p in args:
        report(p)
