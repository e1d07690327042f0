"""Reference DDTree tree construction: the best-first heap of the paper's code, in plain Python.

This is the definition the CUDA kernel (``ops/build_tree.py``) must reproduce bit for bit, ties included
(shared/engine-spec.md, "Tree construction — exact semantics"):

* A candidate is a rank tuple ``(r_1..r_d)``, ``1 <= d <= L``, ``0 <= r_i < K``; its token at depth ``i``
  is ``top_id[i-1][r_i]``.
* A max-heap keyed on ``(score desc, rank tuple asc)`` starts with ``(0,)`` scored ``lp[0][0]``. Each
  pop becomes the next node (numbered in pop order, so ``parent < child``) and pushes its next sibling,
  scored ``s - lp[d-1][r] + lp[d-1][r+1]``, and its first child, scored ``s + lp[d][0]``. Scores are
  Python floats (IEEE fp64, round to nearest) computed exactly in that order; equal scores fall back
  to the lexicographic order of the rank tuples (a prefix before its extensions).
* The build stops after ``M = min(budget, n_max - 1)`` pops or when the heap is empty.
* Ranks whose log-prob is ``-inf`` (``draft_topk_lse`` pads ``V < K`` that way) are not candidates: a
  sibling or child whose log-prob is ``-inf`` is never pushed. NaN or ``+inf`` log-probs are undefined.

Outputs (``N = n_max`` padded nodes, ``W = ceil(N / 32)``), all int32 on the input's device:
``node_token`` (root token, then ``top_id`` of each node; padding -1), ``node_parent`` (-1 for root and
padding), ``node_depth`` (root and padding 0), ``num_nodes``, ``anc`` (bit ``j`` of word ``j // 32`` of
row ``i`` set iff ``j`` is ``i`` or an ancestor of ``i``; u32 bit patterns stored in int32; padding rows
0), ``positions`` (``ctx_len + depth``; padding ``ctx_len``), ``first_child`` / ``next_sibling``
(children in pop order, -1 = none).
"""

from __future__ import annotations

import heapq
import math
from typing import NamedTuple, Sequence

import torch
from torch import Tensor


class BuildTreeOutput(NamedTuple):
    node_token: Tensor  # [B, N] int32
    node_parent: Tensor  # [B, N] int32
    node_depth: Tensor  # [B, N] int32
    num_nodes: Tensor  # [B] int32
    anc: Tensor  # [B, N, W] int32 (u32 bit patterns)
    positions: Tensor  # [B, N] int32
    first_child: Tensor  # [B, N] int32
    next_sibling: Tensor  # [B, N] int32


class HeapNode(NamedTuple):
    """One popped candidate: node i of the tree is pop number i (the root is node 0)."""

    parent: int  # node index of the parent (0 = root)
    depth: int  # 1..L
    rank: int  # rank of its token among the depth's top-K
    score: float  # fp64 score as the heap computed it


def heap_pop_order(lp: Sequence[Sequence[float]], budget: int) -> list[HeapNode]:
    """Pop order of the best-first heap over one request's log-probs ``lp[L][K]`` (Python floats).

    Returns at most ``budget`` nodes (the root is not included)."""
    depth_max = len(lp)
    k = len(lp[0]) if depth_max else 0
    nodes: list[HeapNode] = []
    if budget <= 0 or depth_max == 0 or k == 0 or lp[0][0] == -math.inf:
        return nodes
    # Entry: (-score, ranks, parent node, depth, rank, score). `ranks` is unique per candidate, so the
    # comparison never reaches the later fields: equal scores are ordered by the rank tuple.
    heap: list[tuple[float, tuple[int, ...], int, int, int, float]] = []
    first = lp[0][0]
    heap.append((-first, (0,), 0, 1, 0, first))
    while heap and len(nodes) < budget:
        _, ranks, parent, depth, rank, score = heapq.heappop(heap)
        nodes.append(HeapNode(parent, depth, rank, score))
        node = len(nodes)  # this pop's node index
        row = lp[depth - 1]
        if rank + 1 < k and row[rank + 1] != -math.inf:
            sib = score - row[rank] + row[rank + 1]
            heapq.heappush(heap, (-sib, ranks[:-1] + (rank + 1,), parent, depth, rank + 1, sib))
        if depth < depth_max and lp[depth][0] != -math.inf:
            child = score + lp[depth][0]
            heapq.heappush(heap, (-child, ranks + (0,), node, depth + 1, 0, child))
    return nodes


