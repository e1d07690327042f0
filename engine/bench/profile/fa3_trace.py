"""Where a fa3 tree-attention call spends its time, CTA by CTA.

Needs a library built with the phase trace (never the default build):
    cmake -S engine -B engine/build-trace -G Ninja -DDDTREE_CUDA_ARCHS=90a -DDDTREE_OPS=tree_attention \
          -DCMAKE_CUDA_FLAGS=-DDDTREE_TA_FA3_TRACE_BUILD && cmake --build engine/build-trace
    DDTREE_LIB=engine/build-trace/libddtree.so python3 engine/bench/profile/fa3_trace.py
The kernel records %globaltimer (ns) and clock64 at sixteen marks per CTA (tree_attention/fa3_kernel.cuh:
DDTREE_TA_FA3_TRACE). For each shape this prints, over the CTAs of one call made after a warm-up, the
spread of their start times and the median / max of each phase, in µs (globaltimer) and in SM cycles
(clock64), plus the kernel's span from the first CTA's entry to the last CTA's exit, and (session 8) when
the merge kernel's CTAs enter, return from their PDL wait and end, relative to the last fa3 CTA's exit.
"""
from __future__ import annotations

import ctypes
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_ops import attention  # noqa: E402  (puts engine/python and engine/bench on sys.path)
from ddtree_engine import _lib  # noqa: E402

TAGS = 16
PHASES = [  # (name, from mark, to mark); marks (tree_attention/fa3_kernel.cuh): 0 entry, 1 lengths,
    # 14 chunk planned, 8 first rows in shared memory, 2 prologue published (tid 0, producer); 9 Q copies
    # issued, 10 mask part published, 11 registers raised, 3 Q landed, 12 K_0 landed, 13 S_0 done, 4 first
    # softmax, 5 main loop done, 6 epilogue stores issued (tid 128, consumer 0); 7 producer done
    ("entry -> lengths loaded (PDL wait, global loads)", 0, 1),
    ("lengths -> chunk planned (ctx_len, plan)", 1, 14),
    ("chunk planned -> first rows in smem (block table)", 14, 8),
    ("first rows -> prologue published (copies issued)", 8, 2),
    ("lengths -> Q copies issued (consumer 0)", 1, 9),
    ("Q issued -> mask part published", 9, 10),
    ("mask published -> registers raised", 10, 11),
    ("registers raised -> Q landed", 11, 3),
    ("entry -> Q landed", 0, 3),
    ("entry -> K_0 landed", 0, 12),
    ("K_0 landed -> S_0 done", 12, 13),
    ("S_0 done -> first softmax", 13, 4),
    ("entry -> first softmax", 0, 4),
    ("first softmax -> main loop done", 4, 5),
    ("epilogue (partials or output stores)", 5, 6),
    ("entry -> producer done", 0, 7),
    ("entry -> consumer 0 done", 0, 6),
]


def read_trace() -> list[list[int]]:
    fn = _lib.function("ddtree_debug_fa3_trace", [ctypes.POINTER(ctypes.c_ulonglong)])
    buf = (ctypes.c_ulonglong * (2048 * 2 * TAGS))()
    n = fn(buf)
    if n < 0:
        raise RuntimeError("ddtree_debug_fa3_trace failed")
    return [list(buf[i * 2 * TAGS:(i + 1) * 2 * TAGS]) for i in range(n)]


def read_merge_trace() -> list[list[int]]:
    """The merge kernel's per-CTA marks (entry, after the PDL wait, end; globaltimer ns); [] without them."""
    try:
        fn = _lib.function("ddtree_debug_merge_trace", [ctypes.POINTER(ctypes.c_ulonglong)])
    except Exception:  # noqa: BLE001 - an older trace build
        return []
    buf = (ctypes.c_ulonglong * (4096 * 3))()
    n = fn(buf)
    return [list(buf[i * 3:(i + 1) * 3]) for i in range(max(n, 0))]


