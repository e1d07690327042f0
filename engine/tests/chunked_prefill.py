"""Prefill a prompt through the model's paged tree path in chunks (chains), shared by the model tests."""

from __future__ import annotations

import torch

from ddtree_engine.backend import OpBackend
from ddtree_engine.decode import chain_anc
from ddtree_engine.model import TinyTransformer
from ddtree_engine.paged_kv import PagedKVCache


def chunked_tree_logits(model: TinyTransformer, prompt: torch.Tensor, chunk: int, *, page: int,
                        backend: OpBackend, table_row: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(logits [T, V] of every prompt position, each chunk's final hidden [1, n, d]): the prompt fed as chains of
    `chunk` tokens into slot `table_row` of a fresh 3-slot paged cache with pages of `page` tokens."""
    cfg = model.cfg
    cache = PagedKVCache(n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, slots=3,
                         max_slot_tokens=prompt.shape[0], page_size=page, dtype=model.kv_dtype, seed=5)
    ctx = torch.zeros(1, dtype=torch.int32)
    logits_out, hidden_out = [], []
    for s in range(0, prompt.shape[0], chunk):
        toks = prompt[s : s + chunk].to(torch.int32)
        n = toks.shape[0]
        pos = (ctx.long() + torch.arange(n)).to(torch.int32)
        logits, hid = model.forward_tree(backend, cache.k, cache.v, cache.block_table[table_row : table_row + 1],
                                         toks[None], pos[None], ctx, chain_anc(n, "cpu"))
        ctx += n
        logits_out.append(logits[0])
        hidden_out.append(hid)
    return torch.cat(logits_out), hidden_out