def _as_i32(word: int) -> int:
    """u32 bit pattern -> the int32 with the same bits."""
    return word - (1 << 32) if word >= (1 << 31) else word


def build_tree(
    top_lp: Tensor,
    top_id: Tensor,
    root_token: Tensor,
    ctx_len: Tensor,
    budget: Tensor,
    n_max: int,
) -> BuildTreeOutput:
    """top_lp [B, L, K] f32 (sorted desc per row), top_id [B, L, K] int32, root_token/ctx_len/budget [B]
    int32, n_max = padded node count (root included). Runs the heap on the host (this is a reference)."""
    if top_lp.dim() != 3 or top_id.shape != top_lp.shape:
        raise ValueError(f"top_lp/top_id must both be [B, L, K], got {tuple(top_lp.shape)} / {tuple(top_id.shape)}")
    bsz = top_lp.shape[0]
    for name, t in (("root_token", root_token), ("ctx_len", ctx_len), ("budget", budget)):
        if t.shape != (bsz,):
            raise ValueError(f"{name} must be [B] = [{bsz}], got {tuple(t.shape)}")
    if n_max < 1:
        raise ValueError(f"n_max must be >= 1, got {n_max}")
    device = top_lp.device
    words = (n_max + 31) // 32
    lp_all = top_lp.detach().to("cpu", torch.float32).tolist()  # exact fp32 -> Python float (fp64)
    id_all = top_id.detach().cpu().tolist()
    roots = root_token.detach().cpu().tolist()
    ctxs = ctx_len.detach().cpu().tolist()
    budgets = budget.detach().cpu().tolist()

    token = [[-1] * n_max for _ in range(bsz)]
    parent = [[-1] * n_max for _ in range(bsz)]
    depth = [[0] * n_max for _ in range(bsz)]
    count = [1] * bsz
    anc = [[[0] * words for _ in range(n_max)] for _ in range(bsz)]
    positions = [[0] * n_max for _ in range(bsz)]
    first_child = [[-1] * n_max for _ in range(bsz)]
    next_sibling = [[-1] * n_max for _ in range(bsz)]

    for b in range(bsz):
        budget_b = min(max(int(budgets[b]), 0), n_max - 1)
        nodes = heap_pop_order(lp_all[b], budget_b)
        count[b] = 1 + len(nodes)
        token[b][0] = int(roots[b])
        rows = [1]  # anc row of each node as a Python int bitset
        last_child = [-1] * (1 + len(nodes))
        for i, nd in enumerate(nodes, start=1):
            token[b][i] = int(id_all[b][nd.depth - 1][nd.rank])
            parent[b][i] = nd.parent
            depth[b][i] = nd.depth
            rows.append(rows[nd.parent] | (1 << i))
            # Children of a node are popped in rank order, so pop order = sibling order.
            if last_child[nd.parent] < 0:
                first_child[b][nd.parent] = i
            else:
                next_sibling[b][last_child[nd.parent]] = i
            last_child[nd.parent] = i
        for i, row in enumerate(rows):
            anc[b][i] = [_as_i32((row >> (32 * w)) & 0xFFFFFFFF) for w in range(words)]
        positions[b] = [int(ctxs[b]) + d for d in depth[b]]

    return BuildTreeOutput(
        node_token=torch.tensor(token, dtype=torch.int32).reshape(bsz, n_max).to(device),
        node_parent=torch.tensor(parent, dtype=torch.int32).reshape(bsz, n_max).to(device),
        node_depth=torch.tensor(depth, dtype=torch.int32).reshape(bsz, n_max).to(device),
        num_nodes=torch.tensor(count, dtype=torch.int32).reshape(bsz).to(device),
        anc=torch.tensor(anc, dtype=torch.int32).reshape(bsz, n_max, words).to(device),
        positions=torch.tensor(positions, dtype=torch.int32).reshape(bsz, n_max).to(device),
        first_child=torch.tensor(first_child, dtype=torch.int32).reshape(bsz, n_max).to(device),
        next_sibling=torch.tensor(next_sibling, dtype=torch.int32).reshape(bsz, n_max).to(device),
    )
