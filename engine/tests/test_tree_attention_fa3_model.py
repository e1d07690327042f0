"""CPU models of the fa3 tree-attention back end (include/ddtree/kernels/tree_attention_fa3.cuh).

Nobody could run that kernel before it was committed, so two of its parts are modelled here line for
line and checked on the CPU:

* the synchronization protocol: a producer filling a 3-stage ring (full/empty mbarriers with parity
  waits, the "publish the landed tile before blocking" rule) and two consumer warpgroups ping-ponging
  on two named barriers, stepped in random interleavings. Every run must terminate (no deadlock), a
  stage must never be refilled while a consumer still reads it, a consumer must only read a stage that
  holds the tile it expects and was published, and every named-barrier arrival must be matched;
* the arithmetic order: the CTA-wide tree-tile mask (the same bit manipulation as the kernel), the
  tile sequence, masking, and the online softmax whose O rescale is deferred by one tile (tile j's
  correction is applied just before P_j V_j is added, while S_{j+1} is in flight), plus the fixed-order
  chunk merge. Compared against the fp32 reference on random trees.
"""
from __future__ import annotations

import random
import sys

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
    full = [MBarrier(1) for _ in range(STAGES)]   # one "arrive" models the 128 producer threads
    empty = [MBarrier(2) for _ in range(STAGES)]  # one "arrive" per consumer warpgroup (128 threads each)
    bars = {1: NamedBarrier(), 2: NamedBarrier()}
    stage_tile = [-1] * STAGES
    published = [False] * STAGES
    readers = [set() for _ in range(STAGES)]  # consumers still reading the stage's current tile

    def producer():
        pending = False
        it = 0
        for it in range(n_tiles):
            s = it % STAGES
            if it >= STAGES:
                par = (it // STAGES - 1) & 1
                if pending and not empty[s].ready(par):
                    publish(it - 1)
                    pending = False
                while not empty[s].ready(par):
                    yield
            assert not readers[s], f"stage {s} refilled with tile {it} while {readers[s]} read tile {stage_tile[s]}"
            stage_tile[s], published[s] = it, False
            yield  # cp.async in flight
            if pending:
                publish(it - 1)
            pending = True
        if pending:
            publish(n_tiles - 1)

    def publish(tile: int) -> None:
        s = tile % STAGES
        assert stage_tile[s] == tile
        published[s] = True
        full[s].arrive()

    def consumer(c: int):
        def acquire(tile: int) -> None:
            s = tile % STAGES
            assert stage_tile[s] == tile and published[s], f"consumer {c} reads tile {tile} from stage {s}"
            readers[s].add(c)

        def use(tile: int) -> None:  # a wgmma reads the stage: it must still hold the tile, held by us
            s = tile % STAGES
            assert stage_tile[s] == tile and c in readers[s], f"consumer {c} uses tile {tile} after release"

        def release(tile: int) -> None:
            readers[tile % STAGES].discard(c)
            empty[tile % STAGES].arrive()

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
            s = it % STAGES
            while not full[s].ready((it // STAGES) & 1):
                yield
            acquire(it)
            if it >= 2:  # wait_group 0 at the top of the iteration: P V of tile it-2 is done
                release(it - 2)
            yield from sync(1 + c)
            use(it)  # S_it reads K of tile it
            if it >= 1:
                use(it - 1)  # P_{it-1} V_{it-1} reads V of tile it-1
            yield  # both products in flight
            if not (c == 1 and last):
                bars[2 - c].arrive()
            yield  # softmax overlaps the other warpgroup's GEMMs and this one's P V
        if n_tiles >= 2:
            release(n_tiles - 2)
        use(n_tiles - 1)
        yield  # last P V in flight
        release(n_tiles - 1)

    actors = [producer(), consumer(0), consumer(1)]
    steps = 0
    while actors:
        a = rng.choice(actors)
        try:
            next(a)
        except StopIteration:
            actors.remove(a)
        steps += 1
        assert steps < 100000, f"deadlock with {n_tiles} tiles"
    assert bars[1].arrived == 0 and bars[2].arrived == 0, "unmatched named-barrier arrival"
    assert all(not r for r in readers)


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


def fa3_request(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, vis: torch.Tensor, ctx: int,
                anc_rows: list[list[int]] | None, chunk: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One request, one kv head, all rows in one CTA per chunk: o [R, D] and lse [R] (natural log)."""
    rows, n_b = q.shape[0], vis.shape[0]
    nodes = list(range(n_b))
    kv_len = k.shape[0]
    mask = tile_mask(anc_rows, nodes, ctx, n_b)
    tb0 = (ctx // BN) * BN
    g = rows // n_b
    node_of = torch.arange(rows) // g
    log2e = 1.4426950408889634
    parts = []
    for c_begin in range(0, kv_len, chunk):
        c_end = min(c_begin + chunk, kv_len)

        def next_tile(k0: int) -> int:
            while k0 < c_end and k0 >= ctx and not (mask >> ((k0 - tb0) // BN)) & 1:
                k0 += BN
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
            kt = next_tile(kt + BN)
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


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_fa3_arithmetic_order_matches_reference(shape: tuple[int, int, int, int, int], causal: bool) -> None:
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
    o, lse = fa3_request(q, k, v, vis, ctx, anc_rows, chunk, scale)
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
