"""The fa3 A/B of bench_tree_attention.py (--ab, --ab-lib): the launch switches it flips and the tables
of their results (same-process, and timed in alternation). Apart from the bench so that each file stays
under 500 lines; the bench imports these names and its CLI and output are as before."""

from __future__ import annotations

import statistics
from typing import Callable, ContextManager

# fa3 launch features toggled per call by the launcher's environment switches (--ab): v10's opt-in fused
# split merge on, its lazy tile-mask wait off (v9b's eager wait), and its opt-in cost-weighted chunk
# boundaries (masked tiles count 6/4 and 3/4 of a context tile: the last chunk, which holds them, gets
# fewer or more tiles), and v17's two tile schedules forced (chunked = v10's chunks, strided = every
# nact-th tile per split). The first two must give the default's bits; balanced chunks and the other
# schedule group the tiles differently, so they are compared by max rel diff instead.
FA3_AB = {
    "fa3_fused_merge": {"DDTREE_TA_FA3_FUSED_MERGE": "1"},
    "fa3_eager_mask": {"DDTREE_TA_FA3_LAZY_MASK": "0"},
    "fa3_balance6": {"DDTREE_TA_FA3_BALANCE": "6"},
    "fa3_balance3": {"DDTREE_TA_FA3_BALANCE": "3"},
    "fa3_chunked": {"DDTREE_TA_FA3_SCHEDULE": "chunked"},
    "fa3_strided": {"DDTREE_TA_FA3_SCHEDULE": "strided"},
    # v18 (session 10): the PDL wait back at the top of the kernel (v17's), the merge kernel's trigger back at
    # its exit (implicit), and both (= v17's launch sequence); none of them changes a bit.
    "fa3_late_wait": {"DDTREE_TA_FA3_EARLY_INPUTS": "0"},
    "fa3_early_inputs": {"DDTREE_TA_FA3_EARLY_INPUTS": "1"},  # as inputs_ready=True (every call of ours may)
    "fa3_merge_late": {"DDTREE_TA_MERGE_TRIGGER": "0"},
    "fa3_v17": {"DDTREE_TA_FA3_EARLY_INPUTS": "0", "DDTREE_TA_MERGE_TRIGGER": "0"},
    # v21 (session 12): the CTAs in index order (row tile 0 first) or the longest row tiles first; same bits.
    "fa3_index_order": {"DDTREE_TA_FA3_LPT": "0"},
    "fa3_lpt": {"DDTREE_TA_FA3_LPT": "1"},
}
FA3_AB_EXACT = {"fa3_fused_merge", "fa3_eager_mask", "fa3_late_wait", "fa3_early_inputs", "fa3_merge_late",
                "fa3_v17", "fa3_index_order", "fa3_lpt"}


def alternate(variants: dict[str, Callable[[], ContextManager]], time_us: Callable[[], float],
              rounds: int) -> dict[str, float]:
    """Median µs of each variant timed in alternation: `rounds` rounds, each timing every variant once (inside its
    context: a library or an environment switch). The order rotates by one each round, so no variant is always
    timed first or right after the same neighbour: the final run of session 12 timed its A/B variants one after
    another, each after the previous, and read every later one slower (26.4 vs 24.6 µs on identical code)."""
    names = list(variants)
    ts: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            with variants[n]():
                ts[n].append(time_us())
    return {n: statistics.median(v) for n, v in ts.items()}


def print_alt(rows: list[dict], ab_libs: dict[str, str]) -> None:
    """This build against the --ab-lib builds timed in alternation (medians, µs)."""
    if not any("alt_this_us" in r for r in rows):
        return
    names = list(ab_libs)
    print("\n| Hq/Hkv | N | C | this build µs (alternating) | " + " | ".join(f"{n} µs" for n in names) + " | "
          + " | ".join(f"{n} / this" for n in names) + " |\n|" + "---|" * (4 + 2 * len(names)))
    for r in rows:
        if "alt_this_us" not in r:
            continue
        cells = [f"{r['hq']}/{r['hkv']}", str(r["n"]), f"{r['ctx'] // 1024}k", f"{r['alt_this_us']:.1f}"]
        cells += [f"{r[f'alt_{n}_us']:.1f}" for n in names]
        cells += [f"{r[f'alt_{n}_us'] / r['alt_this_us']:.3f}" for n in names]
        print("| " + " | ".join(cells) + " |", flush=True)


def print_alt_env(rows: list[dict]) -> None:
    """The default fa3 against each --ab switch timed in alternation (--ab --ab-rounds N; medians, µs)."""
    if not any("altenv_fa3_us" in r for r in rows):
        return
    names = [n for n in FA3_AB if any(f"altenv_{n}_us" in r for r in rows)]
    print("\n| Hq/Hkv | N | C | fa3 µs (alternating) | " + " | ".join(f"{n} µs" for n in names) + " | "
          + " | ".join(f"fa3 / {n}" for n in names) + " |\n|" + "---|" * (4 + 2 * len(names)))
    for r in rows:
        if "altenv_fa3_us" not in r:
            continue
        cells = [f"{r['hq']}/{r['hkv']}", str(r["n"]), f"{r['ctx'] // 1024}k", f"{r['altenv_fa3_us']:.1f}"]
        cells += [f"{r[f'altenv_{n}_us']:.1f}" for n in names]
        cells += [f"{r['altenv_fa3_us'] / r[f'altenv_{n}_us']:.3f}" for n in names]
        print("| " + " | ".join(cells) + " |", flush=True)


def print_ab(rows: list[dict], ab_libs: dict[str, str] | None = None) -> None:
    """fa3 (default) next to the same kernel with a launch switch flipped (µs, same process)."""
    names = [n for n in [*FA3_AB, *(ab_libs or {})] if any(f"{n}_us" in r for r in rows)]
    exact = FA3_AB_EXACT | set(ab_libs or {})
    if not names:
        return
    print("\n(first pass: each variant timed once, one after another; read the alternating tables below)")
    cols = ["Hq/Hkv", "N", "C", "fa3 µs"] + [f"{n} µs" for n in names] + ["same bits (exact switches)"]
    cols += [f"{n} rel diff" for n in names if n not in exact]
    print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        if f"{names[0]}_us" not in r:
            continue
        cells = [f"{r['hq']}/{r['hkv']}", str(r["n"]), f"{r['ctx'] // 1024}k", f"{r['fa3_us']:.1f}"]
        cells += [f"{r[f'{n}_us']:.1f}" for n in names]
        cells.append("yes" if all(r.get(f"{n}_bits_equal") for n in names if n in exact) else "NO")
        cells += [f"{r.get(f'{n}_rel_diff', float('nan')):.1e}" for n in names if n not in exact]
        print("| " + " | ".join(cells) + " |", flush=True)
