"""commit_update over libddtree (semantics: reference/commit_update.py): kv_commit, round_update and the
live budget in ONE kernel launch, for the split round tail (models whose commit does not fit
round_finish). Up to MAX_LAYERS layers (`fits`); the decode loop keeps the two launches otherwise."""

from __future__ import annotations

import ctypes

import torch

from ddtree_engine import _lib
from ddtree_engine.ops._common import (arrival_counters, cuda_device_of, error_flags, ptr, require, require_vectors,
                                      stream_handle)
from ddtree_engine.ops.kv_commit import kv_commit
from ddtree_engine.ops.round_finish import _Tail
from ddtree_engine.ops.round_update import round_update
from ddtree_engine.reference.commit_update import composed

MAX_LAYERS = 128  # DDTREE_COMMIT_UPDATE_MAX_LAYERS
_two_launches = composed(kv_commit, round_update)  # the fallback beyond MAX_LAYERS


def _fn() -> object:
    vp, i32 = ctypes.c_void_p, ctypes.c_int32
    return _lib.function("ddtree_commit_update",
                         [i32, vp, i32, vp, vp, vp, vp, i32, ctypes.POINTER(_Tail), vp, vp, vp])


def fits(k_caches: list[torch.Tensor]) -> bool:
    return 0 < len(k_caches) <= MAX_LAYERS


def commit_update(k_caches: list[torch.Tensor], v_caches: list[torch.Tensor], block_table: torch.Tensor,
                  accept_len: torch.Tensor, finished: torch.Tensor, bonus: torch.Tensor,
                  committed_ids: torch.Tensor, accept_nodes: torch.Tensor, hid: torch.Tensor,
                  active: torch.Tensor, ignore_stop: torch.Tensor, max_new: torch.Tensor, out_len: torch.Tensor,
                  ctx_len: torch.Tensor, root: torch.Tensor, hidden: torch.Tensor, r_tokens: torch.Tensor,
                  r_count: torch.Tensor, r_finish: torch.Tensor, live_budget: torch.Tensor | None = None) -> None:
    """Same arguments and in-place effects as reference.commit_update."""
    if not fits(k_caches):  # too many layers for one launch: the two ops, then the mask
        _two_launches(k_caches, v_caches, block_table, accept_len, finished, bonus, committed_ids, accept_nodes,
                      hid, active, ignore_stop, max_new, out_len, ctx_len, root, hidden, r_tokens, r_count,
                      r_finish, live_budget)
        return
    require(len(v_caches) in (0, len(k_caches)), "v_caches must be empty or as many as k_caches")
    shape, dtype = k_caches[0].shape, k_caches[0].dtype
    for c in list(k_caches) + list(v_caches):
        require(c.shape == shape and c.dtype == dtype and c.is_contiguous(),
                "caches must be contiguous and share shape and dtype")
    require(block_table.dim() == 2 and block_table.dtype == torch.int32 and block_table.is_contiguous(),
            "block_table must be a contiguous [B, max_pages] int32 tensor")
    batch = block_table.shape[0]
    require(hid.dim() == 3 and hid.shape[0] == batch and hid.is_contiguous(),
            f"hid must be a contiguous [{batch}, N, D] tensor")
    require(tuple(hidden.shape) == (batch, hid.shape[2]) and hidden.dtype == hid.dtype and hidden.is_contiguous(),
            "hidden must be a contiguous [B, D] tensor of hid's dtype")
    require_vectors(batch, torch.int32, accept_len=accept_len, finished=finished, bonus=bonus, max_new=max_new,
                    out_len=out_len, ctx_len=ctx_len, root=root, r_count=r_count, r_finish=r_finish,
                    live_budget=live_budget)
    require_vectors(batch, torch.bool, active=active, ignore_stop=ignore_stop)
    for name, t in (("committed_ids", committed_ids), ("accept_nodes", accept_nodes), ("r_tokens", r_tokens)):
        require(t.dim() == 2 and t.shape[0] == batch and t.shape[1] >= 1 and t.dtype == torch.int32
                and t.is_contiguous(), f"{name} must be a contiguous [{batch}, W >= 1] int32 tensor")
    device = cuda_device_of(block_table, accept_len, accept_nodes, hid, active, hidden, r_tokens, ctx_len,
                            *k_caches, *v_caches)
    if batch == 0:
        return
    layers = len(k_caches)
    k_ptrs = (ctypes.c_void_p * layers)(*[t.data_ptr() for t in k_caches])
    v_ptrs = (ctypes.c_void_p * layers)(*[t.data_ptr() for t in v_caches]) if v_caches else None
    tail = _Tail(
        ctypes.cast(k_ptrs, ctypes.c_void_p), ctypes.cast(v_ptrs, ctypes.c_void_p) if v_ptrs else None, layers,
        shape[0], shape[1], block_table.shape[1], k_caches[0][0, 0].numel() * k_caches[0].element_size(),
        block_table.data_ptr(), hid.data_ptr(), hid.shape[1], hid.shape[2] * hid.element_size(), active.data_ptr(),
        ignore_stop.data_ptr(), max_new.data_ptr(), out_len.data_ptr(), ctx_len.data_ptr(), root.data_ptr(),
        hidden.data_ptr(), r_tokens.data_ptr(), r_tokens.shape[1], r_count.data_ptr(), r_finish.data_ptr(),
        live_budget.data_ptr() if live_budget is not None else None,
    )
    counters = arrival_counters("kv_commit", device, batch)  # shared with kv_commit: same stream order
    with torch.cuda.device(device):
        status = _fn()(  # type: ignore[operator]
            batch, ptr(accept_nodes), accept_nodes.shape[1], ptr(accept_len), ptr(finished), ptr(bonus),
            ptr(committed_ids), committed_ids.shape[1], ctypes.byref(tail), ptr(counters), ptr(error_flags(device)),
            stream_handle(device),
        )
    _lib.check(status, "ddtree_commit_update")
