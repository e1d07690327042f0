"""Count the SASS instructions one executed path issues through a loop, from an nvdisasm listing.

Static counts overstate what a warp issues (branches not taken, rarely used paths such as a
division for non-power-of-two pages); this walks one path instead: start at a label, fall through,
follow every unconditional BRA and the conditional branches whose addresses are named, stop after the
instruction at END (typically the loop's back edge). Prints the count and a per-opcode breakdown.

Listing: `nvdisasm -g -c kernel.cubin > k.dis` (cuobjdump -xelf to get the cubin out of the library,
or compile the header alone with `nvcc -cubin -gencode arch=compute_90a,code=sm_90a`).
Usage: python sass_path_count.py k.dis .L_x_139 10910 --taken f380,f4a0,f6e0
(v7 notes on tree_attention used this for the fa3 producer's steady-state step.)
"""
from __future__ import annotations

import argparse
import re
from collections import Counter

INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(\S.*?)\s*;?\s*$")
LABEL = re.compile(r"^(\.L_x_\d+):")
BRANCH = re.compile(r"BRA\s+`\((\.L_x_\d+)\)")


def parse(text: str) -> tuple[list[tuple[int, str]], dict[str, int]]:
    seq: list[tuple[int, str]] = []
    labels: dict[str, int] = {}
    for line in text.splitlines():
        m = LABEL.match(line)
        if m:
            labels[m.group(1)] = len(seq)
            continue
        m = INSN.search(line)
        if m:
            seq.append((int(m.group(1), 16), m.group(2)))
    return seq, labels


def walk(seq: list[tuple[int, str]], labels: dict[str, int], start: str, end: int,
         taken: set[int], limit: int = 100000) -> Counter[str]:
    ops: Counter[str] = Counter()
    i = labels[start]
    for _ in range(limit):
        addr, text = seq[i]
        op = re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]
        ops[op] += 1
        if addr == end:
            return ops
        m = BRANCH.search(text)
        predicated = text.startswith("@")
        if m and (not predicated or addr in taken):
            i = labels[m.group(1)]
        else:
            i += 1
    raise SystemExit(f"no end at {end:#x} within {limit} instructions: check the branch list")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("listing")
    ap.add_argument("start", help="label to start at, e.g. .L_x_139")
    ap.add_argument("end", help="hex address of the last instruction counted (the back edge)")
    ap.add_argument("--taken", default="", help="comma-separated hex addresses of taken conditional branches")
    args = ap.parse_args()
    with open(args.listing, encoding="utf-8") as f:
        seq, labels = parse(f.read())
    taken = {int(x, 16) for x in args.taken.split(",") if x}
    ops = walk(seq, labels, args.start, int(args.end, 16), taken)
    print(sum(ops.values()), " ".join(f"{k}:{v}" for k, v in ops.most_common()))


if __name__ == "__main__":
    main()
