"""Reference kv_commit: move each accepted tree node's K/V to its committed slot in every layer, then
ctx_len += accept_len. Readable pure PyTorch (CPU or GPU); `ddtree_engine.ops.kv_commit` must agree.

Request b's tree node j sits at cache slot ctx_len[b] + j; accepted node accept_nodes[b, i] moves to slot
ctx_len[b] + i (i < accept_len[b]), which is also its RoPE position. Slot s lives in page
block_table[b, s // page_size] at offset s % page_size. Sources and destinations overlap (src >= dst), so
all sources are gathered before any destination is written."""

from __future__ import annotations

import torch


def kv_commit(k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], block_table: torch.Tensor,
              accept_nodes: torch.Tensor, accept_len: torch.Tensor, ctx_len: torch.Tensor) -> None:
    """Caches [P, page_size, Hkv, D] (any dtype), updated in place; ctx_len [B] int32 updated in place."""
    caches = list(k_caches) + list(v_caches)
    for b in range(block_table.shape[0]):
        n = int(accept_len[b])
        ctx = int(ctx_len[b])
        if n > 0 and caches:
            page_size = caches[0].shape[1]
            src = ctx + accept_nodes[b, :n].long().to(block_table.device)
            dst = ctx + torch.arange(n, device=block_table.device)
            src_page, src_off = block_table[b, src // page_size].long(), src % page_size
            dst_page, dst_off = block_table[b, dst // page_size].long(), dst % page_size
            for cache in caches:
                rows = cache[src_page.to(cache.device), src_off.to(cache.device)].clone()  # gather first
                cache[dst_page.to(cache.device), dst_off.to(cache.device)] = rows
        ctx_len[b] += n
