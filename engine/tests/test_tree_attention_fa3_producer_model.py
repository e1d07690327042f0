"""CPU model of the fa3 tree-attention producer's copies (include/ddtree/kernels/tree_attention/fa3_*): the v7 mapping
of 16-byte copies onto the 128-byte-swizzled K/V tile (issue(), cache_row()) and the producer ring's counters, checked
line for line against the layout the consumers read. Split from test_tree_attention_fa3_model.py (the protocol and
arithmetic-order models) to keep each file under 500 lines."""
from __future__ import annotations

import random

import pytest


# ---- producer copies (v7 mapping: issue(), cache_row() and the producer loop's counters) -------------
def swz128(r: int, c: int) -> int:
    """swz<128>(r, c): 64-column panels of 128-byte rows, 16-byte chunk index XOR row % 8."""
    return (c >> 3) * 128 * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4)


def producer_copies(tid: int, kt: int, kv_len: int, rows_of_tile: list[int], h: int, pitch: int,
                    ) -> list[tuple[int, int, bool, bool]]:
    """Transcription of the kernel's issue() for producer thread tid: the s_rows slot each thread
    writes (rows_slot), the 8 rows it reads back ([cp_g][i]), and its 16 copies as
    (smem byte offset in the stage, source byte offset from the cache base, zero-fill, fast branch)."""
    s_rows = [None] * 128
    for t in range(128):  # every producer thread stores the cache row of key t (0 past the length)
        slot = (t & 15) * 8 + ((t & 127) >> 4)
        assert s_rows[slot] is None
        s_rows[slot] = rows_of_tile[t] if kt + t < kv_len else 0
    cp_g, cp_s = (tid & 127) >> 3, tid & 7
    src0 = (h * 128 + cp_s * 8) * 2
    dst0 = swz128(cp_g, cp_s)
    rr = s_rows[cp_g * 8: cp_g * 8 + 8]
    lim = kv_len - kt - cp_g
    full = lim > 128 - 16
    out = []
    for i in range(8):
        src = src0 + rr[i] * pitch  # mad.wide.u32: exact
        zero = False if full else 16 * i >= lim
        out.append((dst0 + i * 2048, src, zero, full))
        out.append((dst0 + i * 2048 + 16384, src + 128, zero, full))
    return out


@pytest.mark.parametrize("kv_rest", [1, 5, 16, 17, 100, 112, 113, 127, 128, 129, 1000])
def test_producer_copy_mapping_covers_the_swizzled_tile(kv_rest: int) -> None:
    """Every (key row, 16-byte chunk) of a K/V tile is written exactly once, at its swizzled place,
    from its own cache row (head h, chunk c); rows past the length are zero-filled (never read) and
    rows inside it never are; the predicate-free branch is taken only when all 8 rows exist."""
    rng = random.Random(kv_rest)
    kt, h, hkv = 4096, 3, 8
    pitch = hkv * 128 * 2
    kv_len = kt + kv_rest
    rows_of_tile = [rng.randrange(0, 1 << 20) for _ in range(128)]
    seen: dict[int, tuple[int, bool]] = {}
    by_thread = {tid: producer_copies(tid, kt, kv_len, rows_of_tile, h, pitch) for tid in range(128)}
    for tid, copies in by_thread.items():
        for dst, src, zero, full in copies:
            assert dst not in seen, "two copies write one chunk"
            seen[dst] = (src, zero)
            if full:
                assert kt + ((tid & 127) >> 3) + 112 < kv_len, "fast branch with a row past the length"
    assert sorted(seen) == list(range(0, 128 * 128 * 2, 16)), "the tile is not covered"
    for r in range(128):
        for c in range(16):
            src, zero = seen[swz128(r, c)]
            assert zero == (kt + r >= kv_len), (r, c)
            if not zero:
                assert src == rows_of_tile[r] * pitch + h * 256 + c * 16, (r, c)
            else:
                assert 0 <= src < pitch, "zero-filled copies still form a valid (row 0) address"


def test_producer_copy_warp_instructions_are_whole_lines() -> None:
    """One warp instruction (copy k of all 32 lanes) reads 4 whole, aligned 128-byte half rows (4 L2
    lines, as the v6 mapping did) and writes 4 whole 128-byte shared-memory rows (no bank conflict)."""
    pitch, h = 8 * 256, 5
    rows = list(range(1000, 1128))
    for warp in range(4):
        per_lane = [producer_copies(warp * 32 + lane, 0, 1 << 20, rows, h, pitch) for lane in range(32)]
        for k in range(16):
            srcs = sorted(per_lane[lane][k][1] for lane in range(32))
            dsts = sorted(per_lane[lane][k][0] for lane in range(32))
            lines = {s // 128 for s in srcs}
            assert len(lines) == 4 and all(s % 16 == 0 for s in srcs)
            assert srcs == sorted(ln * 128 + 16 * q for ln in lines for q in range(8))
            srows = {d // 128 for d in dsts}
            assert len(srows) == 4 and dsts == sorted(sr * 128 + 16 * q for sr in srows for q in range(8))


@pytest.mark.parametrize("npre", [0, 1, 2])
@pytest.mark.parametrize("n_tiles", [1, 2, 3, 4, 7, 10])
def test_producer_ring_counters_match_the_modular_formulas(npre: int, n_tiles: int) -> None:
    """The producer loop's incremental (st, ph, sv, phv, kt_prev) give the same stages, s_rows buffers,
    empty-barrier parities and tile starts as v6's j % 3, (j / 3 - 1) & 1 and the tile list, after a
    prologue that ran steps 0 .. npre-1 (v8: npre = 2 when tiles 0 and 1 are context tiles)."""
    if npre > n_tiles:
        pytest.skip("the prologue runs only steps of tiles that exist")
    tiles = [1000 + 384 * t for t in range(n_tiles)]  # any increasing tile starts (skips allowed)
    want, got = [], []
    # v6 order: step j issues K_j (stage j % 3, wait parity (j/3 - 1) & 1 if j >= 3), then V_{j-1}.
    for j in range(n_tiles + 1):
        if j < n_tiles:
            want.append(("K", j % 3, ((j // 3) - 1) & 1 if j >= 3 else None, tiles[j]))
        if j >= 1:
            jv = j - 1
            want.append(("V", jv % 3, ((jv // 3) - 1) & 1 if jv >= 3 else None, tiles[jv]))
    # v8 transcription. Prologue: K_0 when npre >= 1; K_1, then V_0 when npre == 2 (stages fresh).
    if npre >= 1:
        got.append(("K", 0, None, tiles[0]))
    if npre == 2:
        got.append(("K", 1, None, tiles[1]))
        got.append(("V", 0, None, tiles[0]))
    j = npre
    st, ph, phv = j, 0, 0
    sv = j - 1 if j >= 1 else 0
    kt_prev = tiles[j - 1] if j >= 1 else tiles[0]
    it = iter(tiles[j:])
    kt = next(it, None)
    if j == 1 and kt is None:
        got.append(("V", 0, None, tiles[0]))
    while kt is not None:
        kn = next(it, None)
        got.append(("K", st, (ph ^ 1) if j >= 3 else None, kt))
        if j >= 1:
            got.append(("V", sv, (phv ^ 1) if j - 1 >= 3 else None, kt_prev))
        sv, phv, kt_prev = st, ph, kt
        st += 1
        if st == 3:
            st, ph = 0, ph ^ 1
        kt = kn
        j += 1
    if j >= 1 and not (npre == 1 and j == 1):
        got.append(("V", sv, (phv ^ 1) if j - 1 >= 3 else None, kt_prev))
    assert got == want
