"""CPU models of the fa3 tree-attention back end (include/ddtree/kernels/tree_attention_fa3.cuh).

Nobody could run that kernel before it was committed, so two of its parts are modelled here line for
line and checked on the CPU:

* the synchronization protocol: a producer filling a K ring and a V ring of 3 stages each (full/empty
  mbarriers with parity waits; K of tile j, then V of tile j-1; the copies land asynchronously, in
  issue order, and arrive on the full barrier then) and two consumer warpgroups ping-ponging on two
  named barriers, releasing K_j once S_j is done and V_j once P_j V_j is done, stepped in random
  interleavings. Every run must terminate (no deadlock), a stage must never be refilled while a
  consumer still reads it, a consumer must only read a stage that holds the tile it expects and was
  published, and every named-barrier arrival must be matched;
* the arithmetic order: the CTA-wide tree-tile mask (the same bit manipulation as the kernel), the
  tile sequence, masking, and the online softmax whose O rescale is deferred by one tile (tile j's
  correction is applied just before P_j V_j is added, while S_{j+1} is in flight), plus the fixed-order
  chunk merge. Compared against the fp32 reference on random trees.
"""
from __future__ import annotations

import random
import sys
from collections.abc import Callable

import pytest
import torch

from ddtree_engine.reference import tree_attention as _ref_fn  # noqa: F401  (binds the name)

ref = sys.modules["ddtree_engine.reference.tree_attention"]

STAGES = 3
BN = 128


# ---- synchronization protocol ---------------------------------------------------------------------
class MBarrier:
    def __init__(self, count: int) -> None:
        self.count, self.pending, self.completed = count, count, 0

    def arrive(self) -> None:
        self.pending -= 1
        assert self.pending >= 0
        if self.pending == 0:
            self.completed += 1
            self.pending = self.count

    def ready(self, parity: int) -> bool:  # mbarrier.try_wait.parity / test_wait.parity
        return self.completed % 2 != parity


class NamedBarrier:  # bar.sync / bar.arrive with 256 threads = two warpgroups
    def __init__(self) -> None:
        self.arrived, self.generation = 0, 0

    def arrive(self) -> int:
        gen = self.generation
        self.arrived += 1
        if self.arrived == 2:
            self.arrived, self.generation = 0, self.generation + 1
        return gen