def show(name: str, call, row_tiles: int = 0) -> None:
    """row_tiles > 0 (one request, one kv head: the trace index is blockIdx.x = split * row_tiles + rt)
    adds a line per split: when its CTAs finish the main loop and the epilogue, relative to the first
    entry, to see which chunk the call waits for."""
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    read_trace()  # clears the table
    read_merge_trace()
    call()
    torch.cuda.synchronize()
    table = read_trace()
    merge = [r for r in read_merge_trace() if r[0] and r[2]]
    rows = [r for r in table if r[0] and r[6]]
    if not rows:
        print(f"== {name}: no trace (not the fa3 back end, or a library without the trace build)")
        return
    t0 = min(r[0] for r in rows)
    starts = sorted((r[0] - t0) / 1e3 for r in rows)
    span = (max(max(r[6], r[7]) for r in rows) - t0) / 1e3
    print(f"== {name}: {len(rows)} CTAs, kernel span {span:.2f} µs (first entry to last exit); "
          f"CTA starts: median {statistics.median(starts):.2f}, max {starts[-1]:.2f} µs after the first")
    for label, a, b in PHASES:
        us = [(r[b] - r[a]) / 1e3 for r in rows if r[a] and r[b]]
        cyc = [r[TAGS + b] - r[TAGS + a] for r in rows if r[TAGS + a] and r[TAGS + b]]
        if us:
            print(f"  {label:52s} median {statistics.median(us):6.2f} µs / {statistics.median(cyc):7.0f} cyc, "
                  f"max {max(us):6.2f} µs")
    if merge:
        last_exit = max(max(r[6], r[7]) for r in rows)
        rel = lambda col: sorted((r[col] - last_exit) / 1e3 for r in merge)  # noqa: E731
        ent, wait, end = rel(0), rel(1), rel(2)
        print(f"  merge kernel, {len(merge)} CTAs, µs after the last fa3 CTA's exit: entry first {ent[0]:.2f} "
              f"median {statistics.median(ent):.2f} last {ent[-1]:.2f}; PDL wait returns first {wait[0]:.2f} "
              f"median {statistics.median(wait):.2f} last {wait[-1]:.2f}; end median {statistics.median(end):.2f} "
              f"last {end[-1]:.2f}")
    if row_tiles > 0:
        by_split: dict[int, list[list[int]]] = {}
        for i, r in enumerate(table):
            if r[0] and r[6]:
                by_split.setdefault(i // row_tiles, []).append(r)
        for sp, rs in sorted(by_split.items()):
            loop = [(r[5] - r[4]) / 1e3 for r in rs if r[4] and r[5]]
            done = [(r[5] - t0) / 1e3 for r in rs if r[5]]
            end = [(r[6] - t0) / 1e3 for r in rs]
            print(f"  split {sp}: {len(rs)} CTAs, main loop median {statistics.median(loop):6.2f} max {max(loop):6.2f} µs;"
                  f" loop done at median {statistics.median(done):6.2f} max {max(done):6.2f}; epilogue done at median "
                  f"{statistics.median(end):6.2f} max {max(end):6.2f} µs")


def main() -> None:
    import os

    if "--v17" in sys.argv:
        # v17: the two tile schedules of a split request, one after the other on the same shapes (the split
        # lines then show whether the tree tiles' split still straggles).
        for shape, hq, hkv, n in (("8/1 x 512 x 4k", 8, 1, 512), ("64/8 x 64 x 4k", 64, 8, 64)):
            for schedule in ("chunked", "strided"):
                os.environ["DDTREE_TA_FA3_SCHEDULE"] = schedule
                show(f"{shape}, {schedule} schedule", attention(hq, hkv, n, 4096),
                     row_tiles=32 if hkv == 1 else 0)
        del os.environ["DDTREE_TA_FA3_SCHEDULE"]
        return
    show("8/1 x 512 x 4k", attention(8, 1, 512, 4096), row_tiles=32)
    # The same call with the opt-in fused split merge (v10): its merging CTAs' epilogue is the merge.
    os.environ["DDTREE_TA_FA3_FUSED_MERGE"] = "1"
    show("8/1 x 512 x 4k, fused merge", attention(8, 1, 512, 4096), row_tiles=32)
    del os.environ["DDTREE_TA_FA3_FUSED_MERGE"]
    # ... and with the opt-in cost-weighted chunk boundaries (masked tiles count 6/4 of a context tile).
    os.environ["DDTREE_TA_FA3_BALANCE"] = "6"
    show("8/1 x 512 x 4k, balanced chunks (6)", attention(8, 1, 512, 4096), row_tiles=32)
    del os.environ["DDTREE_TA_FA3_BALANCE"]
    show("8/1 x 64 x 4k", attention(8, 1, 64, 4096))
    show("64/8 x 64 x 4k", attention(64, 8, 64, 4096))
    show("64/8 x 512 x 4k", attention(64, 8, 512, 4096))


if __name__ == "__main__":
    main()
