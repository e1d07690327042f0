"""CPU model of a build_tree design that expands by deviation level instead of by depth (issue #3, session 11).

Every candidate is (deviation node) . 0^j, where a deviation node is a rank tuple whose last rank is non-zero
(or the empty root). With the chain prefix Z[e] = sum_{i<e} lp[i][0], the zero run below a node of depth d and
score s scores s + Z[d+j] - Z[d], and a deviation child (e, r >= 1) scores s + Z[e-1] - Z[d] + lp[e-1][r]. So
the candidates above a threshold t can be enumerated one deviation level per block phase (the kernel today
needs one depth per block phase). This script measures, on bench-shaped rows (top-K of
log_softmax(randn(V) * sharp), L = 15, as bench_build_tree.py draws them, but with the CPU generator), what such
a design would have to do: deviation levels, parents and work items per level, and the pool size P above three
thresholds (the exact M-th score t*, the chain-family bound B1 = the M-th best of {0^(e-1).r} that the kernel
computes today, and B2 = the M-th best of all candidates with <= 1 deviation, zero runs included). It checks
that the enumeration above t* is exactly the reference heap's top M (the model is only worth its counts if so).
Usage: python engine/bench/model_build_tree_devruns.py [--draws 3] [--m 256 64]  (~4 min at --draws 2)
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
from ddtree_engine.reference.build_tree import heap_pop_order  # noqa: E402

L = 15
VOCAB = 32000


def rows(k: int, sharp: float, seed: int) -> list[list[float]]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(L, VOCAB, generator=gen) * sharp
    return torch.log_softmax(logits, -1).topk(k, -1).values.to(torch.float32).tolist()


def ref_tuples(lp: list[list[float]], m: int) -> list[tuple[tuple[int, ...], float]]:
    out: list[tuple[tuple[int, ...], float]] = []
    for n in heap_pop_order(lp, m):
        prefix = out[n.parent - 1][0] if n.parent else ()
        out.append((prefix + (n.rank,), n.score))
    return out


def count_ge(row: list[float], base: float, t: float, lo: int) -> int:
    """#{r >= lo : base + row[r] >= t} by bisection (row sorted desc): what one kernel lane would do."""
    a, b = lo, len(row)
    while a < b:
        mid = (a + b) // 2
        if base + row[mid] >= t:
            a = mid + 1
        else:
            b = mid
    return a - lo


def with_run(lp: list[list[float]], tup: tuple[int, ...], d: int, s: float, t: float) -> list:
    """A deviation node and its zero run >= t as (tuple, depth, score); the root () is listed last (it is no
    candidate, but its deviation children branch off it). In the kernel: one ballot over depths."""
    members = [(tup, d, s)] if d else []
    x, sc = tup, s
    for e in range(d, L):
        sc = sc + lp[e][0]
        if sc < t:
            break
        x = x + (0,)
        members.append((x, e + 1, sc))
    return members if d else members + [((), 0, 0.0)]


def enumerate_devruns(lp: list[list[float]], t: float, max_dev: int = 99) -> dict:
    """Candidates >= t, one deviation level at a time. Scores are summed along the tuple (kappa), as the
    kernel's fast path does. Returns the candidate set and the per-level work."""
    levels = []
    cands: dict[tuple[int, ...], float] = {}
    frontier = [((), 0, 0.0)]  # (tuple, depth, score) of the previous level's deviation nodes; root first
    level = 0
    while frontier and level <= max_dev:
        # runs of this level's deviation nodes (one ballot over depths per node in the kernel)
        run_members = []  # (tuple, depth, score) of every run member incl. the deviation node itself
        run_lens = []
        for tup, d, s in frontier:
            members = with_run(lp, tup, d, s, t)
            run_lens.append(len(members))
            run_members.append(((tup, d, s), members))
        n_run = 0
        items = 0
        nxt = []
        for (_, _, _), members in run_members:
            for tup, d, s in members:
                if d:
                    cands[tup] = s
                    n_run += 1
                if d == L or level == max_dev:
                    continue
                c = count_ge(lp[d], s, t, 1)  # deviation children at depth d + 1 with rank >= 1
                if c:
                    items += 1
                    nxt.extend((tup + (r,), d + 1, s + lp[d][r]) for r in range(1, 1 + c))
        levels.append({"parents": len(frontier), "run_members": n_run, "items": items, "children": len(nxt),
                       "max_run": max(run_lens)})
        frontier = nxt
        level += 1
    return {"cands": cands, "levels": levels}


