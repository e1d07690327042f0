"""CPU tests of the reference build_tree (the best-first heap that the CUDA kernel must reproduce).

Golden trees are worked out by hand (expected outputs are literals); the randomized tests check the
tree invariants and compare the heap's pop order with a brute-force sort of every candidate by
(score desc, rank tuple asc), scores computed by the same fp64 recurrence the heap uses."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from ddtree_engine.reference.build_tree import BuildTreeOutput, build_tree, heap_pop_order

NEG_INF = -math.inf


def _run(lp: list[list[float]], budget: int, n_max: int, ids: list[list[int]] | None = None,
         root: int = 99, ctx: int = 100) -> BuildTreeOutput:
    k = len(lp[0])
    if ids is None:  # token = 10 * depth + rank keeps the expected tokens readable
        ids = [[10 * (d + 1) + r for r in range(k)] for d in range(len(lp))]
    return build_tree(
        torch.tensor([lp], dtype=torch.float32),
        torch.tensor([ids], dtype=torch.int32),
        torch.tensor([root], dtype=torch.int32),
        torch.tensor([ctx], dtype=torch.int32),
        torch.tensor([budget], dtype=torch.int32),
        n_max,
    )


def _row(t: torch.Tensor) -> list[int]:
    return [int(x) for x in t[0].tolist()]


# ---- golden trees (worked out by hand) ----------------------------------------------------------

# K=2, L=3, dyadic log-probs (exact in fp64). Candidate scores:
#   (0) -0.5  (1) -1.0 | (0,0) -0.75  (0,1) -2.5  (1,0) -1.25  (1,1) -3.0
#   (0,0,0) -1.75  (0,0,1) -2.25  (1,0,0) -2.25  (1,0,1) -2.75 ...
# Pop order: (0) (0,0) (1) (1,0) (0,0,0) then the tie at -2.25: (0,0,1) before (1,0,0) (lexicographic),
# then (0,1) -2.5.
GOLDEN_LP = [[-0.5, -1.0], [-0.25, -2.0], [-1.0, -1.5]]


def test_golden_three_levels_with_a_tie() -> None:
    out = _run(GOLDEN_LP, budget=7, n_max=10)
    assert int(out.num_nodes[0]) == 8
    assert _row(out.node_token) == [99, 10, 20, 11, 20, 30, 31, 30, -1, -1]
    assert _row(out.node_parent) == [-1, 0, 1, 0, 3, 2, 2, 4, -1, -1]
    assert _row(out.node_depth) == [0, 1, 2, 1, 2, 3, 3, 3, 0, 0]
    assert _row(out.positions) == [100, 101, 102, 101, 102, 103, 103, 103, 100, 100]
    assert [w[0] for w in out.anc[0].tolist()] == [1, 3, 7, 9, 25, 39, 71, 153, 0, 0]
    assert _row(out.first_child) == [1, 2, 5, 4, 7, -1, -1, -1, -1, -1]
    assert _row(out.next_sibling) == [-1, 3, -1, -1, -1, 6, -1, -1, -1, -1]


def test_golden_one_more_node_adds_the_next_best() -> None:
    out = _run(GOLDEN_LP, budget=8, n_max=10)
    assert int(out.num_nodes[0]) == 9
    assert _row(out.node_parent)[:9] == [-1, 0, 1, 0, 3, 2, 2, 4, 1]
    assert _row(out.node_token)[8] == 21
    assert _row(out.next_sibling)[2] == 8  # (0,0) -> (0,1)
    assert out.anc[0, 8, 0].item() == 0b100000011


def test_tie_prefers_a_prefix_over_a_later_rank() -> None:
    # (1) and (0,0) both score -2.0: (0,0) < (1) lexicographically, so (0,0) pops first.
    out = _run([[-1.0, -2.0], [-1.0, -3.0]], budget=4, n_max=5)
    assert _row(out.node_parent) == [-1, 0, 1, 0, 3]
    assert _row(out.node_token) == [99, 10, 20, 11, 20]
    assert _row(out.node_depth) == [0, 1, 2, 1, 2]


def test_equal_log_probs_order_by_rank_tuple() -> None:
    out = _run([[-1.0, -1.0], [-1.0, -1.0]], budget=6, n_max=7)
    assert _row(out.node_parent) == [-1, 0, 0, 1, 1, 2, 2]
    assert _row(out.node_token) == [99, 10, 11, 20, 21, 20, 21]
    assert _row(out.first_child) == [1, 3, 5, -1, -1, -1, -1]
    assert _row(out.next_sibling) == [-1, 2, -1, 4, -1, 6, -1]


def test_all_zero_log_probs_give_depth_first_order() -> None:
    # Every score is 0: pure lexicographic order = depth-first preorder.
    out = _run([[0.0, 0.0]] * 3, budget=14, n_max=15)
    #          ()  (0) (00) (000) (001) (01) (010) (011) (1) (10) (100) (101) (11) (110) (111)
    assert _row(out.node_parent) == [-1, 0, 1, 2, 2, 1, 5, 5, 0, 8, 9, 9, 8, 12, 12]
    assert _row(out.node_depth) == [0, 1, 2, 3, 3, 2, 3, 3, 1, 2, 3, 3, 2, 3, 3]


def test_k1_is_a_chain_and_stops_when_candidates_run_out() -> None:
    out = _run([[-0.1], [-0.2], [-0.3], [-0.4]], budget=10, n_max=12)
    assert int(out.num_nodes[0]) == 5
    assert _row(out.node_parent) == [-1, 0, 1, 2, 3] + [-1] * 7
    assert _row(out.node_token) == [99, 10, 20, 30, 40] + [-1] * 7
    assert _row(out.first_child) == [1, 2, 3, 4] + [-1] * 8
    assert _row(out.next_sibling) == [-1] * 12
    assert [w[0] for w in out.anc[0].tolist()] == [1, 3, 7, 15, 31] + [0] * 7


def test_l1_is_a_star_of_the_best_ranks() -> None:
    out = _run([[-0.5, -1.0, -1.5, -2.0, -2.5]], budget=3, n_max=4, ids=[[7, 3, 9, 1, 5]])
    assert _row(out.node_token) == [99, 7, 3, 9]
    assert _row(out.node_parent) == [-1, 0, 0, 0]
    assert _row(out.next_sibling) == [-1, 2, 3, -1]
    assert _row(out.first_child) == [1, -1, -1, -1]


def test_budget_zero_is_root_only() -> None:
    out = _run(GOLDEN_LP, budget=0, n_max=4, ctx=0)
    assert int(out.num_nodes[0]) == 1
    assert _row(out.node_token) == [99, -1, -1, -1]
    assert _row(out.node_parent) == [-1, -1, -1, -1]
    assert _row(out.positions) == [0, 0, 0, 0]
    assert [w[0] for w in out.anc[0].tolist()] == [1, 0, 0, 0]
    assert _row(out.first_child) == [-1] * 4


def test_budget_one_is_the_best_first_token() -> None:
    out = _run(GOLDEN_LP, budget=1, n_max=2)
    assert _row(out.node_token) == [99, 10]
    assert _row(out.node_parent) == [-1, 0]
    assert _row(out.first_child) == [1, -1]


def test_budget_beyond_candidate_space_takes_every_candidate() -> None:
    # K=2, L=2: 2 + 4 = 6 candidates.
    out = _run([[-0.5, -1.0], [-0.25, -2.0]], budget=10, n_max=11)
    assert int(out.num_nodes[0]) == 7
    # (0) -0.5, (0,0) -0.75, (1) -1, (1,0) -1.25, (0,1) -2.5, (1,1) -3
    assert _row(out.node_parent)[:7] == [-1, 0, 1, 0, 3, 1, 3]
    assert _row(out.node_token)[:7] == [99, 10, 20, 11, 20, 21, 21]


def test_budget_is_clamped_by_n_max() -> None:
    out = _run(GOLDEN_LP, budget=100, n_max=4)
    assert int(out.num_nodes[0]) == 4
    assert _row(out.node_parent) == [-1, 0, 1, 0]


def test_minus_inf_ranks_are_not_candidates() -> None:
    lp = [[-0.5, -1.0, NEG_INF], [-1.0, NEG_INF, NEG_INF]]
    out = _run(lp, budget=10, n_max=8)
    # (0) -0.5, (1) -1.0, (0,0) -1.5, (1,0) -2.0, and nothing with a -inf rank
    assert int(out.num_nodes[0]) == 5
    assert _row(out.node_parent) == [-1, 0, 0, 1, 2, -1, -1, -1]
    assert _row(out.node_token) == [99, 10, 11, 20, 20, -1, -1, -1]
    assert int(_run([[NEG_INF, NEG_INF]], budget=3, n_max=4).num_nodes[0]) == 1


def test_anc_words_past_32_nodes_and_negative_int32_patterns() -> None:
    # A chain of 40 nodes: row i has bits 0..i, spread over two u32 words; bit 31 makes word 0 negative.
    lp = [[-0.01]] * 40
    out = _run(lp, budget=40, n_max=41)
    anc = out.anc[0].tolist()
    assert len(anc[0]) == 2
    assert anc[31] == [-1, 0]  # 0xFFFFFFFF
    assert anc[35] == [-1, 0b1111]
    assert anc[40] == [-1, 0x1FF]


def test_batch_rows_are_independent() -> None:
    gen = torch.Generator().manual_seed(1)
    lp = torch.log_softmax(torch.randn(3, 4, 9, generator=gen), -1).topk(5, -1).values
    ids = torch.randint(0, 1000, (3, 4, 5), generator=gen, dtype=torch.int32)
    roots = torch.tensor([1, 2, 3], dtype=torch.int32)
    ctx = torch.tensor([0, 7, 1000], dtype=torch.int32)
    budgets = torch.tensor([0, 5, 30], dtype=torch.int32)
    out = build_tree(lp, ids, roots, ctx, budgets, 24)
    assert out.num_nodes.tolist() == [1, 6, 24]
    for b in range(3):
        one = build_tree(lp[b:b + 1], ids[b:b + 1], roots[b:b + 1], ctx[b:b + 1], budgets[b:b + 1], 24)
        for got, want in zip(out, one):
            assert torch.equal(got[b:b + 1], want)


def test_rejects_bad_shapes() -> None:
    lp = torch.zeros(2, 3, 4)
    ids = torch.zeros(2, 3, 4, dtype=torch.int32)
    one = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="top_lp/top_id"):
        build_tree(lp, ids[:, :, :3], one, one, one, 8)
    with pytest.raises(ValueError, match="budget"):
        build_tree(lp, ids, one, one, one[:1], 8)
    with pytest.raises(ValueError, match="n_max"):
        build_tree(lp, ids, one, one, one, 0)


# ---- invariants and brute force -------------------------------------------------------------------

def chain_score(lp: list[list[float]], ranks: tuple[int, ...]) -> float:
    """A candidate's score computed exactly as the heap computes it: start at lp[0][0], walk siblings
    with s - lp[r] + lp[r+1], step down with s + lp[d][0]."""
    s = lp[0][0]
    for d, r in enumerate(ranks):
        if d > 0:
            s = s + lp[d][0]
        for j in range(1, r + 1):
            s = s - lp[d][j - 1] + lp[d][j]
    return s


def brute_force_order(lp: list[list[float]], budget: int) -> list[tuple[int, ...]]:
    depth_max, k = len(lp), len(lp[0])
    cands = [t for d in range(1, depth_max + 1) for t in itertools.product(range(k), repeat=d)
             if all(lp[i][r] != NEG_INF for i, r in enumerate(t))]
    cands.sort(key=lambda t: (-chain_score(lp, t), t))
    return cands[:budget]


def node_tuples(out: BuildTreeOutput, lp_ids: list[list[int]] | None = None) -> list[tuple[int, ...]]:
    """Rank tuple of every node, recovered from the parents and the sibling lists."""
    n = int(out.num_nodes[0])
    parent = _row(out.node_parent)
    fc, ns = _row(out.first_child), _row(out.next_sibling)
    tuples: list[tuple[int, ...]] = [()] * n
    for p in range(n):
        c, r = fc[p], 0
        while c != -1:
            assert parent[c] == p
            tuples[c] = tuples[p] + (r,)
            c, r = ns[c], r + 1
    return tuples


def check_invariants(out: BuildTreeOutput, lp: list[list[float]], ids: list[list[int]], root: int,
                     ctx: int, n_max: int) -> None:
    n = int(out.num_nodes[0])
    parent, depth = _row(out.node_parent), _row(out.node_depth)
    token, pos = _row(out.node_token), _row(out.positions)
    anc = out.anc[0].tolist()
    tuples = node_tuples(out)
    assert parent[0] == -1 and depth[0] == 0 and token[0] == root
    seen = {()}
    for i in range(1, n):
        p = parent[i]
        assert 0 <= p < i, "parent < child"
        assert depth[i] == depth[p] + 1
        t = tuples[i]
        assert len(t) == depth[i] and t[:-1] == tuples[p]
        assert t not in seen
        seen.add(t)
        assert token[i] == ids[depth[i] - 1][t[-1]]
        if t[-1] > 0:  # prefix-closed: the previous sibling is in the tree too
            assert t[:-1] + (t[-1] - 1,) in seen
    for i in range(n_max):
        want_bits = 0
        if i < n:
            j = i
            while j != -1:
                want_bits |= 1 << j
                j = parent[j]
        got_bits = sum((w & 0xFFFFFFFF) << (32 * k) for k, w in enumerate(anc[i]))
        assert got_bits == want_bits, f"anc row {i}"
        assert pos[i] == ctx + (depth[i] if i < n else 0)
        if i >= n:
            assert parent[i] == -1 and token[i] == -1 and depth[i] == 0
    # Scores along pop order are non-increasing (log-probs <= 0, sorted): the heap is best-first.
    scores = [chain_score(lp, t) for t in tuples[1:]]
    assert all(a >= b for a, b in zip(scores, scores[1:]))


def _random_lp(rng: random.Random, depth_max: int, k: int, kind: str) -> list[list[float]]:
    rows = []
    for _ in range(depth_max):
        if kind == "dyadic":  # multiples of 1/4: many exact score ties
            row = sorted((-rng.randint(0, 12) / 4 for _ in range(k)), reverse=True)
        else:  # fp32 log-softmax of random logits, top-k
            logits = torch.randn(max(k, 50), generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
            row = torch.log_softmax(logits * rng.choice([0.5, 2.0, 6.0]), -1).topk(k).values.tolist()
        rows.append(row)
    return rows


@pytest.mark.parametrize("kind", ["dyadic", "fp32"])
def test_heap_equals_brute_force_top_m(kind: str) -> None:
    rng = random.Random(1234 if kind == "dyadic" else 99)
    for case in range(60):
        depth_max, k = rng.randint(1, 4), rng.randint(1, 4)
        space = sum(k ** d for d in range(1, depth_max + 1))
        budget = rng.choice([0, 1, 2, rng.randint(0, space), space, space + 3])
        lp = _random_lp(rng, depth_max, k, kind)
        ids = [[rng.randrange(32000) for _ in range(k)] for _ in range(depth_max)]
        want = brute_force_order(lp, budget)
        got_nodes = heap_pop_order(lp, budget)
        assert len(got_nodes) == len(want), f"case {case}"
        n_max = budget + 1 + rng.randint(0, 3)
        out = _run(lp, budget, n_max, ids=ids, root=5, ctx=case)
        assert node_tuples(out)[1:] == want, f"case {case}: lp={lp} budget={budget}"
        check_invariants(out, lp, ids, 5, case, n_max)


def test_invariants_at_realistic_sizes() -> None:
    rng = random.Random(7)
    for depth_max, k, budget in ((15, 64, 256), (15, 8, 64), (7, 32, 200), (1, 16, 16), (15, 1, 20)):
        lp = _random_lp(rng, depth_max, k, "fp32")
        ids = [[rng.randrange(150000) for _ in range(k)] for _ in range(depth_max)]
        out = _run(lp, budget, budget + 1, ids=ids, root=3, ctx=50)
        assert int(out.num_nodes[0]) == 1 + min(budget, sum(k ** d for d in range(1, depth_max + 1)))
        check_invariants(out, lp, ids, 3, 50, budget + 1)


# fp32 values whose fp64 sums are inexact: a tiny top log-prob next to large ones. The heap's sibling
# recurrence then differs from parent + lp[r] in the last bit (found by search; exact numbers below).
INEXACT_LP = [[-6.6857430702782494e-09, -20.0, -21.0],
              [-5.3228440284729, -24.36475944519043, -34.079593658447266]]


def test_heap_scores_use_the_sibling_recurrence() -> None:
    lp = INEXACT_LP
    nodes = heap_pop_order(lp, 12)
    assert len(nodes) == 12
    tuples: dict[int, tuple[int, ...]] = {0: ()}
    for i, nd in enumerate(nodes, start=1):
        tuples[i] = tuples[nd.parent] + (nd.rank,)
        assert nd.score == chain_score(lp, tuples[i])
    score = {tuples[i]: nd.score for i, nd in enumerate(nodes, start=1)}
    assert score[(0, 1)] == -24.364759451876175
    assert score[(0, 1)] != lp[0][0] + lp[1][1]  # the naive sum rounds the other way
