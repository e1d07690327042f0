"""Reference tree_accept: one target token per tree node (greedy argmax, or Gumbel-max sampling with the
counter-based noise below), the walk from the root along the target's choices, the bonus token and the
stop-id truncation. Readable pure PyTorch (CPU or GPU); `ddtree_engine.ops.tree_accept` must agree exactly.

Gumbel noise (defined here once; include/ddtree/kernels/tree_accept/common.cuh implements the same bits):
    h  = mix32(mix32(mix32(mix32(mix32(seed_lo ^ 0x9E3779B9) ^ seed_hi) ^ request) ^ position) ^ vocab_id)
    h  = mix32(h ^ 0x5BD1E995)
    u  = (h >> 8) * 2**-24                  # 24 high bits -> [0, 1), exact in float32
    g  = -log32(-log32(u))  (u = 0 -> -inf, which never wins an argmax)
mix32 is Wellons' "lowbias32" (x ^= x>>16; x *= 0x7FEB352D; x ^= x>>15; x *= 0x846CA68B; x ^= x>>16, all
mod 2**32). log32 is a float32 logarithm built only from exactly rounded float32 operations (+, -, *, /)
and bit manipulation, so torch (CPU or GPU) and CUDA produce identical bits; no FMA contraction.
The sampled token of node i of request b is argmax_v(float32(logit[v]) / T + g(seed[b], b, ctx_len[b] +
depth(i) + 1, v)), ties to the lower id. The position is that of the token being drawn, so siblings
share noise and tree sampling reproduces autoregressive sampling with the same noise token for token.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

M32 = 0xFFFFFFFF
_SQRT2 = 1.41421356237309504880
_LN2 = 0.69314718055994530942


class AcceptOutput(NamedTuple):
    accept_nodes: torch.Tensor  # [B, W] i32: accepted node indices from the root, -1 padded
    accept_len: torch.Tensor  # [B] i32: accepted nodes incl. the root = KV slots to commit = new tokens
    committed_ids: torch.Tensor  # [B, W] i32: tokens of accepted non-root nodes, then the bonus; -1 padded
    bonus: torch.Tensor  # [B] i32: the next round's root token
    finished: torch.Tensor  # [B] i32: 1 if a stop id was emitted (committed_ids cut right after it)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 0 <= x < 2**32 in int64 without overflow (split c into 16-bit halves)."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & M32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """Wellons' lowbias32 integer hash on uint32 values held in int64."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def log32(x: torch.Tensor) -> torch.Tensor:
    """Natural log of positive normal float32 values, bit-identical to the CUDA version (see module doc)."""
    bits = x.view(torch.int32).to(torch.int64)
    e = ((bits >> 23) & 0xFF) - 127
    m = ((bits & 0x7FFFFF) | 0x3F800000).to(torch.int32).view(torch.float32)  # mantissa in [1, 2)
    big = m > _f32(_SQRT2, m)
    m = torch.where(big, m * _f32(0.5, m), m)  # now in [sqrt(2)/2, sqrt(2))
    e = (e + big.to(torch.int64)).to(torch.float32)
    f = m - _f32(1.0, m)
    s = f / (_f32(2.0, m) + f)  # log(1 + f) = 2 atanh(s)
    z = s * s
    poly = _f32(1.0 / 11.0, m)
    for c in (1.0 / 9.0, 1.0 / 7.0, 1.0 / 5.0, 1.0 / 3.0):
        poly = poly * z
        poly = poly + _f32(c, m)
    poly = poly * z
    t = s + s * poly
    return e * _f32(_LN2, m) + (t + t)


def gumbel_noise(seed: torch.Tensor | int, request: torch.Tensor | int, position: torch.Tensor | int,
                 vocab_ids: torch.Tensor) -> torch.Tensor:
    """float32 Gumbel(0, 1) noise g(seed, request, position, vocab_id); arguments broadcast together."""
    device = vocab_ids.device

    def as64(v: torch.Tensor | int) -> torch.Tensor:
        return torch.as_tensor(v, dtype=torch.int64, device=device)

    seed64 = as64(seed)
    h = mix32((seed64 & M32) ^ 0x9E3779B9)
    h = mix32(h ^ ((seed64 >> 32) & M32))
    h = mix32(h ^ (as64(request) & M32))
    h = mix32(h ^ (as64(position) & M32))
    h = mix32(h ^ (vocab_ids.to(torch.int64) & M32))
    h = mix32(h ^ 0x5BD1E995)
    u = (h >> 8).to(torch.float32) * _f32(2.0**-24, vocab_ids)
    safe = torch.where(u > 0, u, torch.ones_like(u))
    g = -log32(-log32(safe))
    return torch.where(u > 0, g, torch.full_like(g, float("-inf")))


