"""round_update: the bookkeeping at the end of a DDTree round, after tree_accept and kv_commit.

Readable pure PyTorch (CPU or GPU); `ddtree_engine.ops.round_update` is the one-launch CUDA version and
must agree exactly. Everything is updated in place, per slot b:

    remaining   = max_new - out_len
    n_new       = active ? min(accept_len, remaining) : 0           tokens this round reports
    stopped     = active & finished & !ignore_stop & accept_len <= remaining
    out_len    += n_new
    length      = active & !stopped & out_len >= max_new
    r_tokens[c] = c < n_new ? committed_ids[c] (-1 past its width) : -1,   c < L + 1 = r_tokens width
    r_count     = n_new
    r_finish    = stopped ? FINISH_STOP : length ? FINISH_LENGTH : FINISH_NONE
    ctx_len     = active ? ctx_len : ctx_len - accept_len           (undo kv_commit's advance)
    root        = active ? bonus : root
    hidden      = active ? hid[accept_nodes[max(accept_len - 1, 0)] clamped to >= 0] : hidden
    active     &= !(stopped | length)

Inactive slots run along with budget 0 so the round keeps static shapes; this is what restores them."""

from __future__ import annotations

import torch

FINISH_NONE, FINISH_STOP, FINISH_LENGTH = 0, 1, 2


def round_update(accept_len: torch.Tensor, finished: torch.Tensor, bonus: torch.Tensor,
                 committed_ids: torch.Tensor, accept_nodes: torch.Tensor, hid: torch.Tensor,
                 active: torch.Tensor, ignore_stop: torch.Tensor, max_new: torch.Tensor, out_len: torch.Tensor,
                 ctx_len: torch.Tensor, root: torch.Tensor, hidden: torch.Tensor, r_tokens: torch.Tensor,
                 r_count: torch.Tensor, r_finish: torch.Tensor) -> None:
    """accept_len, finished, bonus [B] i32, committed_ids [B, Wc] i32, accept_nodes [B, Wa] i32 (tree_accept's
    outputs); hid [B, N, D] (the target's hidden states of the tree nodes); active, ignore_stop [B] bool;
    max_new, out_len, ctx_len, root [B] i32; hidden [B, D] (hid's dtype); r_tokens [B, T], r_count,
    r_finish [B] i32."""
    act = active.clone()
    remaining = max_new - out_len
    n_new = torch.where(act, torch.minimum(accept_len, remaining), torch.zeros_like(remaining))
    stopped = act & (finished != 0) & ~ignore_stop & (accept_len <= remaining)
    out_len += n_new
    length = act & ~stopped & (out_len >= max_new)
    width = r_tokens.shape[1]
    ids = committed_ids[:, :width]
    if ids.shape[1] < width:
        ids = torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=-1)
    col = torch.arange(width, device=r_tokens.device)[None, :]
    r_tokens.copy_(torch.where(col < n_new[:, None], ids, torch.full_like(ids, -1)))
    r_count.copy_(n_new)
    r_finish.copy_(torch.where(stopped, FINISH_STOP, torch.where(length, FINISH_LENGTH, FINISH_NONE)))
    ctx_len.copy_(torch.where(act, ctx_len, ctx_len - accept_len))
    root.copy_(torch.where(act, bonus, root))
    pick = (accept_len.long() - 1).clamp(min=0)[:, None]
    last = torch.gather(accept_nodes.long(), 1, pick)[:, 0].clamp(min=0)
    rows = torch.arange(hid.shape[0], device=hid.device)
    hidden.copy_(torch.where(act[:, None], hid[rows, last], hidden))
    active &= ~(stopped | length)