def simulate(n_tiles: int, rng: random.Random) -> None:
    # One "arrive" on a full barrier models the 128 producer threads' cp.async.mbarrier.arrive; one on
    # an empty barrier models the 4 warps of a consumer warpgroup.
    full = {r: [MBarrier(1) for _ in range(STAGES)] for r in "KV"}
    empty = {r: [MBarrier(2) for _ in range(STAGES)] for r in "KV"}
    bars = {1: NamedBarrier(), 2: NamedBarrier()}
    stage_tile = {r: [-1] * STAGES for r in "KV"}
    published = {r: [False] * STAGES for r in "KV"}
    readers = {r: [set() for _ in range(STAGES)] for r in "KV"}  # consumers still reading the stage
    in_flight: list[tuple[str, int]] = []  # issued copies; they land (and arrive) in issue order

    def fill(ring: str, tile: int):
        s = tile % STAGES
        if tile >= STAGES:
            par = (tile // STAGES - 1) & 1
            while not empty[ring][s].ready(par):
                yield
        assert not readers[ring][s], f"{ring} stage {s} refilled with tile {tile} while {readers[ring][s]} read it"
        stage_tile[ring][s], published[ring][s] = tile, False
        in_flight.append((ring, tile))  # cp.async issued, then cp.async.mbarrier.arrive.noinc

    def producer():
        for j in range(n_tiles):
            yield  # the block-table rows of tile j go through shared memory (producer-only barrier)
            yield from fill("K", j)
            if j >= 1:
                yield from fill("V", j - 1)
        if n_tiles:
            yield from fill("V", n_tiles - 1)

    def landing():  # the copies complete asynchronously, in order, at random times
        while True:
            if in_flight and rng.random() < 0.5:
                ring, tile = in_flight.pop(0)
                s = tile % STAGES
                assert stage_tile[ring][s] == tile
                published[ring][s] = True
                full[ring][s].arrive()
            yield

    def consumer(c: int):
        def wait_full(ring: str, tile: int):
            s = tile % STAGES
            while not full[ring][s].ready((tile // STAGES) & 1):
                yield
            assert stage_tile[ring][s] == tile and published[ring][s], f"consumer {c} reads {ring}{tile}"
            readers[ring][s].add(c)

        def use(ring: str, tile: int) -> None:  # a wgmma reads the stage: it must still hold the tile
            s = tile % STAGES
            assert stage_tile[ring][s] == tile and c in readers[ring][s], f"consumer {c} uses {ring}{tile} after release"

        def release(ring: str, tile: int) -> None:
            readers[ring][tile % STAGES].discard(c)
            empty[ring][tile % STAGES].arrive()

        def sync(bar_id: int):
            gen = bars[bar_id].arrive()
            while bars[bar_id].generation == gen:
                yield

        if n_tiles == 0:
            return
        if c == 1:
            bars[1].arrive()
        for it in range(n_tiles):
            last = it == n_tiles - 1
            yield from wait_full("K", it)
            if it >= 2:  # wait_group 0 at the top of the iteration: P V of tile it-2 is done
                release("V", it - 2)
            yield from sync(1 + c)
            use("K", it)  # S_it reads K of tile it
            if it >= 1:
                # v8 (FA3's order): V of tile it-1 is waited for after S_it went out, inside this
                # warpgroup's turn (the other one waits for the arrival below meanwhile).
                yield from wait_full("V", it - 1)
                use("V", it - 1)  # P_{it-1} V_{it-1} reads V of tile it-1
            yield  # both products in flight
            if not (c == 1 and last):
                bars[2 - c].arrive()
            yield  # wait_group 1: S_it is done
            release("K", it)
            yield  # softmax overlaps the other warpgroup's GEMMs and this one's P V
        yield from wait_full("V", n_tiles - 1)
        if n_tiles >= 2:
            release("V", n_tiles - 2)
        use("V", n_tiles - 1)
        yield  # last P V in flight
        release("V", n_tiles - 1)

    actors = [producer(), consumer(0), consumer(1)]
    land = landing()
    steps = 0
    while actors:
        a = rng.choice(actors + [land])
        try:
            next(a)
        except StopIteration:
            actors.remove(a)
        steps += 1
        assert steps < 100000, f"deadlock with {n_tiles} tiles"
    assert not in_flight, "copies issued but never waited for"
    assert bars[1].arrived == 0 and bars[2].arrived == 0, "unmatched named-barrier arrival"
    assert all(not r for ring in "KV" for r in readers[ring])


@pytest.mark.parametrize("n_tiles", [0, 1, 2, 3, 4, 5, 7, 12, 31])
def test_pipeline_protocol_random_interleavings(n_tiles: int) -> None:
    rng = random.Random(n_tiles)
    for _ in range(300):
        simulate(n_tiles, rng)


# ---- arithmetic order -----------------------------------------------------------------------------
def tile_mask(anc_rows: list[list[int]] | None, nodes: list[int], ctx: int, n_b: int) -> int:
    """The kernel's CTA-wide mask of tree tiles (bit t = tile starting at tb0 + t*BN) for its rows."""
    tb0 = (ctx // BN) * BN
    tiles = 0
    for node in nodes:
        if anc_rows is None:
            for j in range(0, node + 1, 32):
                lo = (ctx + j - tb0) // BN
                hi = (ctx + min(j + 31, node) - tb0) // BN
                for t in range(lo, hi + 1):
                    tiles |= 1 << t
            continue
        row = anc_rows[node]
        for w in range((n_b + 31) // 32):
            word = row[w] & 0xFFFFFFFF
            rem = n_b - w * 32
            if rem < 32:
                word &= (1 << rem) - 1
            if not word:
                continue
            ta = (ctx + w * 32 - tb0) // BN
            split_bit = (ta + 1) * BN + tb0 - ctx - w * 32
            low = word if split_bit >= 32 else word & ((1 << split_bit) - 1)
            if low:
                tiles |= 1 << ta
            if word & ~low:
                tiles |= 1 << (ta + 1)
    return tiles


def strided_first(kv_len: int, nact: int, split: int) -> tuple[int, int]:
    """fa3_strided_first (v17): the first key of split `split` and r_keys (keys of the partial round)."""
    t = (kv_len + BN - 1) // BN
    r = t % nact
    first = kv_len if split >= nact else (nact - 1 - split + (r if split < nact - r else 0)) * BN
    return first, r * BN


def strided_adv(k0: int, r_keys: int, nact: int) -> int:
    """The kernel's adv() under the strided schedule: the split's next tile after the one at key k0."""
    return k0 + (r_keys if k0 < r_keys else nact * BN)


def split_ranges(kv_len: int, chunk: int, schedule: str) -> list[tuple[int, int, Callable[[int], int]]]:
    """(first key, end, advance) of each split of a request, as the kernel walks them (before tile skips)."""
    nact = (kv_len + chunk - 1) // chunk
    out = []
    for split in range(nact):
        if schedule == "chunked":
            out.append((split * chunk, min(split * chunk + chunk, kv_len), lambda k0: k0 + BN))
        else:
            first, r_keys = strided_first(kv_len, nact, split)
            out.append((first, kv_len, lambda k0, r_keys=r_keys: strided_adv(k0, r_keys, nact)))
    return out


def fa3_request(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, vis: torch.Tensor, ctx: int,
                anc_rows: list[list[int]] | None, chunk: int, scale: float,
                schedule: str = "chunked") -> tuple[torch.Tensor, torch.Tensor]:
    """One request, one kv head, all rows in one CTA per split: o [R, D] and lse [R] (natural log)."""
    rows, n_b = q.shape[0], vis.shape[0]
    nodes = list(range(n_b))
    kv_len = k.shape[0]
    mask = tile_mask(anc_rows, nodes, ctx, n_b)
    tb0 = (ctx // BN) * BN
    g = rows // n_b
    node_of = torch.arange(rows) // g
    log2e = 1.4426950408889634
    parts = []
    for c_begin, c_end, adv in split_ranges(kv_len, chunk, schedule):

        def next_tile(k0: int, c_end: int = c_end, adv: Callable[[int], int] = adv) -> int:
            while k0 < c_end and k0 >= ctx and not (mask >> ((k0 - tb0) // BN)) & 1:
                k0 = adv(k0)
            return k0

        m = torch.full((rows,), float("-inf"))
        l_sum = torch.zeros(rows)
        acc = torch.zeros(rows, q.shape[1])
        corr = torch.ones(rows)
        p_prev = v_prev = None
        kt = next_tile(c_begin)
        while kt < c_end:
            keys = torch.arange(kt, kt + BN)
            ok = keys < kv_len
            kk = torch.zeros(BN, q.shape[1])
            vv = torch.zeros(BN, q.shape[1])
            kk[ok], vv[ok] = k[keys[ok]], v[keys[ok]]
            s = q @ kk.T
            if kt + BN > ctx:
                seen = torch.zeros(rows, BN, dtype=torch.bool)
                seen[:, keys < ctx] = True
                tree = (keys >= ctx) & ok
                seen[:, tree] = vis[node_of][:, keys[tree] - ctx]
                s = s.masked_fill(~seen, float("-inf"))
            if p_prev is not None:  # deferred: the previous tile's correction, then its P V
                acc = acc * corr[:, None] + p_prev @ v_prev
            mx = s.max(dim=1).values * scale * log2e
            m_new = torch.maximum(m, mx)
            corr = torch.where(m == float("-inf"), torch.zeros(rows), torch.exp2(m - m_new))
            m_use = torch.where(m_new == float("-inf"), torch.zeros(rows), m_new)
            p = torch.exp2(s * scale * log2e - m_use[:, None])
            l_sum = l_sum * corr + p.sum(dim=1)
            m = m_new
            p_prev, v_prev = p, vv
            kt = next_tile(adv(kt))
        if p_prev is not None:
            acc = acc * corr[:, None] + p_prev @ v_prev
        parts.append((acc, m, l_sum))
    # merge in chunk order (tree_attention_merge_kernel)
    mx = torch.stack([pm for _, pm, _ in parts]).max(dim=0).values
    w = [torch.where(mx == float("-inf"), torch.zeros(rows), torch.exp2(pm - mx)) for _, pm, _ in parts]
    lsum = sum(pl * wi for (_, _, pl), wi in zip(parts, w))
    o = sum(pa * wi[:, None] for (pa, _, _), wi in zip(parts, w))
    valid = (lsum > 0) & vis.any(dim=1)[node_of]
    o = torch.where(valid[:, None], o / lsum.clamp_min(1e-30)[:, None], torch.zeros_like(o))
    lse = torch.where(valid, (mx + torch.log2(lsum.clamp_min(1e-30))) / log2e, torch.full((rows,), float("-inf")))
    return o, lse


# (GQA group, ctx, nodes, padding nodes, chunk): many tiles per chunk (the deferred rescale runs
# for real), tree tiles straddling tile and chunk edges, skipped tiles, ctx 0, single nodes.
SHAPES = [(3, 1000, 130, 0, 4096), (1, 700, 64, 3, 256), (8, 0, 33, 2, 128), (1, 5, 2, 0, 4096),
          (2, 2000, 40, 0, 1024), (1, 300, 130, 3, 4096), (4, 127, 1, 0, 128), (1, 1, 260, 0, 4096)]


@pytest.mark.parametrize("schedule", ["chunked", "strided"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_fa3_arithmetic_order_matches_reference(shape: tuple[int, int, int, int, int], causal: bool,
                                                 schedule: str) -> None:
    g, ctx, n, n_pad, chunk = shape
    seed = sum(shape)
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    d = 16
    parents = [-1] + [rng.randrange(max(0, i - 5), i) for i in range(1, n)] + [-1] * n_pad
    nt = n + n_pad
    anc = ref.anc_from_parents(torch.tensor([parents]))
    vis = ref.visibility(0, nt, None if causal else anc[0])[:, :]  # [nt, nt] tree part (ctx = 0)
    anc_rows = None if causal else anc[0].tolist()
    length = ctx + nt
    q = torch.randn(nt * g, d, generator=gen)
    k = torch.randn(length, d, generator=gen)
    v = torch.randn(length, d, generator=gen)
    scale = d ** -0.5
    o, lse = fa3_request(q, k, v, vis, ctx, anc_rows, chunk, scale, schedule)
    # reference: same data as a one-request, one-kv-head paged cache with page size 1
    k_cache = k.view(length, 1, 1, d)
    v_cache = v.view(length, 1, 1, d)
    bt = torch.arange(length, dtype=torch.int32).view(1, -1)
    o_ref, lse_ref = ref.tree_attention(q.view(nt, g, d), k_cache, v_cache, torch.tensor([0, nt], dtype=torch.int32),
                                        bt, torch.tensor([ctx], dtype=torch.int32), None if causal else anc, scale)
    o_ref, lse_ref = o_ref.view(nt * g, d), lse_ref.view(nt * g)
    pad = torch.isneginf(lse_ref)
    assert torch.equal(torch.isneginf(lse), pad)
    assert torch.all(o[pad] == 0)
    torch.testing.assert_close(o[~pad], o_ref[~pad], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(lse[~pad], lse_ref[~pad], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("kv_len", [1, 127, 128, 129, 1000, 4160, 4608, 66048])
def test_strided_schedule_deals_every_tile_once_and_the_tree_tiles_apart(kv_len: int) -> None:
    """v17: under the strided schedule the splits' tiles are a partition of the request's tiles, each
    split's in increasing order and non-empty; the last tile goes to a split without a partial-round tile;
    the last nact tiles (where the tree sits) go one to a split; and no split holds more than ceil(T / nact)."""
    t_all = (kv_len + BN - 1) // BN
    for chunk in sorted({BN, 256, 384, 640, 1152, 1280, 4096, 16512} | {BN * max(1, t_all // 4)}):
        nact = (kv_len + chunk - 1) // chunk
        r = t_all % nact
        seen: list[int] = []
        last_owner, partial_owners = -1, set()
        for split, (first, end, adv) in enumerate(split_ranges(kv_len, chunk, "strided")):
            tiles, k0 = [], first
            while k0 < end:
                tiles.append(k0 // BN)
                k0 = adv(k0)
            assert tiles, f"split {split} of {nact} got no tile (kv_len {kv_len}, chunk {chunk})"
            assert tiles == sorted(tiles)
            assert len(tiles) <= -(-t_all // nact)
            assert len({t % nact for t in tiles if t >= r}) == 1  # one residue: the tiles are nact apart
            if tiles[0] < r:
                partial_owners.add(split)
            if t_all - 1 in tiles:
                last_owner = split
            assert len([t for t in tiles if t >= t_all - nact]) == 1
            seen += tiles
        assert sorted(seen) == list(range(t_all))
        assert last_owner not in partial_owners
        assert len(partial_owners) == r
        # a split past the request's length (an idle member of a merging cluster) gets no tile
        assert strided_first(kv_len, nact, nact)[0] == kv_len


# ---- per-tile visibility words (tile_visibility in the kernel) ---------------------------------------
def tile_visibility(anc_row: list[int] | None, live: bool, node: int, kt: int, ctx: int, n_b: int) -> list[int]:
    """Line-for-line transcription of tile_visibility(): 4 words, bit c of word c // 32 = key kt + c."""
    m32 = 0xFFFFFFFF
    j0 = kt - ctx
    if not live:
        return [0, 0, 0, 0]
    if anc_row is None:
        nc = min(max(node - j0 + 1, 0), 128)
        return [m32 if (m := min(max(nc - 32 * k, 0), 32)) >= 32 else (1 << m) - 1 for k in range(4)]
    wlo = int((j0 if j0 >= 0 else j0 - 31) / 32)  # C++ division truncates toward zero
    sh = j0 - 32 * wlo
    assert 0 <= sh < 32 and wlo >= -4
    nbw = (n_b + 31) // 32
    wv = []
    for k in range(5):
        w = wlo + k
        x = anc_row[min(max(w, 0), nbw - 1)] & m32
        rem = n_b - 32 * w
        keep = 0 if (w < 0 or rem <= 0) else (m32 if rem >= 32 else (1 << rem) - 1)
        wv.append(x & keep)
    nc = min(max(-j0, 0), 128)
    out = []
    for k in range(4):
        m = min(max(nc - 32 * k, 0), 32)
        funnel = ((wv[k + 1] << 32 | wv[k]) >> sh) & m32  # __funnelshift_r(lo, hi, sh)
        out.append(funnel | (m32 if m >= 32 else (1 << m) - 1))
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_tile_visibility_words_match_reference(seed: int, causal: bool) -> None:
    rng = random.Random(seed)
    n_b = rng.choice([1, 2, 31, 32, 33, 64, 100, 130, 257])
    n_max = n_b + rng.choice([0, 5, 40])
    ctx = rng.choice([0, 1, 31, 127, 128, 129, 1000, 4096])
    parents = [-1] + [rng.randrange(max(0, i - 7), i) for i in range(1, n_b)] + [-1] * (n_max - n_b)
    anc = ref.anc_from_parents(torch.tensor([parents]))[0]
    vis = ref.visibility(0, n_b, None if causal else anc)  # [n_b, n_b] tree part
    tb0 = (ctx // BN) * BN
    for node in range(n_b):
        row = None if causal else anc[node].tolist()
        for kt in range(tb0, ctx + n_b, BN):
            words = tile_visibility(row, True, node, kt, ctx, n_b)
            for col in range(BN):
                j = kt + col - ctx
                want = j < 0 or (j < n_b and bool(vis[node, j]))
                got = bool((words[col // 32] >> (col % 32)) & 1)
                assert got == want, (node, kt, col, ctx, n_b)
    assert tile_visibility(None, False, 0, tb0, ctx, n_b) == [0, 0, 0, 0]