def tree_parents_depths(first_child: torch.Tensor, next_sibling: torch.Tensor, num_nodes: int) -> tuple[list[int], list[int]]:
    """Parent and depth of nodes 0..num_nodes-1 of one request from its child lists."""
    n = num_nodes
    parent = [-1] * n
    fc, ns = first_child.tolist(), next_sibling.tolist()
    for p in range(n):
        c = fc[p]
        while 0 < c < n:
            parent[c] = p
            c = ns[c]
    depth = [0] * n
    for i in range(1, n):  # parent < child in pop order, so parents are done first
        depth[i] = depth[parent[i]] + 1 if parent[i] >= 0 else 0
    return parent, depth


def node_targets(logits: torch.Tensor, temperature: float, seed: int, request: int, ctx_len: int,
                 depths: list[int]) -> torch.Tensor:
    """Target token of each of the len(depths) nodes of one request: logits [n, V] (any float dtype)."""
    x = logits[: len(depths)].float()
    if not temperature > 0:  # 0, negative or NaN -> greedy
        return torch.argmax(x, dim=-1)  # first maximal index = lower id on ties
    vocab_ids = torch.arange(x.shape[-1], device=x.device)
    t = _f32(temperature, x)
    out = torch.empty(len(depths), dtype=torch.int64, device=x.device)
    depth_t = torch.tensor(depths, device=x.device)
    for d in sorted(set(depths)):  # nodes of one depth share their noise
        rows = (depth_t == d).nonzero().flatten()
        g = gumbel_noise(seed, request, ctx_len + d + 1, vocab_ids)
        out[rows] = torch.argmax(x[rows] / t + g, dim=-1)
    return out


def tree_accept(target_logits: torch.Tensor, node_token: torch.Tensor, first_child: torch.Tensor,
                next_sibling: torch.Tensor, num_nodes: torch.Tensor, ctx_len: torch.Tensor,
                temperature: torch.Tensor, seed: torch.Tensor, stop_ids: torch.Tensor,
                max_depth: int | None = None, check: bool = False) -> AcceptOutput:
    """Walk each request's tree along the target's tokens. target_logits is [B*N, V] or [B, N, V] (f32/bf16),
    tree tensors [B, N] i32, num_nodes/ctx_len [B] i32, temperature [B] f32 (<= 0: greedy), seed [B] i64,
    stop_ids [S] i32. Output width W = max_depth + 1 (default N). With check=True NaN logits raise."""
    batch, n_max = node_token.shape
    vocab = target_logits.shape[-1]
    logits = target_logits.reshape(batch, n_max, vocab)
    width = n_max if max_depth is None else max_depth + 1
    if width < 1:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    if check and bool(torch.isnan(logits.float()).any()):
        raise ValueError("tree_accept: NaN in target logits")
    device = node_token.device
    stops = set(stop_ids.tolist())
    accept_nodes = torch.full((batch, width), -1, dtype=torch.int32, device=device)
    committed = torch.full((batch, width), -1, dtype=torch.int32, device=device)
    accept_len = torch.zeros(batch, dtype=torch.int32, device=device)
    bonus = torch.zeros(batch, dtype=torch.int32, device=device)
    finished = torch.zeros(batch, dtype=torch.int32, device=device)
    for b in range(batch):
        n = max(1, min(int(num_nodes[b]), n_max))
        parent, depth = tree_parents_depths(first_child[b], next_sibling[b], n)
        targets = node_targets(logits[b], float(temperature[b]), int(seed[b]), b, int(ctx_len[b]), depth).tolist()
        tokens = node_token[b].tolist()
        fc, ns = first_child[b].tolist(), next_sibling[b].tolist()
        path = [0]
        while True:
            want = targets[path[-1]]
            if len(path) == width:
                break
            child = fc[path[-1]]
            while 0 < child < n and tokens[child] != want:
                child = ns[child]
            if not 0 < child < n:
                break
            path.append(child)
        new_tokens = [tokens[i] for i in path[1:]] + [targets[path[-1]]]
        done = 0
        for idx, tok in enumerate(new_tokens):
            if tok in stops:
                new_tokens, path, done = new_tokens[: idx + 1], path[: idx + 1], 1
                break
        accept_nodes[b, : len(path)] = torch.tensor(path, dtype=torch.int32)
        committed[b, : len(new_tokens)] = torch.tensor(new_tokens, dtype=torch.int32)
        accept_len[b] = len(path)
        bonus[b] = new_tokens[-1]
        finished[b] = done
    return AcceptOutput(accept_nodes, accept_len, committed, bonus, finished)
