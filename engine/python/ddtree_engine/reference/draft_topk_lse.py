"""Reference draft_topk_lse: the top-k log-softmax values of each row of draft logits, their token ids and
the row's log-sum-exp. Readable pure PyTorch (CPU or GPU); `ddtree_engine.ops.draft_topk_lse` must agree.

Order: by logit descending, equal logits by lower token id (a stable descending sort). lse is computed in
float64 and rounded once, so the kernel is compared against the exact value: lp within 2e-6 absolute
(4e-6 when V > 1e5), ids exactly. A row holding NaN or +inf gets lse = lp = NaN and id = -1."""

from __future__ import annotations

import torch

MAX_K = 1024


def draft_topk_lse(logits: torch.Tensor, k: int, check: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(top_lp [B,L,k] f32, top_id [B,L,k] i32, lse [B,L] f32) of logits [B,L,V] (bf16 or f32).

    Ranks past V (V < k) get lp = -inf and id = -1. With check=True a NaN/+inf row raises ValueError."""
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, L, V], got shape {tuple(logits.shape)}")
    if logits.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"logits must be float32 or bfloat16, got {logits.dtype}")
    if not 1 <= k <= MAX_K:
        raise ValueError(f"k must be in [1, {MAX_K}], got {k}")
    batch, positions, vocab = logits.shape
    x = logits.float()  # exact for bf16
    bad_row = (torch.isnan(x) | (x == float("inf"))).any(dim=-1)
    if check and bool(bad_row.any()):
        raise ValueError("draft_topk_lse: NaN or +inf in logits rows " + str(bad_row.nonzero().tolist()))

    lse64 = torch.logsumexp(x.double(), dim=-1)  # -inf for an all -inf row
    values, ids = torch.sort(x, dim=-1, descending=True, stable=True)
    kk = min(k, vocab)
    top_x = values[..., :kk]
    top_lp = (top_x.double() - lse64.unsqueeze(-1)).float()
    top_lp = torch.where(top_x == float("-inf"), torch.full_like(top_lp, float("-inf")), top_lp)
    top_id = ids[..., :kk].to(torch.int32)
    if kk < k:
        pad = (batch, positions, k - kk)
        top_lp = torch.cat([top_lp, torch.full(pad, float("-inf"), device=x.device)], dim=-1)
        top_id = torch.cat([top_id, torch.full(pad, -1, dtype=torch.int32, device=x.device)], dim=-1)
    lse = lse64.float()
    nan = torch.tensor(float("nan"), device=x.device)
    top_lp = torch.where(bad_row.unsqueeze(-1), nan, top_lp)
    top_id = torch.where(bad_row.unsqueeze(-1), torch.tensor(-1, dtype=torch.int32, device=x.device), top_id)
    lse = torch.where(bad_row, nan, lse)
    return top_lp.contiguous(), top_id.contiguous(), lse.contiguous()
