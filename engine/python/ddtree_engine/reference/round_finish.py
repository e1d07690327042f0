"""round_finish: the end of a DDTree round as one op — tree_accept, kv_commit, round_update, and the live
budget (budget[b] zeroed for every slot that is no longer active, so the next round's build_tree reads it
directly instead of a torch.where(active, budget, 0) kernel).

Readable pure PyTorch (CPU or GPU), literally the composition of the three reference ops;
`ddtree_engine.ops.round_finish` is the one-launch CUDA version and must agree exactly."""

from __future__ import annotations

import torch

from ddtree_engine.reference.kv_commit import kv_commit
from ddtree_engine.reference.round_update import round_update
from ddtree_engine.reference.tree_accept import AcceptOutput, tree_accept


def round_finish(target_logits: torch.Tensor, node_token: torch.Tensor, first_child: torch.Tensor,
                 next_sibling: torch.Tensor, num_nodes: torch.Tensor, ctx_len: torch.Tensor,
                 temperature: torch.Tensor, seed: torch.Tensor, stop_ids: torch.Tensor,
                 k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], block_table: torch.Tensor,
                 hid: torch.Tensor, active: torch.Tensor, ignore_stop: torch.Tensor, max_new: torch.Tensor,
                 out_len: torch.Tensor, root: torch.Tensor, hidden: torch.Tensor, r_tokens: torch.Tensor,
                 r_count: torch.Tensor, r_finish: torch.Tensor,
                 live_budget: torch.Tensor | None = None) -> AcceptOutput:
    """Arguments: tree_accept's, then kv_commit's caches and block table, then round_update's state (ctx_len
    is shared: read by the accept, advanced by the commit, restored for inactive slots), then the optional
    live budget [B] i32. Returns the accept outputs."""
    acc = tree_accept(target_logits, node_token, first_child, next_sibling, num_nodes, ctx_len, temperature, seed,
                      stop_ids)
    kv_commit(k_caches, v_caches, block_table, acc.accept_nodes, acc.accept_len, ctx_len)
    round_update(acc.accept_len, acc.finished, acc.bonus, acc.committed_ids, acc.accept_nodes, hid, active,
                 ignore_stop, max_new, out_len, ctx_len, root, hidden, r_tokens, r_count, r_finish)
    if live_budget is not None:
        live_budget.copy_(torch.where(active, live_budget, torch.zeros_like(live_budget)))
    return acc
