"""Paged KV cache: per layer K and V of shape [P, page, Hkv, D], and a block table per batch slot.

Each batch slot owns a fixed list of pages for its lifetime (enough for its maximum context plus one
padded draft tree). Pages are handed out from a seeded shuffle of the pool, so a request's pages are
scattered through the pool and page boundaries fall inside prompts and trees — the paging is really
exercised, not an identity mapping. Static shapes: the block table never changes size, which keeps a
decoding round capturable in a CUDA graph."""

from __future__ import annotations

import torch


class PagedKVCache:
    def __init__(
        self,
        *,
        n_layers: int,
        n_kv_heads: int,
        head_dim: int,
        slots: int,
        max_slot_tokens: int,
        page_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
        seed: int = 0,
    ) -> None:
        if page_size <= 0 or max_slot_tokens <= 0 or slots <= 0:
            raise ValueError("page_size, max_slot_tokens and slots must be positive")
        self.page_size = page_size
        self.pages_per_slot = -(-max_slot_tokens // page_size)
        self.capacity = self.pages_per_slot * page_size  # tokens a slot can hold (context + tree)
        num_pages = slots * self.pages_per_slot
        shape = (num_pages, page_size, n_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed))
        self.block_table = perm.view(slots, self.pages_per_slot).to(torch.int32).to(device)

    @property
    def num_pages(self) -> int:
        return int(self.k[0].shape[0])