def enumerate_raise(lp: list[list[float]], m: int, t: float, cap: int = 0) -> dict:
    """Deviation levels with a raise before each level is materialized: t becomes the M-th best of the pool so
    far (levels < k) and level k's deviation nodes >= t (their runs left out: still a set of distinct
    candidates, so a valid lower bound of the M-th score). In the kernel the raise is a probe round that counts
    (one bisection per work item and probe); the model computes its exact value, the best such a raise can do."""
    pool: dict[tuple[int, ...], float] = {}
    frontier = [((), 0, 0.0)]
    levels = []
    while frontier:
        members = [x for tup, d, s in frontier for x in with_run(lp, tup, d, s, t)]
        for tup, d, s in members:
            if d:
                pool[tup] = s
        kids = []
        items = 0
        for tup, d, s in members:
            if d < L:
                c = count_ge(lp[d], s, t, 1)
                items += c > 0
                kids.extend((tup + (r,), d + 1, s + lp[d][r]) for r in range(1, 1 + c))
        raised = False
        runs = []  # the kids' zero runs (what the next level's ballot materializes)
        for tup, d, s in kids:
            sc = s
            for e in range(d, L):
                sc = sc + lp[e][0]
                if sc < t:
                    break
                runs.append(sc)
        # cap = 0: raise before every level (over the kids alone); cap > 0: raise only when the pool, the kids
        # and their runs would pass cap, to the M-th best of all of them (what a probe round over item counts and
        # run counts can reach), so that a counting rank over <= cap entries can select the top M at the end
        total = len(pool) + len(kids) + len(runs)
        if kids and len(pool) + len(kids) >= m and (cap == 0 or total > cap):
            extra = runs if cap else []
            new_t = sorted(list(pool.values()) + [k[2] for k in kids] + extra, reverse=True)[m - 1]
            raised = new_t > t
            t = max(t, new_t)
            pool = {k: v for k, v in pool.items() if v >= t}
            kids = [k for k in kids if k[2] >= t]
        levels.append({"items": items, "kids": len(kids), "pool": len(pool), "raised": raised})
        frontier = kids
    return {"cands": pool, "levels": levels}


def mth_best_family(lp: list[list[float]], m: int) -> float:
    """B1: the M-th best of the chain family {0^(e-1).r}, the bound the kernel computes today."""
    z, fam = 0.0, []
    for e in range(L):
        fam.extend(z + x for x in lp[e] if x != -math.inf)
        z += lp[e][0]
    fam.sort(reverse=True)
    return fam[min(m, len(fam)) - 1]


def mth_best_level1(lp: list[list[float]], m: int) -> float:
    """B2: the M-th best of every candidate with <= 1 deviation (its zero run included)."""
    res = enumerate_devruns(lp, -math.inf, max_dev=1)
    vals = sorted(res["cands"].values(), reverse=True)
    return vals[min(m, len(vals)) - 1]


def model_one(lp: list[list[float]], m: int) -> dict:
    ref = ref_tuples(lp, m)
    tstar = ref[-1][1]
    exact = enumerate_devruns(lp, tstar)
    got = sorted(exact["cands"].items(), key=lambda kv: (-kv[1], kv[0]))[:m]
    assert [g[0] for g in got] == [r[0] for r in ref], "deviation-run enumeration differs from the heap"
    devs = [sum(1 for x in tup if x) for tup, _ in ref]
    depths = [len(tup) for tup, _ in ref]
    out = {"t*": tstar, "D": max(devs), "depth": max(depths), "lv*": exact["levels"], "P*": len(exact["cands"]),
           "dev_hist": [devs.count(i) for i in range(max(devs) + 1)]}
    b2 = mth_best_level1(lp, m)
    rz = enumerate_raise(lp, m, b2)
    got = sorted(rz["cands"].items(), key=lambda kv: (-kv[1], kv[0]))[:m]
    assert [g[0] for g in got] == [r[0] for r in ref], "raise variant differs from the heap"
    out["R"] = rz
    rc = enumerate_raise(lp, m, -math.inf, cap=max(512, 2 * m))
    got = sorted(rc["cands"].items(), key=lambda kv: (-kv[1], kv[0]))[:m]
    assert [g[0] for g in got] == [r[0] for r in ref], "capped raise variant differs from the heap"
    out["C"] = rc
    for name, bound in (("B1", mth_best_family(lp, m)), ("B2", b2)):
        assert bound <= tstar
        res = enumerate_devruns(lp, bound)
        out[name] = {"P": len(res["cands"]), "levels": len(res["levels"]) - 1, "lv": res["levels"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=3)
    ap.add_argument("--m", type=int, nargs="+", default=[256, 64])  # M = 1024: the pool above B1 runs out of memory
    args = ap.parse_args()
    print("| M | K | sharp | draw | max depth | D (deviations) | nodes per deviation count | P(t*) | "
          "levels(B1) | P(B1) | levels(B2) | P(B2) | parents / items / children per level at B2 | "
          "raise variant: items / kids / pool per level, final P | from t = -inf, raise only past max(512, 2M): "
          "items / kids / pool / raised per level, final P |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for m in args.m:
        for k in (64, 1024):
            for sharp in (8.0, 4.0, 1.0):
                for draw in range(args.draws):
                    lp = rows(k, sharp, seed=m * 31 + k + draw)
                    r = model_one(lp, m)
                    rv = " ; ".join(f"{x['items']}/{x['kids']}/{x['pool']}" for x in r["R"]["levels"])
                    rv += f", P = {len(r['R']['cands'])}"
                    cv = " ; ".join(f"{x['items']}/{x['kids']}/{x['pool']}/{'R' if x['raised'] else '-'}"
                                    for x in r["C"]["levels"])
                    cv += f", P = {len(r['C']['cands'])}"
                    lv = " ; ".join(f"{x['parents']}/{x['items']}/{x['children']}" for x in r["B2"]["lv"])
                    print(f"| {m} | {k} | {sharp:g} | {draw} | {r['depth']} | {r['D']} | {r['dev_hist']} | "
                          f"{r['P*']} | {r['B1']['levels']} | {r['B1']['P']} | {r['B2']['levels']} | "
                          f"{r['B2']['P']} | {lv} | {rv} | {cv} |", flush=True)


if __name__ == "__main__":
    main()
