"""Reference qkv_prep: a model layer's step between its QKV GEMM and tree attention. Readable pure PyTorch (CPU
or GPU); `ddtree_engine.ops.qkv_prep` must agree (bit for bit: the same fp32 operations, each rounded).

Row t of `qkv` holds Hq query heads, then Hkv key heads, then Hkv value heads (head_dim D each). Query and key
heads get NeoX rotary embedding with the model's per-forward tables: rope(x) = x * cos + swap_halves(x) * sin,
sin sign-folded (-sin on the first half), computed in fp32 (two products and one add, each rounded to fp32) and
rounded once to the cache dtype. q comes back as a new [T, Hq, D] tensor; key heads (rotated) and value heads
(as they are) are written to row slots[t] of the caches viewed as [P * page_size, Hkv, D]. Tokens whose slot
lies outside the cache are not written (the CUDA op also raises its bad-index flag)."""

from __future__ import annotations

import torch


def qkv_prep(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor,
             v_cache: torch.Tensor) -> torch.Tensor:
    """qkv [T, (Hq + 2 Hkv) * D]; cos, sin [T, D] (or [T, 1, D]); slots [T] int64; caches [P, page, Hkv, D]
    updated in place. Returns q [T, Hq, D] in the cache dtype."""
    hkv, d = k_cache.shape[-2], k_cache.shape[-1]
    t = qkv.shape[0]
    heads = qkv.shape[1] // d
    hq = heads - 2 * hkv
    x = qkv.reshape(t, heads, d).float()
    qk = x[:, : hq + hkv]
    swapped = torch.cat([qk[..., d // 2 :], qk[..., : d // 2]], dim=-1)
    rot = qk * cos.reshape(t, 1, d).float() + swapped * sin.reshape(t, 1, d).float()
    out_dtype = k_cache.dtype
    rows = k_cache.shape[0] * k_cache.shape[1]
    valid = (slots >= 0) & (slots < rows)
    idx = slots[valid]
    k_cache.view(rows, hkv, d).index_copy_(0, idx, rot[valid, hq:].to(out_dtype))
    v_cache.view(rows, hkv, d).index_copy_(0, idx, x[valid, hq + hkv :].to(out_dtype))
    return rot[:, :hq].to(out_dtype)
