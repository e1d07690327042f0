"""commit_update: the split round tail after tree_accept as one op — kv_commit, round_update, and the live
budget (zeroed for every slot that is no longer active, as round_finish keeps it), so that a round whose
commit does not fit round_finish needs no torch.where(active, budget, 0) kernel either.

Readable pure PyTorch (CPU or GPU), literally the composition of the two reference ops;
`ddtree_engine.ops.commit_update` is the one-launch CUDA version and must agree exactly."""

from __future__ import annotations

from typing import Callable

import torch

from ddtree_engine.reference.kv_commit import kv_commit as _ref_kv_commit
from ddtree_engine.reference.round_update import round_update as _ref_round_update


def composed(kv_commit: Callable[..., None], round_update: Callable[..., None]) -> Callable[..., None]:
    """commit_update as the composition of a kv_commit and a round_update (and the budget mask): the reference
    with the reference ops, and the CUDA op's own fallback (two launches) with the CUDA ones."""

    def commit_update(k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], block_table: torch.Tensor,
                      accept_len: torch.Tensor, finished: torch.Tensor, bonus: torch.Tensor,
                      committed_ids: torch.Tensor, accept_nodes: torch.Tensor, hid: torch.Tensor,
                      active: torch.Tensor, ignore_stop: torch.Tensor, max_new: torch.Tensor,
                      out_len: torch.Tensor, ctx_len: torch.Tensor, root: torch.Tensor, hidden: torch.Tensor,
                      r_tokens: torch.Tensor, r_count: torch.Tensor, r_finish: torch.Tensor,
                      live_budget: torch.Tensor | None = None) -> None:
        """kv_commit's caches and block table, then round_update's arguments, then the optional live budget."""
        kv_commit(k_caches, v_caches, block_table, accept_nodes, accept_len, ctx_len)
        round_update(accept_len, finished, bonus, committed_ids, accept_nodes, hid, active, ignore_stop, max_new,
                     out_len, ctx_len, root, hidden, r_tokens, r_count, r_finish)
        if live_budget is not None:
            live_budget.copy_(torch.where(active, live_budget, torch.zeros_like(live_budget)))

    return commit_update


commit_update = composed(_ref_kv_commit, _ref_round_update)
