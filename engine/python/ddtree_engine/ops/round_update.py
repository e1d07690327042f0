"""round_update over libddtree (semantics: reference/round_update.py): the end-of-round bookkeeping of
every slot in one kernel launch, in place, capturable in a CUDA graph."""

from __future__ import annotations

import ctypes

import torch

from ddtree_engine import _lib
from ddtree_engine.ops._common import cuda_device_of, error_flags, ptr, require, stream_handle


def _fn() -> object:
    vp, i32 = ctypes.c_void_p, ctypes.c_int32
    return _lib.function(
        "ddtree_round_update",
        [i32, vp, vp, vp, vp, i32, vp, i32, vp, i32, ctypes.c_int64, vp, vp, vp, vp, vp, vp, vp, vp, i32, vp, vp,
         vp, vp],
    )


def _check(t: torch.Tensor, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    require(tuple(t.shape) == shape and t.dtype == dtype and t.is_contiguous(),
            f"{name} must be a contiguous {list(shape)} {dtype} tensor, got {tuple(t.shape)} {t.dtype}")


def round_update(accept_len: torch.Tensor, finished: torch.Tensor, bonus: torch.Tensor,
                 committed_ids: torch.Tensor, accept_nodes: torch.Tensor, hid: torch.Tensor,
                 active: torch.Tensor, ignore_stop: torch.Tensor, max_new: torch.Tensor, out_len: torch.Tensor,
                 ctx_len: torch.Tensor, root: torch.Tensor, hidden: torch.Tensor, r_tokens: torch.Tensor,
                 r_count: torch.Tensor, r_finish: torch.Tensor) -> None:
    """Same arguments and in-place effects as reference.round_update."""
    require(hid.dim() == 3, f"hid must be [B, N, D], got shape {tuple(hid.shape)}")
    batch, rows, d = hid.shape
    i32 = torch.int32
    for name, t in (("accept_len", accept_len), ("finished", finished), ("bonus", bonus), ("max_new", max_new),
                    ("out_len", out_len), ("ctx_len", ctx_len), ("root", root), ("r_count", r_count),
                    ("r_finish", r_finish)):
        _check(t, name, (batch,), i32)
    for name, t in (("active", active), ("ignore_stop", ignore_stop)):
        _check(t, name, (batch,), torch.bool)
    for name, t in (("committed_ids", committed_ids), ("accept_nodes", accept_nodes), ("r_tokens", r_tokens)):
        require(t.dim() == 2 and t.shape[0] == batch and t.shape[1] >= 1, f"{name} must be [{batch}, W >= 1]")
        _check(t, name, tuple(t.shape), i32)
    require(hid.is_contiguous(), "hid must be contiguous")
    _check(hidden, "hidden", (batch, d), hid.dtype)
    device = cuda_device_of(accept_len, finished, bonus, committed_ids, accept_nodes, hid, active, ignore_stop,
                            max_new, out_len, ctx_len, root, hidden, r_tokens, r_count, r_finish)
    if batch == 0:
        return
    with torch.cuda.device(device):
        status = _fn()(  # type: ignore[operator]
            batch, ptr(accept_len), ptr(finished), ptr(bonus), ptr(committed_ids), committed_ids.shape[1],
            ptr(accept_nodes), accept_nodes.shape[1], ptr(hid), rows, d * hid.element_size(), ptr(active),
            ptr(ignore_stop), ptr(max_new), ptr(out_len), ptr(ctx_len), ptr(root), ptr(hidden), ptr(r_tokens),
            r_tokens.shape[1], ptr(r_count), ptr(r_finish), ptr(error_flags(device)), stream_handle(device),
        )
    _lib.check(status, "ddtree_round_update")
