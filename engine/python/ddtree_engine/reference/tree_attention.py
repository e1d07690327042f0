"""Readable fp32 PyTorch reference of ``tree_attention`` (CPU and GPU).

Semantics (engine-contract.md, engine-spec.md §4.4):

* Query ``t`` of request ``b`` is tree node ``i = t - qo_indptr[b]``; the request has
  ``n_b = qo_indptr[b+1] - qo_indptr[b]`` nodes.
* Key slot ``s`` of request ``b`` lives in page ``block_table[b, s // page]`` at offset
  ``s % page``. Slots ``[0, ctx_len[b])`` are committed tokens; tree node ``j`` sits at slot
  ``ctx_len[b] + j``.
* Query ``i`` sees every committed key and the tree keys ``j < n_b`` whose bit ``j`` is set in
  ``anc[b, i]`` (u32 words stored in int32, little-endian bits). ``anc=None`` means a chain
  (causal) tree: node ``i`` sees tree nodes ``0..i``.
* A query whose ancestor row has no bit among ``j < n_b`` is a padding query (every real node has
  its own bit): its output is zero and its lse is ``-inf``. That includes the ``ctx_len = 0`` case
  where nothing is visible.
* GQA: query head ``hq`` reads kv head ``hq // (Hq // Hkv)``.

The reference returns ``o`` in float32 (unrounded, so tests can measure the kernel's bf16 error)
and ``lse`` (natural log, float32) of ``sm_scale * q.k`` over the visible keys; float64 inputs are
computed and returned in float64, so an fp64 model can check losslessness bit for bit.
``kv_chunk`` only steers the kernel's context split; the reference ignores it.
"""
from __future__ import annotations

import torch
from torch import Tensor


def anc_from_parents(parents: Tensor, n_max: int | None = None) -> Tensor:
    """Ancestor bitsets ``[B, N, W]`` (int32 holding u32 bits) from ``parents [B, N]``.

    ``parents[b, 0] = -1`` is the root; any other node with a negative parent is padding (its
    row stays 0, as build_tree writes it). ``parent < i`` is required.
    """
    b_count, n = parents.shape
    n_max = n if n_max is None else n_max
    w = (n_max + 31) // 32
    bits = torch.zeros(b_count, n_max, n_max, dtype=torch.bool)
    par = parents.cpu().tolist()
    for b in range(b_count):
        for i in range(n):
            p = par[b][i]
            if p < 0 and i != 0:
                continue
            if p >= 0:
                if p >= i:
                    raise ValueError(f"parent {p} of node {i} (request {b}) is not < {i}")
                bits[b, i] = bits[b, p]
            bits[b, i, i] = True
    return pack_bits(bits, w)


def pack_bits(bits: Tensor, w: int) -> Tensor:
    """Pack a bool ``[..., N]`` into ``[..., W]`` int32 words (bit j of word j // 32)."""
    n = bits.shape[-1]
    pad = w * 32 - n
    if pad < 0:
        raise ValueError(f"{n} bits do not fit into {w} words")
    padded = torch.nn.functional.pad(bits.to(torch.int64), (0, pad))
    words = padded.view(*bits.shape[:-1], w, 32)
    weights = torch.tensor([1 << k for k in range(32)], dtype=torch.int64)
    packed = (words * weights).sum(-1)
    # two's-complement wrap so bit 31 fits an int32
    packed = torch.where(packed >= (1 << 31), packed - (1 << 32), packed)
    return packed.to(torch.int32)


def unpack_bits(words: Tensor, n: int) -> Tensor:
    """Inverse of :func:`pack_bits`: ``[..., W]`` int32 -> bool ``[..., n]``."""
    w64 = words.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(32, dtype=torch.int64, device=words.device)
    bits = (w64.unsqueeze(-1) >> shifts) & 1
    return bits.flatten(-2)[..., :n].bool()


def gather_kv(cache: Tensor, block_table: Tensor, b: int, length: int) -> Tensor:
    """Slots ``[0, length)`` of request ``b`` from a paged cache ``[P, page, Hkv, D]``."""
    page = cache.shape[1]
    slots = torch.arange(length, device=cache.device)
    pages = block_table[b].to(cache.device).long()[slots // page]
    return cache[pages, slots % page]


def visibility(ctx: int, n: int, anc_b: Tensor | None) -> Tensor:
    """Bool ``[n, ctx + n]``: the prefix is visible, the tree part comes from the bitset."""
    if anc_b is None:
        tree = torch.ones(n, n, dtype=torch.bool).tril()
    else:
        tree = unpack_bits(anc_b[:n].cpu(), n)
    valid = tree.any(dim=1, keepdim=True)
    prefix = torch.ones(n, ctx, dtype=torch.bool)
    return torch.cat([prefix, tree], dim=1) & valid


def tree_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    qo_indptr: Tensor,
    block_table: Tensor,
    ctx_len: Tensor,
    anc: Tensor | None,
    sm_scale: float,
    *,
    kv_chunk: int = 0,
    inputs_ready: bool = False,
) -> tuple[Tensor, Tensor]:
    del kv_chunk, inputs_ready  # kernel-only knobs (split size; when the CUDA kernel may read its inputs)
    t_total, hq, d = q.shape
    hkv = k_cache.shape[2]
    if hq % hkv:
        raise ValueError(f"Hq={hq} is not a multiple of Hkv={hkv}")
    g = hq // hkv
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    o = torch.zeros(t_total, hq, d, dtype=acc, device=q.device)
    lse = torch.full((t_total, hq), float("-inf"), dtype=acc, device=q.device)
    indptr = qo_indptr.tolist()
    ctxs = ctx_len.tolist()
    for b in range(len(indptr) - 1):
        t0, t1 = indptr[b], indptr[b + 1]
        n, c = t1 - t0, ctxs[b]
        if n == 0:
            continue
        k = gather_kv(k_cache, block_table, b, c + n).to(acc)  # [L, Hkv, D]
        v = gather_kv(v_cache, block_table, b, c + n).to(acc)
        vis = visibility(c, n, None if anc is None else anc[b]).to(q.device)  # [n, L]
        qb = q[t0:t1].to(acc).view(n, hkv, g, d)
        s = torch.einsum("nhgd,lhd->hgnl", qb, k) * sm_scale
        s = s.masked_fill(~vis, float("-inf"))
        lse_b = torch.logsumexp(s, dim=-1)  # [Hkv, G, n]
        p = torch.exp(s - lse_b.unsqueeze(-1)).nan_to_num(0.0)
        ob = torch.einsum("hgnl,lhd->nhgd", p, v)
        o[t0:t1] = ob.reshape(n, hq, d)
        lse[t0:t1] = lse_b.permute(2, 0, 1).reshape(n, hq)
    return o, lse
